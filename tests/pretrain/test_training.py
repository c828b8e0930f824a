"""The training loop in this process (1 rank): non-finite steps, atomic checkpoints, learning on real text,
the Hugging Face export; and, as real jobs, preemption signals, a dying rank and refused inputs."""
import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from common import processes
from pretrain import checkpoints, config, engine, train
from pretrain.data import PretrainingLoader
from tests.pretrain.launching import REPO, RUN, TINY, command, environment, free_port, launch, losses, settings


@pytest.fixture(autouse=True)
def _info_logs(caplog):
    caplog.set_level("INFO", logger="pretrain")


def _cfg(dataset, out, steps, **more):
    overrides = [a for a in settings(dataset, out, steps=steps, **more) if a != "--set"]
    return config.load(TINY, overrides)


def _poison(monkeypatch, steps: set[int]):
    """Make the loss NaN on the given (1-based) steps, as a diverging batch would."""
    original = PretrainingLoader.next_step

    def next_step(self):
        micro = original(self)
        if self.epoch * self.batches_per_epoch + self.batch_index in steps:
            micro[0]["mlm_loss_scale"] = np.float32("nan")
        return micro

    monkeypatch.setattr(PretrainingLoader, "next_step", next_step)


# bf16's overflow check skips the step (fp32 has none): bf16 on purpose, in one micro-batch of 8 rows a step, quick
# even where the CPU emulates bf16.
BF16_SMALL = {"train.precision": "bf16", "train.global_batch_size": 8, "train.micro_batch_size": 8}


def test_non_finite_steps_are_skipped_and_counted(one_rank, sample_dataset, tmp_path, monkeypatch, caplog):
    _poison(monkeypatch, {3, 4})
    out = tmp_path / "run"
    status = train.run(_cfg(sample_dataset, out, 6, **BF16_SMALL), one_rank, resume=False)
    assert status == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped_steps"] == 2 and summary["status"] == "done"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_steps"] for r in records] == [0, 0, 2, 2]  # steps 3 and 4 log no metrics record
    assert all(np.isfinite(r["loss"]) for r in records)
    assert "step 3: non-finite loss or gradient" in caplog.text


def test_consecutive_non_finite_steps_stop_the_run_keeping_the_last_good_checkpoint(one_rank, sample_dataset,
                                                                                     tmp_path, monkeypatch, caplog):
    _poison(monkeypatch, {5, 6, 7, 8})
    out = tmp_path / "run"
    cfg = _cfg(sample_dataset, out, 10, **{**BF16_SMALL, "checkpoint.every_steps": 2,
                                           "faults.max_consecutive_skips": 3})
    assert train.run(cfg, one_rank, resume=False) == train.DIVERGED
    assert "3 consecutive steps had a non-finite loss or gradient" in caplog.text
    assert checkpoints.newest(out / "checkpoints").step == 4  # step 6 fell in the run of skips: not saved
    assert json.loads((out / "summary.json").read_text())["status"] == "diverged"


def test_without_an_overflow_check_the_first_non_finite_loss_stops_the_run(one_rank, sample_dataset, tmp_path,
                                                                          monkeypatch, caplog):
    """fp32 without ZeRO: DeepSpeed applies whatever the gradients are, so the run cannot go on."""
    _poison(monkeypatch, {2})
    cfg = _cfg(sample_dataset, tmp_path / "run", 4, **{"train.precision": "fp32", "zero.stage": 0})
    assert train.run(cfg, one_rank, resume=False) == train.DIVERGED
    assert "step 2: the loss is not finite and fp32 has no overflow check" in caplog.text


def test_a_save_that_dies_midway_leaves_the_previous_checkpoint_as_the_one_resumed(one_rank, sample_dataset,
                                                                                    tmp_path, monkeypatch, caplog):
    out = tmp_path / "run"
    cfg = _cfg(sample_dataset, out, 6, **{"checkpoint.every_steps": 2, "checkpoint.keep_last": 5})
    real_save = engine.save

    def dying_save(eng, directory, tag, client_state):
        real_save(eng, directory, tag, client_state)  # every file written...
        if tag == checkpoints.tag_for(4):
            raise KeyboardInterrupt("killed during the save")  # ...but the job dies before the marker

    monkeypatch.setattr(engine, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        train.run(cfg, one_rank, resume=False)
    assert (out / "checkpoints" / "step_00000004").is_dir()
    assert [c.step for c in checkpoints.complete(out / "checkpoints")] == [2]
    monkeypatch.setattr(engine, "save", real_save)
    assert train.run(cfg, one_rank, resume=True) == 0
    assert "at step 2 (64 samples consumed)" in caplog.text
    assert [c.step for c in checkpoints.complete(out / "checkpoints")] == [2, 4, 6]


def test_a_run_extended_on_resume_takes_its_first_step_at_the_new_schedules_rate(one_rank, sample_dataset, tmp_path):
    """The checkpoint's 2-step schedule had decayed to 0; the run resumed with 4 steps continues on its own."""
    from pretrain.schedule import lr_at

    out = tmp_path / "run"
    assert train.run(_cfg(sample_dataset, out, 2), one_rank, resume=False) == 0
    longer = _cfg(sample_dataset, out, 4)
    assert train.run(longer, one_rank, resume=True) == 0
    rates = {r["step"]: r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    for step in (3, 4):  # a record's lr is the rate its step used: lr_at(step - 1)
        assert rates[step] == pytest.approx(lr_at(step - 1, longer.optimizer.lr, longer.schedule)) and rates[step] > 0


def test_tiny_model_learns_on_the_real_wikipedia_slice_and_exports_for_transformers(one_rank, real_dataset, tmp_path):
    import transformers

    from models.bert.hf import load_pretrained

    out = tmp_path / "run"
    cfg = _cfg(real_dataset, out, 50, **{"optimizer.lr": 2e-3, "schedule.warmup_steps": 5,
                                         "logging.log_every": 10, "checkpoint.export_hf": "true",
                                         "logging.tensorboard": "true"})
    assert train.run(cfg, one_rank, resume=False) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = records[0]["mlm_loss"], records[-1]["mlm_loss"]
    # From about ln(30522) = 10.3 (uniform) to the unigram level and below in 50 steps of a 4M-parameter model.
    assert first > 9.5 and last < first - 2.0 and last < 8.0, (first, last)
    assert records[-1]["mlm_accuracy"] > 0.03 > records[0]["mlm_accuracy"] / 2
    assert list((out / "monitor").rglob("events.out.tfevents*")), "DeepSpeed's TensorBoard monitor wrote nothing"
    # The export loads in transformers as BertForPreTraining and AutoModel, with the same outputs as ours.
    ours, _ = load_pretrained(out / "hf")
    ours.eval()
    theirs = transformers.BertForPreTraining.from_pretrained(out / "hf").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out / "hf")
    batch = tokenizer(["The river flows into the sea.", "A second, longer sentence about history."],
                      padding=True, return_tensors="pt")
    with torch.no_grad():
        mlm, nsp = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        reference = theirs(**batch)
        encoder = transformers.AutoModel.from_pretrained(out / "hf").eval()(**batch).last_hidden_state
        hidden, _ = ours.bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    assert torch.allclose(mlm, reference.prediction_logits, atol=1e-4)
    assert torch.allclose(nsp, reference.seq_relationship_logits, atol=1e-5)
    assert torch.allclose(hidden, encoder, atol=1e-5)


def _wait_for_step(out, step, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (out / "metrics.jsonl").is_file() and any(json.loads(l)["step"] >= step for l in
                                                     (out / "metrics.jsonl").read_text().splitlines()):
            return
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.2)
    raise AssertionError("the run did not get going")


def _workers(proc):
    from tests.live_processes import descendants

    return descendants(proc.pid, "run.py")


def test_a_signal_to_one_rank_makes_all_save_together_and_exit_for_requeue(sample_dataset, tmp_path):
    out = tmp_path / "run"
    args = settings(sample_dataset, out, steps=100000, **{"checkpoint.every_steps": 0})
    with processes.started(command("torchrun", 2, args, free_port()), cwd=REPO, env=environment(), text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        _wait_for_step(out, 2, proc)
        _workers(proc)[-1].send_signal(signal.SIGUSR1)  # only one rank hears it
        output = proc.communicate(timeout=120)[0]
    assert "received SIGUSR1: saving at step" in output or "received a signal on another rank" in output
    assert "exitcode: 75" in output or proc.returncode == 75, output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "preempted"
    saved = checkpoints.newest(out / "checkpoints")
    assert saved is not None and saved.step == summary["step"] == max(losses(out))
    # The requeued job continues from there without being told where.
    result = launch("torchrun", 2, ["--resume", *settings(sample_dataset, out, steps=saved.step + 2)])
    assert result.returncode == 0 and f"at step {saved.step}" in result.stdout


@pytest.mark.exclusive  # it bounds the job's end by the wall clock
def test_a_rank_that_dies_fails_the_job_fast_instead_of_hanging(sample_dataset, tmp_path):
    out = tmp_path / "run"
    with processes.started(command("torchrun", 2, settings(sample_dataset, out, steps=100000), free_port()),
                           cwd=REPO, env=environment(), text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT) as proc:
        _wait_for_step(out, 2, proc)
        _workers(proc)[-1].kill()
        started = time.time()
        output = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0 and time.time() - started < 60, output[-3000:]


def test_a_dataset_that_does_not_fit_the_model_is_refused(sample_dataset, tmp_path):
    result = launch("python", 1, settings(sample_dataset, tmp_path / "run", steps=2, **{"model.vocab_size": 1000}))
    assert result.returncode == 2
    assert "vocabulary has 30522 ids but the model's embedding has 1000" in result.stdout
    assert "Traceback" not in result.stdout


def test_dry_run_prints_the_deepspeed_config_the_batch_arithmetic_and_the_memory_estimate():
    result = processes.run([sys.executable, RUN, "--config",
                            str(REPO / "configs/pretrain/bert_large_phase1_seq128.yaml"), "--dry-run", "--world-size",
                            "64"], cwd=REPO, text=True, capture_output=True, env=environment(), timeout=120)
    assert result.returncode == 0, result.stderr
    ds_config = json.loads(result.stdout[:result.stdout.index("\n}\n") + 2])
    assert ds_config["train_batch_size"] == 65536 and ds_config["train_micro_batch_size_per_gpu"] == 64
    assert ds_config["gradient_accumulation_steps"] == 16 and ds_config["fp16"]["enabled"]
    assert "global batch 65536 = micro-batch 64 x 64 ranks x 16 accumulation steps" in result.stdout
    # BERT-Large (bert-base-uncased's vocabulary rounded to 30,528) with fp16 LAMB at ZeRO 0: 16 bytes a parameter.
    assert "Model states per GPU: 336,232,258 parameters, ZeRO 0, fp16, lamb, 64 data-parallel ranks" in result.stdout
    total = next(line for line in result.stdout.splitlines() if line.split()[:1] == ["total"])
    assert float(total.split()[1]) == round(16 * 336_232_258 / 2 ** 30, 2)


def test_lamb_with_activation_checkpointing_trains(one_rank, sample_dataset, tmp_path):
    """The phase configs' optimizer (LAMB, ZeRO 0) and activation checkpointing, in fp32 on CPU."""
    out = tmp_path / "run"
    cfg = _cfg(sample_dataset, out, 8, **{"optimizer.name": "lamb", "optimizer.lr": 2e-2, "zero.stage": 0,
                                          "train.precision": "fp32", "model.activation_checkpointing": "true"})
    assert train.run(cfg, one_rank, resume=False) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 for r in records)
    assert records[-1]["loss"] < records[0]["loss"] - 0.3


def test_continues_pretraining_from_a_hugging_face_checkpoint(one_rank, sample_dataset, minilm_dir, tmp_path, caplog):
    """The real MiniLM checkpoint (an encoder without pretraining heads) as the starting point."""
    from models.bert.hf import load_pretrained

    out = tmp_path / "run"
    cfg = _cfg(sample_dataset, out, 2, **{"model.init_from": str(minilm_dir), "checkpoint.export_hf": "true",
                                          "optimizer.lr": 1e-9, "schedule.warmup_steps": 0})
    assert train.run(cfg, one_rank, resume=False) == 0
    assert "initialised fresh (not in" in caplog.text and "cls.seq_relationship.weight" in caplog.text
    start, _ = load_pretrained(minilm_dir)
    end, _ = load_pretrained(out / "hf")
    assert end.config.hidden_size == 384 and end.config.num_hidden_layers == 6
    layer = "bert.encoder.layer.5.output.dense.weight"
    assert torch.allclose(start.state_dict()[layer], end.state_dict()[layer], atol=1e-5)  # lr ~ 0: unchanged


def test_a_checkpoint_with_another_vocabulary_is_refused(one_rank, sample_dataset, minilm_dir, tmp_path):
    import shutil

    other = tmp_path / "other-vocab"
    shutil.copytree(minilm_dir, other)
    tokens = (other / "vocab.txt").read_text(encoding="utf-8").splitlines()
    tokens[2000], tokens[2001] = tokens[2001], tokens[2000]  # same size and special ids, different ids
    (other / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    cfg = _cfg(sample_dataset, tmp_path / "run", 2, **{"model.init_from": str(other)})
    with pytest.raises(ValueError, match="is not the vocabulary the dataset .* was made with"):
        train.run(cfg, one_rank, resume=False)


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_a_checkpoint_exports_offline_to_the_same_weights_as_the_run(stage, one_rank, sample_dataset, tmp_path):
    """`python -m pretrain.export` rebuilds the fp32 weights from the checkpoint files alone."""
    from safetensors.torch import load_file

    from pretrain.export import main as export_main

    out = tmp_path / "run"
    cfg = _cfg(sample_dataset, out, 3, **{"zero.stage": stage, "train.precision": "fp32" if stage == 0 else "bf16",
                                          "checkpoint.export_hf": "true"})
    assert train.run(cfg, one_rank, resume=False) == 0
    assert export_main([str(out), str(tmp_path / "offline")]) == 0
    online, offline = load_file(out / "hf" / "model.safetensors"), load_file(tmp_path / "offline" / "model.safetensors")
    assert sorted(online) == sorted(offline)
    assert all(torch.equal(online[k], offline[k]) for k in online)
    assert (tmp_path / "offline" / "vocab.txt").is_file()
    assert export_main([str(tmp_path / "nothing-here"), str(tmp_path / "x")]) == 2

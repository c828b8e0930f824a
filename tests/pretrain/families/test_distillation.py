"""Distillation (pretrain.families.distillation): the shipped DistilBERT config trains, the student starts from every
other teacher layer, the teacher is never trained nor checkpointed, the loss is DistilBERT's, a run resumes bit for
bit on 2 ranks, a teacher of another vocabulary is refused, and MFU counts the teacher's forward."""
import json
import math
import pathlib
import shutil

import pytest
import torch
import torch.nn.functional as F

from common.errors import CheckpointError
from models.bert.hf import export, load_pretrained
from models.bert.model import BertConfig, BertForPreTraining, flops_per_token
from pretrain import config, train
from pretrain.families import for_config
from pretrain.families.distillation import DistillationFamily, student_layer_map
from pretrain.families.distillation_loss import STAT_NAMES
from pretrain.memory import estimate, estimate_for_run
from tests.pretrain.launching import launch, losses, settings

SHIPPED = pathlib.Path(__file__).resolve().parents[3] / "configs" / "pretrain" / "distilbert_base.yaml"
TEACHER = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
                     intermediate_size=128, max_position_embeddings=128)
TINY_RUN = {"model.max_position_embeddings": 128, "distillation.student_layers": 2, "train.max_steps": 2,
            "schedule.total_steps": 2, "schedule.warmup_steps": 1, "train.global_batch_size": 16,
            "train.micro_batch_size": 8, "data.window_batches": 1, "optimizer.torch_adam": "true",
            "checkpoint.every_steps": 0, "checkpoint.export_hf": "true", "logging.log_every": 1,
            "logging.tensorboard": "false", "logging.progress": "false"}


@pytest.fixture(scope="module")
def dataset(synthetic_dataset):
    """DistilBERT's rows: packed, stored unmasked, no pairs (bert-base-uncased's vocabulary)."""
    return synthetic_dataset(1_000, kind="full_sentences", masking="dynamic", document_tokens=60)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, dataset) -> pathlib.Path:
    """A 4-layer BERT with its MLM head and the dataset's vocabulary, as a Hugging Face directory."""
    torch.manual_seed(7)
    directory = tmp_path_factory.mktemp("teacher") / "hf"
    export(BertForPreTraining(TEACHER), directory, tokenizer_dir=dataset / "tokenizer")
    return directory


def shipped(dataset, teacher, out, **more):
    overrides = {**TINY_RUN, "data.path": dataset, "output_dir": out, "distillation.teacher": teacher, **more}
    return config.load(SHIPPED, [f"{key}={value}" for key, value in overrides.items()])


def test_shipped_config_is_distilbert_and_trains_a_few_steps(one_rank, dataset, teacher, tmp_path):
    recipe = config.load(SHIPPED)
    d = recipe.distillation
    assert (d.temperature, d.kl_weight, d.mlm_weight, d.cosine_weight, d.student_layers) == (2.0, 5.0, 2.0, 1.0, 6)
    assert recipe.objective.masking == "dynamic" and recipe.objective.sentence_objective == "none"
    assert recipe.optimizer.lr == 5e-4 and recipe.train.global_batch_size == 4096
    cfg = shipped(dataset, teacher, tmp_path / "run")
    assert isinstance(for_config(cfg), DistillationFamily)
    assert train.run(cfg, one_rank, resume=False) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert all(math.isfinite(r[k]) for k in ("loss", "mlm_loss", "kl_loss", "cosine_loss", "teacher_agreement"))
        assert r["loss"] == pytest.approx(5 * r["kl_loss"] + 2 * r["mlm_loss"] + r["cosine_loss"], rel=1e-6)
        assert "nsp_loss" not in r
    student, _ = load_pretrained(tmp_path / "run" / "hf")  # the export is a plain 2-layer BERT of the teacher's width
    assert student.config.num_hidden_layers == 2 and student.config.hidden_size == TEACHER.hidden_size
    recorded = json.loads((tmp_path / "run" / "teacher.json").read_text())
    assert recorded["teacher"] == str(teacher) and len(recorded["sha256"]) == 64
    # The memory plan's trainable parameters are the student's, built on the meta device.
    assert estimate_for_run(cfg, 1).parameters == sum(p.numel() for p in student.parameters())


def test_the_memory_plan_holds_the_whole_teacher_on_every_rank(dataset, teacher, tmp_path):
    """The teacher is outside DeepSpeed: 2 bytes per parameter (bf16) on each GPU, not divided by ZeRO 3's ranks,
    a line of its own in the total but not in the paper's figure."""
    cfg = shipped(dataset, teacher, tmp_path / "run", **{"zero.stage": 3, "train.precision": "bf16"})
    real = sum(p.numel() for p in for_config(cfg).teacher().parameters())
    found = estimate_for_run(cfg, 8)
    row = found.row("teacher weights (bfloat16)")
    assert (row.device_bytes, row.host_bytes) == (2 * real, 0)
    student_only = estimate(found.parameters, world_size=8, zero_stage=3, precision="bf16",
                            optimizer=cfg.optimizer.name, offload_optimizer=cfg.zero.offload_optimizer != "none",
                            offload_param=cfg.zero.offload_param != "none")
    assert found.device_bytes == student_only.device_bytes + 2 * real
    assert found.paper_bytes == student_only.paper_bytes
    assert "teacher weights (bfloat16)" in found.table() and "and the teacher weights (bfloat16):" in found.table()
    fp32 = estimate_for_run(shipped(dataset, teacher, tmp_path / "run", **{"distillation.teacher_precision": "fp32"}),
                            8)
    assert fp32.row("teacher weights (float32)").device_bytes == 4 * real


def test_a_checkpoint_exports_after_the_teacher_has_moved(one_rank, dataset, teacher, tmp_path):
    """The run records its teacher's config in teacher.json when it starts; `python -m pretrain.export` derives the
    student from that copy, so with the teacher gone it writes the files of the run's own end-of-run export."""
    from pretrain.export import export_checkpoint, main

    moved, run = tmp_path / "teacher", tmp_path / "run"
    shutil.copytree(teacher, moved)
    assert train.run(shipped(dataset, moved, run, **{"checkpoint.every_steps": 2}), one_rank, resume=False) == 0
    recorded = json.loads((run / "teacher.json").read_text())
    assert recorded["config"] == json.loads((moved / "config.json").read_text())
    shutil.rmtree(moved)
    assert main([str(run), str(tmp_path / "exported")]) == 0

    def files(directory: pathlib.Path) -> dict:
        return {path.relative_to(directory): path.read_bytes() for path in directory.rglob("*") if path.is_file()}

    assert files(tmp_path / "exported") == files(run / "hf") and (run / "hf" / "model.safetensors").is_file()
    # A record from before records held the config, and no teacher: refused in one line naming both.
    (run / "teacher.json").write_text(json.dumps({k: v for k, v in recorded.items() if k != "config"}))
    with pytest.raises(CheckpointError) as refused:
        export_checkpoint(run, tmp_path / "again")
    message = str(refused.value)
    assert "\n" not in message and str(moved) in message and str(run / "teacher.json") in message


def test_the_student_starts_from_every_other_teacher_layer(dataset, teacher, tmp_path):
    family = for_config(shipped(dataset, teacher, tmp_path / "run"))
    student = family.new_model(vocab_size=30528, pad_token_id=0)
    assert student_layer_map(12, 6) == [0, 2, 4, 6, 8, 10] and family.layers == [0, 2]
    theirs, ours = family.teacher().state_dict(), student.state_dict()
    renamed = {f"bert.encoder.layer.{s}.": f"bert.encoder.layer.{t}." for s, t in enumerate(family.layers)}
    for key, value in ours.items():
        prefix = next((p for p in renamed if key.startswith(p)), None)
        source = renamed[prefix] + key[len(prefix):] if prefix else key
        assert torch.equal(value, theirs[source]), key
    assert student.config.num_hidden_layers == 2 and student.config.vocab_size == TEACHER.vocab_size


def test_the_loss_is_distilberts_and_the_teacher_gets_no_gradient(dataset, teacher, tmp_path):
    family = for_config(shipped(dataset, teacher, tmp_path / "run", **{"distillation.teacher_precision": "fp32"}))
    torch.manual_seed(0)
    student = family.new_model(vocab_size=0, pad_token_id=0)
    for p in student.parameters():  # the student must differ from its teacher for the terms to be non-trivial
        p.data.add_(0.05 * torch.randn_like(p))
    objective = family.loss_module(student)
    teacher_model = objective.teacher
    assert not {id(p) for p in teacher_model.parameters()} & {id(p) for p in objective.parameters()}
    assert all(not k.startswith("teacher") for k in objective.state_dict())
    objective.eval()  # no dropout: the hand computation below sees the same activations
    ids = torch.randint(1000, 2000, (2, 12))
    attention = torch.ones(2, 12, dtype=torch.long)
    attention[1, 9:] = 0
    masked = torch.tensor([1, 4, 13, 15, 20])
    labels = torch.randint(1000, 2000, (5,))
    batch = dict(input_ids=ids, token_type_ids=torch.zeros_like(ids), attention_mask=attention, masked_positions=masked,
                 masked_labels=labels, next_sentence_labels=torch.zeros(2, dtype=torch.long),
                 mlm_loss_scale=torch.tensor(1 / 5), token_loss_scale=torch.tensor(1 / 21))
    loss, stats = objective(**batch)
    loss.backward()
    assert all(p.grad is None for p in teacher_model.parameters()) and student.bert.embeddings.word_embeddings.weight.grad is not None

    def hidden_and_logits(model):
        hidden, _ = model.bert(ids, torch.zeros_like(ids), attention)
        return hidden.reshape(-1, hidden.shape[-1]), model(ids, torch.zeros_like(ids), attention, masked)[0]

    with torch.no_grad():
        (hs, ls), (ht, lt) = hidden_and_logits(student), hidden_and_logits(teacher_model)
        p_teacher = torch.softmax(lt / 2, -1)
        kl = (p_teacher * (p_teacher.log() - torch.log_softmax(ls / 2, -1))).sum(-1).mean() * 4
        mlm = F.cross_entropy(ls, labels)
        real = attention.reshape(-1).bool()
        cos = (1 - (hs[real] * ht[real]).sum(-1) / (hs[real].norm(dim=-1) * ht[real].norm(dim=-1))).mean()
    assert loss.item() == pytest.approx(float(5 * kl + 2 * mlm + cos), rel=1e-5)
    s = dict(zip(STAT_NAMES, stats.tolist()))
    assert s["kl_loss_sum"] / 5 == pytest.approx(float(kl), rel=1e-5)
    assert s["cosine_loss_sum"] / 21 == pytest.approx(float(cos), rel=1e-5)
    assert s["agreement"] == float((ls.argmax(-1) == lt.argmax(-1)).sum()) and s["tokens"] == 21
    summary = family.summary(stats)
    assert summary["loss"] == pytest.approx(loss.item(), rel=1e-5) and summary["teacher_agreement"] <= 1


def test_mfu_counts_the_teachers_forward(dataset, teacher, tmp_path):
    family = for_config(shipped(dataset, teacher, tmp_path / "run"))
    student = family.new_model(vocab_size=0, pad_token_id=0)
    want = flops_per_token(student.config, 128, 0.15) + flops_per_token(TEACHER, 128, 0.15) / 3
    assert family.flops_per_token(student, 128, 0.15) == pytest.approx(want)


def test_a_teacher_of_another_vocabulary_or_without_an_mlm_head_is_refused(dataset, teacher, tmp_path, minilm_dir):
    other = tmp_path / "other"
    shutil.copytree(teacher, other)
    shutil.rmtree(other / "tokenizer")
    (other / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n")
    with pytest.raises(CheckpointError) as refused:
        for_config(shipped(dataset, other, tmp_path / "run")).new_model(vocab_size=0, pad_token_id=0)
    message = str(refused.value)
    assert "\n" not in message and str(other / "vocab.txt") in message and "preprocess with the teacher's" in message
    # MiniLM (the dataset's vocabulary) is an encoder-only checkpoint: no MLM head, so no soft targets to distil.
    with pytest.raises(CheckpointError, match="no masked-LM head.*kl_weight=0"):
        for_config(shipped(dataset, minilm_dir, tmp_path / "run")).new_model(vocab_size=0, pad_token_id=0)
    family = for_config(shipped(dataset, minilm_dir, tmp_path / "run", **{"distillation.kl_weight": 0}))
    assert family.new_model(vocab_size=0, pad_token_id=0).config.num_hidden_layers == 2


def test_distillation_resumes_bitwise_on_two_ranks(sample_dataset, teacher, tmp_path):
    """NSP rows (the student's pair head trains too), dropout on, bf16 (micro-batches of 4 rows: quick where bf16 is
    emulated), ZeRO 1: the ranks' RNG states and the teacher (not in the checkpoint, loaded again) must give the
    uninterrupted run's losses bit for bit. Three 2-rank launches (full, resumed, refused), the only way to test a
    resume across processes."""
    common = {"distillation.teacher": teacher, "distillation.student_layers": 2, "zero.stage": 1,
              "train.precision": "bf16", "distillation.teacher_precision": "bf16", "train.global_batch_size": 8,
              "train.micro_batch_size": 4, "checkpoint.every_steps": 2, "checkpoint.keep_last": 5}
    full, part = tmp_path / "full", tmp_path / "part"
    result = launch("torchrun", 2, settings(sample_dataset, full, steps=4, **common))
    assert result.returncode == 0, result.stdout[-4000:]
    assert "2-layer student from teacher layers 0, 2" in result.stdout
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / "step_00000002", part / "checkpoints" / "step_00000002")
    shutil.copy(full / "teacher.json", part / "teacher.json")
    result = launch("torchrun", 2, ["--resume", *settings(sample_dataset, part, steps=4, **common)])
    assert result.returncode == 0, result.stdout[-4000:]
    assert "at step 2 (16 samples consumed) on 2 ranks" in result.stdout
    want, got = losses(full), losses(part)
    assert sorted(got) == [3, 4] and all(got[step] == want[step] for step in got), (got, want)
    records = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    assert all("nsp_loss" in r and "kl_loss" in r for r in records)
    # The checkpoint holds the student only: a teacher of other weights at the same path is refused.
    torch.manual_seed(8)
    export(BertForPreTraining(TEACHER), teacher.parent / "changed", tokenizer_dir=sample_dataset / "tokenizer")
    shutil.rmtree(teacher.parent / "changed" / "tokenizer")  # the same vocabulary, as vocab.txt only
    shutil.copytree(teacher, tmp_path / "kept")
    shutil.copy(teacher.parent / "changed" / "model.safetensors", teacher / "model.safetensors")
    try:
        result = launch("torchrun", 2, ["--resume", *settings(sample_dataset, part, steps=4, **common)])
    finally:
        shutil.copy(tmp_path / "kept" / "model.safetensors", teacher / "model.safetensors")
    assert result.returncode != 0 and "this run's checkpoints were distilled from" in result.stdout

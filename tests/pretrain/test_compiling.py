"""``model.compile`` (``pretrain.compiling``): the compiled module trains the eager one's losses, keeps its
checkpoint names (a compiled run resumes from an eager checkpoint and the other way round), and compiles a bounded
number of graphs over micro-batches of many widths and masked counts.

Tolerance: fp32 on CPU, dropout off (inductor draws its own dropout masks), losses to 1e-4 relative (gradients summed
over three micro-batches to 1e-3 of their largest entry): the compiled kernels sum in another order (fused
reductions), so the steps agree to rounding, not to the bit.
Compiling takes most of these tests' time (tens of seconds per module on two cores); it is what they test.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import torch

from models.bert.model import BertConfig, BertForPreTraining
from pretrain import compiling, config, families
from pretrain.data import RowBlock, pad
from pretrain.families.bert_loss import PretrainingLoss
from tests.pretrain.launching import TINY

TOLERANCE = 1e-4
SEQ = 64
VOCAB = 30528  # the teacher's (bert-base-uncased, rounded up to 8): distillation's student shares it
NO_DROPOUT = {"model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0, "train.precision": "fp32"}
RUN = {**NO_DROPOUT, "model.activation_checkpointing": "true"}


def _objective(vocab_size: int, layers: int = 2) -> PretrainingLoss:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    return PretrainingLoss(BertForPreTraining(config), "nsp").train()


def _dropout_off(model: torch.nn.Module) -> None:
    """Dropout off whatever the family's config took (a distillation student copies its teacher's)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "dropout_p"):
            module.dropout_p = 0.0


def _micro_batches(count: int, vocab_size: int) -> list[dict]:
    """Micro-batches of two rows of random lengths (8 to ``SEQ`` tokens, 15% masked), padded by the loader's ``pad``:
    many widths and masked counts."""
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(count):
        lengths = rng.integers(8, SEQ + 1, size=2)
        counts = np.maximum(1, (lengths * 0.15).astype(np.int64))
        positions = np.concatenate([np.sort(rng.choice(np.arange(1, n - 1), c, replace=False))
                                    for n, c in zip(lengths, counts)])
        block = RowBlock(tokens=rng.integers(5, vocab_size - 8, size=lengths.sum()), lengths=lengths,
                         positions=positions, counts=counts, labels=rng.integers(5, vocab_size - 8, size=counts.sum()),
                         segment_a_len=lengths // 2, next_sentence_label=rng.integers(0, 2, size=2))
        padded = {**pad(block, pad_id=0), "mlm_loss_scale": np.float32(1 / counts.sum())}
        batches.append({k: torch.from_numpy(np.asarray(v)) for k, v in padded.items()})
    return batches


def test_compiling_keeps_the_module_and_its_state_dict_names():
    eager, compiled = _objective(64), _objective(64)
    assert compiling.compile_module(compiled) is compiled and compiling.any_compiled(compiled)
    assert not compiling.any_compiled(eager)
    assert list(compiled.state_dict()) == list(eager.state_dict())  # no "_orig_mod." prefix
    compiled.load_state_dict(eager.state_dict())  # an eager checkpoint loads as it is


def test_the_regions_are_each_layer_the_embeddings_and_the_heads():
    objective = _objective(64, layers=3)
    names = {id(module): name for name, module in objective.named_modules()}
    assert [names[id(region)] for region in compiling.regions(objective)] == [
        "model.bert.embeddings", "model.bert.encoder.layer.0", "model.bert.encoder.layer.1",
        "model.bert.encoder.layer.2", "model.bert.pooler", "model.cls.predictions", "model.cls.seq_relationship"]
    compiling.compile_module(objective)
    assert {name for name, module in objective.named_modules() if compiling.is_compiled(module)} == {
        names[id(region)] for region in compiling.regions(objective)}
    assert "7 regions (BertEmbeddings, BertLMPredictionHead, BertLayer, BertPooler, Linear)" in compiling.describe(
        objective)  # the pre-training heads have no forward of their own: their two heads are called one by one


def test_a_module_held_in_a_plain_attribute_is_compiled_by_region_too():
    """A distillation teacher is kept out of DeepSpeed's reach in a plain attribute; its layers are regions too."""
    holder = torch.nn.Module()
    holder.student = _objective(64, layers=1)
    object.__setattr__(holder, "teacher", _objective(64, layers=2))
    regions = compiling.regions(holder)
    assert holder.teacher.model.bert.encoder.layer[1] in regions and holder.student.model.cls.predictions in regions


def test_one_layers_graph_serves_every_layer():
    """Regional compilation: four layers compile the graphs one layer does (BERT-Large: one layer's, not 24).
    Evaluation graphs (no backward to compile) show it at a fraction of the cost."""
    batch = _micro_batches(1, 96)[0]
    counts = []
    for layers in (1, 4):
        objective = compiling.compile_module(_objective(96, layers=layers)).eval()
        torch._dynamo.reset()
        before = compiling.graphs_compiled()
        with torch.no_grad():
            objective(**batch)
        counts.append(compiling.graphs_compiled() - before)
    assert counts[0] == counts[1] > 0, counts


def test_many_widths_compile_a_bounded_number_of_graphs_and_give_the_eager_losses():
    vocab = 96
    batches = _micro_batches(16, vocab)
    shapes = {(b["input_ids"].shape[1], len(b["masked_positions"])) for b in batches}
    assert len({width for width, _ in shapes}) >= 5 and len(shapes) >= 10  # what would recompile with static shapes
    eager, compiled = _objective(vocab), compiling.compile_module(_objective(vocab))
    kinds = {type(region) for region in compiling.regions(compiled)}
    torch._dynamo.reset()
    before = compiling.graphs_compiled()
    for batch in batches:
        expected, expected_stats = eager(**batch)
        loss, stats = compiled(**batch)
        loss.backward()
        torch.testing.assert_close(loss, expected, rtol=TOLERANCE, atol=0)
        torch.testing.assert_close(stats, expected_stats, rtol=TOLERANCE, atol=TOLERANCE)
    # one graph per kind of region for every shape (two where a size of 1 specialises), whatever the widths
    assert len(kinds) <= compiling.graphs_compiled() - before <= 2 * len(kinds)
    torch.testing.assert_close(  # the gradients flow through the compiled backward
        compiled.model.cls.seq_relationship.weight.grad.abs().sum() > 0, torch.tensor(True))


def test_a_region_past_the_recompile_limit_is_reported_as_running_eagerly():
    """TorchDynamo gives up on a function after ``recompile_limit`` graphs and runs it eagerly, saying so only in its
    own log; the watch turns that into our line (static shapes, so every width recompiles)."""
    reports = []
    region = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=2, automatic_dynamic_shapes=False):
        with compiling.RecompileLimitWatch(reports.append) as watch:
            for width in (3, 4, 5, 6):
                torch.testing.assert_close(region(torch.ones(width)), torch.full((width,), 3.0))
    assert watch.limits_hit == 1 and len(reports) == 1
    assert "recompile_limit (2)" in reports[0] and "runs eagerly from here on" in reports[0], reports


FAMILIES = {  # each family's tiny model, dropout off (inductor draws its own masks); BERT's own objective compiles in
    # the tests around this one (with activation checkpointing in the run)
    "albert": {"model.family": "albert", "model.preset": "albert_tiny"},
    "electra": {"model.family": "electra", "model.preset": "electra_tiny", "objective.sentence_objective": "none"},
    "distillation": {"distillation.teacher": "MINILM", "distillation.student_layers": 1,  # MiniLM has no MLM head:
                     "distillation.kl_weight": 0.0, "distillation.teacher_precision": "fp32"},  # hidden-state loss
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_familys_objective_compiles_to_its_eager_losses(name, minilm_dir, tmp_path):
    """What ``pretrain.train`` compiles is ``family.loss_module(model)``: for each family the compiled objective gives
    the eager one's loss and statistics over micro-batches of several widths, with the family's own inputs
    (ELECTRA's sampling seed: its sampling from a ``torch.Generator`` runs eagerly between two graphs)."""
    overrides = {**FAMILIES[name], "model.hidden_dropout_prob": 0.0,
                 "model.attention_probs_dropout_prob": 0.0, "data.path": tmp_path, "output_dir": tmp_path}
    overrides = {k: str(minilm_dir) if v == "MINILM" else v for k, v in overrides.items()}
    cfg = config.load(TINY, [f"{k}={v}" for k, v in overrides.items()])
    family = families.for_config(cfg)
    made = []
    for _ in range(2):
        torch.manual_seed(0)
        model = family.new_model(vocab_size=VOCAB, pad_token_id=0)
        _dropout_off(model)
        family.set_activation_checkpointing(model, cfg.model.activation_checkpointing)
        made.append(family.loss_module(model).train())
    torch._dynamo.reset()  # as in a new process: the graphs of the other families' tests are forgotten
    eager, compiled = made[0], compiling.compile_module(made[1])
    reports = []
    with compiling.RecompileLimitWatch(reports.append) as watch:
        for step, batch in enumerate(_micro_batches(3, VOCAB)):
            inputs = {**batch, "token_loss_scale": batch["mlm_loss_scale"] / 8,
                      **family.micro_batch_inputs(step=step, micro=0, rank=0)}
            expected, expected_stats = eager(**inputs)
            loss, stats = compiled(**inputs)
            (expected + loss).backward()  # separate graphs: each objective gets its own gradients
            torch.testing.assert_close(loss, expected, rtol=TOLERANCE, atol=0)
            torch.testing.assert_close(stats, expected_stats, rtol=TOLERANCE, atol=TOLERANCE)
        with torch.no_grad():  # evaluation compiles its own graphs, within the limit too
            compiled.eval()(**inputs)
    assert watch.limits_hit == 0, reports  # no region fell back to eager
    grads = {n: p.grad for n, p in compiled.named_parameters() if p.grad is not None}
    assert grads and grads.keys() == {n for n, p in eager.named_parameters() if p.grad is not None}
    for n, p in eager.named_parameters():
        # The key biases' gradients are zero but for rounding: softmax ignores a constant added to a row's scores.
        if p.grad is not None and not n.endswith("self.key.bias"):
            atol = 1e-3 * max(p.grad.abs().max().item(), 1e-6)  # three steps' rounding, relative to the largest
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-3, atol=atol, msg=n)


def _losses(out) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_compiled_run_has_the_eager_losses_and_resumes_from_an_eager_checkpoint(one_rank, sample_dataset,
                                                                                  tmp_path, caplog):
    """``model.compile`` through ``pretrain.train`` (DeepSpeed ZeRO 1, fp32, dropout off, activation checkpointing:
    recomputed in the compiled backward): the eager run's losses; a compiled run resumed from the eager run's step-2
    checkpoint continues its curve, and an eager run resumed from the compiled run's checkpoint too (the checkpoint
    names are the same)."""
    from pretrain import train
    from tests.pretrain.test_training import _cfg

    caplog.set_level("INFO", logger="pretrain")
    runs = {}
    for switch in ("false", "true"):
        out = tmp_path / f"run-{switch}"
        cfg = _cfg(sample_dataset, out, 4, **RUN, **{"model.compile": switch, "checkpoint.every_steps": 2})
        assert train.run(cfg, one_rank, resume=False) == 0
        runs[switch] = _losses(out)
    assert len(runs["false"]) == 4
    np.testing.assert_allclose(runs["true"], runs["false"], rtol=TOLERANCE)
    compiled = json.loads((tmp_path / "run-true" / "summary.json").read_text())["compile"]
    assert compiled["graphs"] > 0 and compiled["recompile_limits_hit"] == 0
    assert "compile" not in json.loads((tmp_path / "run-false" / "summary.json").read_text())
    assert caplog.text.count("model.compile: torch.compile (inductor, dynamic shapes) of PretrainingLoss") == 1
    for switch, other in (("false", "true"), ("true", "false")):  # resume each run's step-2 checkpoint the other way
        out = tmp_path / f"run-{switch}"
        for stale in sorted((out / "checkpoints").glob("step_00000004*")):
            stale.rename(stale.with_name(stale.name + ".old"))  # step 2 is then the newest checkpoint
        resumed = _cfg(sample_dataset, out, 4, **RUN, **{"model.compile": other, "checkpoint.every_steps": 2})
        assert train.run(resumed, one_rank, resume=True) == 0
        assert f"model.compile: {switch} -> {other}" in caplog.text
        np.testing.assert_allclose(_losses(out)[-2:], runs["false"][2:], rtol=TOLERANCE)


SUMS = """
import torch
from pretrain import compiling

class Sums(torch.nn.Module):
    def forward(self, mask):
        return mask.sum(-1), mask.bool().sum(-1)

module = compiling.compile_module(Sums())
mask = torch.zeros(16, 16, dtype=torch.int64)
mask[:, :9] = 1
print(sorted({int(x) for t in module(mask) for x in t}))
"""


def test_kernels_cached_for_one_instruction_set_are_never_loaded_for_another(tmp_path):
    """torch 2.13 keys its on-disk kernels without the CPU's vector instruction set: a sum compiled under
    ``ATEN_CPU_CAPABILITY=avx2`` and loaded under AVX-512 gave 25 for 9 (under no vectorisation it failed to build).
    ``compile_module`` keys the cache by the set; one cache directory serves both here."""
    import os

    from common import processes
    from tests.pretrain.launching import REPO

    with open("/proc/cpuinfo") as info:
        other = "avx512" if "avx512f" in info.read().split() else "default"
    for capability in ("avx2", other, "avx2"):
        env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path),
               "PYTHONPATH": str(REPO)}
        result = processes.run([sys.executable, "-c", SUMS], env=env, cwd=REPO, capture_output=True, text=True,
                               timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.split("\n")[-2] == "[9]", (capability, result.stdout)
    assert {p.name for p in tmp_path.glob(f"{compiling.ISA_PREFIX}*")} >= {"isa-avx2_avx2"}


WARM = """
import json, sys
import torch
from pretrain import compiling
from tests.pretrain.test_compiling import _micro_batches, _objective

objective = compiling.compile_module(_objective(64), cache=sys.argv[1])
loss, _ = objective(**_micro_batches(1, 64)[0])
loss.backward()
print(json.dumps(compiling.cache_counts()))
"""


def test_a_compile_cache_directory_makes_the_next_process_start_warm(tmp_path):
    """``model.compile_cache``: the first process compiles every graph (misses only) and leaves its kernels there;
    a second process, with torch's default cache elsewhere, compiles nothing anew (hits only)."""
    import os

    from common import processes
    from tests.pretrain.launching import REPO

    counts = []
    for run in ("cold", "warm"):
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / f"default-{run}"), "PYTHONPATH": str(REPO)}
        result = processes.run([sys.executable, "-c", WARM, str(tmp_path / "shared-cache")], env=env, cwd=REPO,
                               capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
        counts.append(json.loads(result.stdout.strip().splitlines()[-1]))
    cold, warm = counts
    assert cold["fx_graph_misses"] > 0 and cold["fx_graph_hits"] == 0, cold
    assert warm["fx_graph_hits"] == cold["fx_graph_misses"] and warm["fx_graph_misses"] == 0, warm
    assert (tmp_path / "shared-cache").stat().st_mode & 0o777 == 0o700
    assert not list((tmp_path / "default-warm").glob("**/*.py"))  # nothing compiled to torch's default place


def test_a_compile_cache_someone_else_can_write_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "default"))  # restored after the test
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(ValueError, match=r"model.compile_cache .*shared is writable by group or others; compiled "
                                         r"kernels are code every run loads"):
        compiling.use_cache(str(shared))
    shared.chmod(0o755)
    assert compiling.use_cache(str(shared)) == str(shared) == os.environ["TORCHINDUCTOR_CACHE_DIR"]
    with pytest.raises(ValueError, match="apply to compiled models"):
        config.ModelConfig(compile_cache=str(shared))


def test_cuda_graphs_compile_every_region_in_reduce_overhead_mode_with_a_step_per_micro_batch(monkeypatch):
    """``model.compile_cuda_graphs``: each region is compiled with ``mode="reduce-overhead"`` (CUDA graphs, on a
    GPU) and each call of the module starts a new CUDA graph step (torch's graph trees then know that the previous
    micro-batch's outputs are no longer read)."""
    calls, steps = [], []
    monkeypatch.setattr(torch, "compile", lambda fn, **options: calls.append(options) or fn)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: steps.append(1))
    objective = compiling.compile_module(_objective(64), cuda_graphs=True)
    assert len(calls) == len(compiling.regions(objective)) > 1
    assert all(options["mode"] == "reduce-overhead" and options["dynamic"] for options in calls)
    for batch in _micro_batches(3, 64):
        objective(**batch)
    assert len(steps) == 3
    with pytest.raises(ValueError, match="apply to compiled models"):
        config.ModelConfig(compile_cuda_graphs=True)

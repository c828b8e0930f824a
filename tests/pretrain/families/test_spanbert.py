"""SpanBERT's span-boundary objective (``objective.span_boundary``, ``pretrain.families.spanbert``): which tokens the
boundary head sees (spans by the reference's rules, at a row's edges and beside [SEP] too), a loss computed by hand,
padding-free equal to padded, split-independence, exact resume on 2 ranks, and an export without the head."""
from __future__ import annotations

import json
import math
import pathlib
import shutil

import numpy as np
import pytest
import torch

from common.errors import ConfigError
from common.manifest import Manifest
from models.bert.model import BertConfig, BertForPreTraining
from models.bert.span_boundary import MAX_TARGETS, SpanBoundaryHead, flops_per_target
from pretrain import config, families, resume, train
from pretrain.config import ObjectiveConfig
from pretrain.data import PretrainingLoader, ShardedInstances
from pretrain.dynamic_masking import DynamicMasking
from pretrain.families.bert import BertFamily
from pretrain.families.spanbert import SpanBertFamily
from pretrain.families.spanbert_loss import STAT_NAMES, SpanBoundaryLoss, span_targets
from pretrain.recipe import resolve
from tests.pretrain.launching import TINY, launch, losses, settings

CLS, SEP, PAD = 1, 2, 0
SBO_METRICS = ("loss", "mlm_loss", "mlm_accuracy", "sbo_loss", "sbo_accuracy", "sbo_share")
SPAN_RUN = {"objective.masking": "dynamic", "objective.mask_unit": "span", "objective.sentence_objective": "none",
            "objective.span_boundary": "true"}


def _span_dataset(synthetic_dataset) -> pathlib.Path:
    """spanbert_seq512's kind of rows at 128 tokens: one document a row, stored unmasked, span masking recorded."""
    return synthetic_dataset(600, kind="doc_sentences", masking="dynamic", mask_unit="span", document_tokens=60)


def _row(width: int, text: int, *, middle_sep: int | None = None) -> list[int]:
    """[CLS] ``text`` word ids [SEP] then padding; with ``middle_sep`` a [SEP] at that column too (a pair's)."""
    row = [CLS, *range(10, 10 + text), SEP] + [PAD] * (width - text - 2)
    if middle_sep is not None:
        row[middle_sep] = SEP
    return row


def _batch(rows: list[list[int]], masked: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.tensor(rows)
    return ids, (ids != PAD).long(), torch.tensor([r * ids.shape[1] + c for r, c in masked])


def _reference_targets(ids: np.ndarray, real: np.ndarray, masked: set[int],
                       excluded: tuple[int, ...] = (CLS, SEP)) -> dict[int, tuple[int, int, int] | None]:
    """What facebookresearch/SpanBERT's ``span_masking`` gives each masked flat position, written as loops: its spans
    are the maximal runs of masked positions (``merge_intervals`` joins drawn spans that overlap or touch); a run gets
    targets only if the tokens just outside it are text of its segment (not [CLS], [SEP] or padding), and then only
    its first ``MAX_TARGETS`` tokens; a target is (left boundary, right boundary, position in the span)."""
    width, out = ids.shape[1], {}
    for p in sorted(masked):
        start = p
        while start - 1 in masked and start % width:
            start -= 1
        end = p
        while end + 1 in masked and (end + 1) % width:
            end += 1
        text = lambda q: q // width == p // width and real.flat[q] and ids.flat[q] not in excluded  # noqa: E731
        ok = start % width > 0 and (end + 1) % width > 0 and text(start - 1) and text(end + 1)
        out[p] = (start - 1, end + 1, p - start) if ok and p - start < MAX_TARGETS else None
    return out


def _as_dict(targets, positions: torch.Tensor) -> dict[int, tuple[int, int, int] | None]:
    got = {}
    for k, index in enumerate(targets.order.tolist()):
        valid = bool(targets.valid[k])
        got[int(positions[index])] = (int(targets.left[k]), int(targets.right[k]), int(targets.relative[k])) \
            if valid else None
    return got


def test_the_boundaries_are_the_tokens_just_outside_each_span_as_the_reference_has_them():
    width = 24
    ids, mask, positions = _batch(
        [_row(width, 12), _row(width, 8, middle_sep=4), _row(width, 20)],
        [(0, 1), (0, 2),            # touches [CLS]: MLM only
         (0, 4), (0, 5), (0, 6),    # a span inside the text: boundaries columns 3 and 7
         (0, 8), (0, 9),            # a second span touching the first's boundary: boundaries 7 and 10
         (0, 12),                   # the last text token, beside [SEP]: MLM only
         (1, 3), (1, 5),            # either side of a pair's middle [SEP]: MLM only
         (1, 7),                    # inside segment B: boundaries 6 and 8
         *[(2, c) for c in range(2, 19)]])  # 17 tokens in one span: the first 15 have targets
    order = torch.randperm(len(positions), generator=torch.Generator().manual_seed(0))  # any order in
    targets = span_targets(positions[order], ids, mask, torch.tensor([CLS, SEP]))
    got = _as_dict(targets, positions[order])
    w = width
    want = {1: None, 2: None, 4: (3, 7, 0), 5: (3, 7, 1), 6: (3, 7, 2), 8: (7, 10, 0), 9: (7, 10, 1), 12: None,
            w + 3: None, w + 5: None, w + 7: (w + 6, w + 8, 0),
            **{2 * w + c: ((2 * w + 1, 2 * w + 19, c - 2) if c - 2 < MAX_TARGETS else None) for c in range(2, 19)}}
    assert got == want
    assert got == _reference_targets(ids.numpy(), mask.numpy(), set(positions.tolist()))
    assert targets.relative.max() == MAX_TARGETS - 1  # the 16th and 17th token's index stays inside the table


def test_drawn_spans_that_touch_are_one_span_and_a_run_merged_through_words_keeps_its_outer_boundaries():
    ids, mask, positions = _batch([_row(16, 12)], [(0, 3), (0, 4), (0, 5), (0, 6), (0, 7)])
    got = _as_dict(span_targets(positions, ids, mask, torch.tensor([CLS, SEP])), positions)
    assert got == {3: (2, 8, 0), 4: (2, 8, 1), 5: (2, 8, 2), 6: (2, 8, 3), 7: (2, 8, 4)}


def test_the_loaders_span_masks_give_the_reference_targets(synthetic_dataset):
    """On the loader's real micro-batches (dynamic span masking of doc_sentences rows, bert-base-uncased ids), every
    masked token's target is the reference's; spans at the rows' edges occur and have none."""
    data = ShardedInstances(_span_dataset(synthetic_dataset))
    recipe = resolve(ObjectiveConfig(masking="dynamic", sentence_objective="none", mask_unit="span"), data.manifest)
    masking = DynamicMasking.for_dataset(recipe.dynamic_masking, data.tokenizer_dir, seed=3)
    loader = PretrainingLoader(data, micro_batch=16, accumulation=2, world_size=1, rank=0, seed=3, masking=masking)
    special = data.manifest.tokenizer.special_ids
    excluded = torch.tensor([special["[CLS]"], special["[SEP]"]])
    edges = with_targets = 0
    for batch in loader.next_step() + loader.next_step():
        ids, mask = torch.from_numpy(batch["input_ids"]), torch.from_numpy(batch["attention_mask"])
        positions = torch.from_numpy(batch["masked_positions"])
        got = _as_dict(span_targets(positions, ids, mask, excluded), positions)
        assert got == _reference_targets(ids.numpy(), mask.numpy(), set(positions.tolist()), tuple(excluded.tolist()))
        flat = ids.view(-1)
        for target in got.values():
            if target is not None:  # boundaries: unmasked real text tokens
                left, right, _ = target
                assert flat[left] not in excluded and flat[right] not in excluded
                assert not ({left, right} & set(positions.tolist())) and mask.view(-1)[[left, right]].all()
        edges += sum(t is None and bool(torch.isin(flat[[p - 1, p + 1]], excluded).any()) for p, t in got.items())
        with_targets += sum(t is not None for t in got.values())
    assert edges > 0 and with_targets > 10 * edges


def _tiny(vocab: int = 32) -> BertForPreTraining:
    torch.manual_seed(0)
    return BertForPreTraining(BertConfig(vocab_size=vocab, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=16, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0, max_position_embeddings=32))


def _layer_norm(x: torch.Tensor, module: torch.nn.LayerNorm) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + module.eps) * module.weight + module.bias


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def test_a_loss_computed_by_hand_on_a_small_case():
    """One row ``[CLS] w1..w8 [SEP] pad pad``, masked at 1 (beside [CLS]), 3-4 (a span), 6 (a span), 8 (beside
    [SEP]); the head's weights random. Loss = (5 MLM terms + 3 SBO terms) / 5 masked tokens."""
    model = _tiny()
    objective = SpanBoundaryLoss(model, boundary_excluded=(CLS, SEP), seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in objective.span_boundary.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.5)  # biases and LayerNorm weights too
    seen = []
    objective.span_boundary.register_forward_hook(lambda m, inputs, out: seen.append(inputs))
    ids, mask, _ = _batch([_row(12, 8)], [])
    masked = [8, 3, 6, 1, 4]  # any order
    labels = torch.tensor([21, 22, 23, 24, 25])
    loss, stats = objective(ids, torch.zeros_like(ids), mask, torch.tensor(masked), labels,
                            torch.zeros(1, dtype=torch.long), torch.tensor(1 / 5))
    with torch.no_grad():
        hidden = model.bert(ids, torch.zeros_like(ids), mask)[0][0]
        head, mlm = objective.span_boundary, model.cls.predictions
        words = model.bert.embeddings.word_embeddings.weight

        def nll(logits: torch.Tensor, label: int) -> float:
            return float(torch.logsumexp(logits, 0) - logits[label])

        def mlm_term(i: int, label: int) -> float:
            t = _layer_norm(_gelu(mlm.transform.dense.weight @ hidden[i] + mlm.transform.dense.bias),
                            mlm.transform.LayerNorm)
            return nll(words @ t + mlm.bias, label)

        def sbo_term(left: int, right: int, k: int, label: int) -> float:
            h0 = torch.cat([hidden[left], hidden[right], head.position_embeddings.weight[k]])
            h1 = _layer_norm(_gelu(head.dense1.weight @ h0 + head.dense1.bias), head.LayerNorm1)
            y = _layer_norm(_gelu(head.dense2.weight @ h1 + head.dense2.bias), head.LayerNorm2)
            return nll(words @ y + head.bias, label)

        label = dict(zip(masked, labels.tolist()))
        sbo = [sbo_term(2, 5, 0, label[3]), sbo_term(2, 5, 1, label[4]), sbo_term(5, 7, 0, label[6])]
        want = (sum(mlm_term(i, label[i]) for i in masked) + sum(sbo)) / 5
    assert loss.item() == pytest.approx(want, rel=1e-5)
    s = dict(zip(STAT_NAMES, stats.tolist()))
    assert s["sbo_tokens"] == 3 and s["mlm_tokens"] == 5 and s["sbo_loss_sum"] == pytest.approx(sum(sbo), rel=1e-5)
    left, right, relative, _ = seen[0]  # what the head was given, row by row: boundaries 2|5, 2|5, 5|7 (the rest: 0)
    for index, (lb, rb, k) in {1: (2, 5, 0), 2: (2, 5, 1), 3: (5, 7, 0)}.items():  # rows: positions 1, 3, 4, 6, 8
        torch.testing.assert_close(left[index], hidden[lb])
        torch.testing.assert_close(right[index], hidden[rb])
        assert int(relative[index]) == k


def _loader_batches(dataset, *, padding_free: bool, accumulation: int = 2, micro: int = 8):
    data = ShardedInstances(dataset)
    recipe = resolve(ObjectiveConfig(masking="dynamic", sentence_objective="none", mask_unit="span"), data.manifest)
    masking = DynamicMasking.for_dataset(recipe.dynamic_masking, data.tokenizer_dir, seed=5)
    loader = PretrainingLoader(data, micro_batch=micro, accumulation=accumulation, world_size=1, rank=0, seed=5,
                               masking=masking, padding_free=padding_free, window_batches=1)  # short rows too
    special = data.manifest.tokenizer.special_ids
    batches = [{k: torch.from_numpy(np.asarray(v)) for k, v in b.items()} for b in loader.next_step()]
    return batches, (special["[CLS]"], special["[SEP]"]), -(-data.manifest.tokenizer.vocab_size // 8) * 8


def _objective(vocab: int, excluded, padding_free: bool, dropout: float = 0.0) -> SpanBoundaryLoss:
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=64, max_position_embeddings=128,
                                          hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout))
    return SpanBoundaryLoss(model, boundary_excluded=excluded, seed=7, padding_free=padding_free).train()


def test_padding_free_and_padded_give_the_same_losses_statistics_and_gradients(synthetic_dataset):
    batches, excluded, vocab = _loader_batches(_span_dataset(synthetic_dataset), padding_free=True)
    assert any(bool((b["attention_mask"] == 0).any()) for b in batches)
    padded, unpadded = _objective(vocab, excluded, False), _objective(vocab, excluded, True)
    assert all(torch.equal(a, b) for a, b in zip(padded.state_dict().values(), unpadded.state_dict().values()))
    loader_only = {"unpadded_index", "cu_seqlens", "max_seqlen", "unpadded_masked_positions"}
    for batch in batches:
        results = []
        for objective, inputs in ((padded, {k: v for k, v in batch.items() if k not in loader_only}),
                                  (unpadded, batch)):
            loss, stats = objective(**inputs)
            loss.backward()
            results.append((loss.detach(), stats, {n: p.grad.clone() for n, p in objective.named_parameters()
                                                   if p.grad is not None}))
            objective.zero_grad(set_to_none=True)
        (loss_a, stats_a, grads_a), (loss_b, stats_b, grads_b) = results
        torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=0)
        torch.testing.assert_close(stats_b, stats_a, rtol=1e-5, atol=1e-5)
        assert stats_a[STAT_NAMES.index("sbo_tokens")] > 0
        assert grads_a.keys() == grads_b.keys() and any(n.startswith("span_boundary.") for n in grads_a)
        for name, grad in grads_a.items():
            if name.endswith("self.key.bias"):  # zero but for rounding: softmax ignores a constant added to a row
                continue
            torch.testing.assert_close(grads_b[name], grad, rtol=1e-4, atol=1e-5 * grad.abs().max().item(),
                                       msg=name)


def test_the_loss_is_a_global_batch_mean_however_the_batch_is_split(synthetic_dataset):
    """One micro-batch of 16 rows against the same rows as 2 of 8 (the loader's scale, gradients averaged as
    DeepSpeed averages them): the same loss."""
    whole, excluded, vocab = _loader_batches(_span_dataset(synthetic_dataset), padding_free=False, accumulation=1,
                                             micro=16)
    halves, _, _ = _loader_batches(_span_dataset(synthetic_dataset), padding_free=False, accumulation=2, micro=8)
    objective = _objective(vocab, excluded, False).eval()
    with torch.no_grad():
        one = objective(**whole[0])[0]
        two = sum(objective(**batch)[0] for batch in halves) / 2
    torch.testing.assert_close(two, one, rtol=1e-5, atol=0)


@pytest.fixture(scope="module")
def small_run(one_rank, synthetic_dataset, tmp_path_factory) -> pathlib.Path:
    """The tiny config with SpanBERT's objective, 3 steps, exported at the end."""
    out = tmp_path_factory.mktemp("spanbert") / "run"
    overrides = {**SPAN_RUN, "data.path": _span_dataset(synthetic_dataset), "output_dir": out,
                 "train.max_steps": 3, "schedule.total_steps": 3, "schedule.warmup_steps": 1,
                 "train.global_batch_size": 16, "train.micro_batch_size": 8, "data.window_batches": 1,
                 "checkpoint.every_steps": 0, "checkpoint.export_hf": "true", "logging.log_every": 1,
                 "logging.tensorboard": "false", "logging.progress": "false"}
    cfg = config.load(TINY, [f"{k}={v}" for k, v in overrides.items()])
    assert isinstance(families.for_config(cfg), SpanBertFamily)
    assert train.run(cfg, one_rank, resume=False) == 0
    return out


def test_a_run_logs_the_boundary_objective(small_run):
    records = [json.loads(line) for line in (small_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert all(math.isfinite(r[k]) for k in SBO_METRICS) and 0.5 < r["sbo_share"] <= 1.0
        assert r["loss"] == pytest.approx(r["mlm_loss"] + r["sbo_loss"] * r["sbo_share"], rel=1e-9)


def test_the_export_is_a_bert_transformers_loads_without_the_head(small_run, tmp_path):
    import transformers
    from safetensors.torch import load_file

    from models.registry import family
    from pretrain.export import export_checkpoint

    exported = load_file(str(small_run / "hf" / "model.safetensors"))
    ours, fresh = families.for_config(config.load(TINY)).load_model(small_run / "hf")
    assert not fresh and not any("span_boundary" in k or "dense1" in k for k in exported)
    assert set(ours.state_dict()) - {"cls.predictions.decoder.weight"} <= set(exported) <= set(ours.state_dict())
    mlm = transformers.BertForMaskedLM.from_pretrained(str(small_run / "hf")).eval()
    ids = torch.randint(1000, 30000, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(mlm(input_ids=ids).logits, ours.eval()(ids)[0], rtol=1e-5, atol=1e-5)
    encoder = family("bert").load_encoder(small_run / "hf")  # what python -m finetune reads
    assert type(encoder).__name__ == "BertModel"
    export_checkpoint(small_run, tmp_path / "hf")  # from the checkpoint, which holds the head: the same export
    again = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert sorted(again) == sorted(exported) and all(torch.equal(again[k], exported[k]) for k in exported)


def test_a_resumed_run_on_two_ranks_repeats_every_loss_bitwise(synthetic_dataset, tmp_path):
    """Dropout on, ZeRO 1, fp32: the ranks' RNG states, the loader's masks, the model and the boundary head (a module
    of the loss, checkpointed with it) and their optimizer states must all resume."""
    dataset = _span_dataset(synthetic_dataset)
    common = {**SPAN_RUN, "zero.stage": 1, "train.precision": "fp32", "train.global_batch_size": 16,
              "train.micro_batch_size": 8, "checkpoint.every_steps": 2, "checkpoint.keep_last": 5}
    full, part = tmp_path / "full", tmp_path / "part"
    result = launch("torchrun", 2, settings(dataset, full, steps=4, **common))
    assert result.returncode == 0, result.stdout[-4000:]
    assert "span-boundary head" in result.stdout
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / "step_00000002", part / "checkpoints" / "step_00000002")
    result = launch("torchrun", 2, ["--resume", *settings(dataset, part, steps=4, **common)])
    assert result.returncode == 0 and "at step 2 (32 samples consumed) on 2 ranks" in result.stdout, result.stdout
    assert sorted(losses(part)) == [3, 4]
    records = lambda run: [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    want = {r["step"]: r for r in records(full)}
    for record in records(part):
        assert all(record[k] == want[record["step"]][k] for k in SBO_METRICS), (record, want[record["step"]])


def test_the_head_starts_the_same_on_every_rank_whatever_the_global_rng():
    cfg = config.load(TINY, [f"{k}={v}" for k, v in SPAN_RUN.items()])
    family = families.for_config(cfg)
    model = BertForPreTraining(BertConfig(vocab_size=64, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=16))
    heads = []
    for rank in (0, 1):
        torch.manual_seed(cfg.seed * 1000 + rank)  # pretrain.train seeds each rank apart before the loss module
        heads.append(SpanBoundaryLoss(model, boundary_excluded=(CLS, SEP), seed=family.head_seed()).span_boundary)
    assert all(torch.equal(a, b) for a, b in zip(heads[0].state_dict().values(), heads[1].state_dict().values()))
    other = families.for_config(config.load(TINY, [*(f"{k}={v}" for k, v in SPAN_RUN.items()), "seed=7"]))
    assert other.head_seed() != family.head_seed()


def test_the_checkpoints_head_is_left_out_of_the_model_and_counted_in_the_flops():
    cfg = config.load(TINY, [f"{k}={v}" for k, v in SPAN_RUN.items()])
    family = families.for_config(cfg)
    model = family.new_model(vocab_size=64, pad_token_id=0)
    state = SpanBoundaryLoss(model, boundary_excluded=(CLS, SEP), seed=1).state_dict()
    assert any(k.startswith("span_boundary.") for k in state)
    rebuilt = family.model_from_state({k.removeprefix("model."): v for k, v in state.items()}, model.config)
    assert type(rebuilt) is BertForPreTraining
    bert = BertFamily(cfg.model, "none")
    extra = family.flops_per_token(model, 128, 0.15) - bert.flops_per_token(model, 128, 0.15)
    assert extra == pytest.approx(flops_per_target(model.config) * 0.15)
    head = SpanBoundaryHead(model.config)
    assert head.position_embeddings.weight.shape == (MAX_TARGETS, 200)


@pytest.mark.parametrize("overrides, message", [
    ({"model.family": "albert", "model.preset": "albert_tiny"}, "model.family albert has no span-boundary objective"),
    ({"distillation.teacher": "somewhere"}, "distillation has no span-boundary objective"),
    ({"objective.mask_unit": "token"}, "objective.mask_unit is 'token': set objective.mask_unit: span"),
])
def test_a_config_that_cannot_train_the_boundary_objective_is_refused_in_one_line(overrides, message):
    with pytest.raises(ValueError, match=message) as error:
        config.load(TINY, [f"{k}={v}" for k, v in {**SPAN_RUN, **overrides}.items()])
    assert "\n" not in str(error.value)


def test_a_dataset_without_span_masks_is_refused_in_one_line(synthetic_dataset, tmp_path):
    tokens = synthetic_dataset(600, kind="doc_sentences", masking="dynamic", document_tokens=60)  # token masks
    cfg = config.load(TINY, [f"{k}={v}" for k, v in {**SPAN_RUN, "objective.mask_unit": "null",
                                                      "data.path": tokens}.items()])
    family = families.for_config(cfg)
    with pytest.raises(ConfigError, match="are token masks: set objective.mask_unit: span") as error:
        family.loss_module(family.new_model(vocab_size=30528, pad_token_id=0))
    assert "\n" not in str(error.value) and str(Manifest.read(tokens).path) in str(error.value)
    spans = config.load(TINY, [f"{k}={v}" for k, v in {**SPAN_RUN, "data.path": tokens}.items()])
    assert families.for_config(spans).boundary_excluded() == (101, 102)  # a dynamic dataset masked as the config says


def test_a_checkpoint_from_before_the_switch_resumes_without_it():
    saved = resume.flatten({"objective": {"masking": "dynamic"}})
    refused, applied = resume.compare(saved, {**saved, "objective.span_boundary": False})
    assert not refused and not applied
    refused, _ = resume.compare(saved, {**saved, "objective.span_boundary": True})
    assert [d.key for d in refused] == ["objective.span_boundary"]


def test_the_memory_plan_counts_the_boundary_head_with_the_trained_parameters(synthetic_dataset):
    from pretrain.memory import estimate_for_run

    overrides = {**SPAN_RUN, "data.path": _span_dataset(synthetic_dataset)}
    cfg = config.load(TINY, [f"{k}={v}" for k, v in overrides.items()])
    family = families.for_config(cfg)
    model = family.new_model(vocab_size=1024, pad_token_id=0)
    trained = sum(p.numel() for p in family.loss_module(model).parameters() if p.requires_grad)
    assert trained > sum(p.numel() for p in model.parameters())  # the head is there to count
    assert estimate_for_run(cfg, 1, vocab_size=1024).parameters == trained

"""TinyBERT-style distillation (``distillation.loss: tinybert``, pretrain.families.tinybert_loss): the layer mapping,
the projections, the attention scores the model uses, every term of the loss by hand, the shipped configs, an export
without the projections, exact resume on 2 ranks, and the refusals."""
import json
import math
import pathlib
import shutil

import pytest
import torch
import transformers

from common.errors import ConfigError
from models.bert.hf import export, load_pretrained
from models.bert.model import BertConfig, BertForPreTraining, BertLayer, count_parameters, embed
from pretrain import config, train
from pretrain.families import for_config
from pretrain.families.distillation import DistillationFamily
from pretrain.families.tinybert_loss import (
    PROJECTIONS,
    STAT_NAMES,
    Projections,
    TinyBertLoss,
    score_mse,
    tinybert_layer_map,
)
from tests.pretrain.launching import launch, losses, settings

CONFIGS = pathlib.Path(__file__).resolve().parents[3] / "configs" / "pretrain"
TEACHER = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=4, num_attention_heads=2,
                     intermediate_size=128, max_position_embeddings=128)


@pytest.fixture(scope="module")
def dataset(synthetic_dataset):
    return synthetic_dataset(1_000, kind="full_sentences", masking="dynamic", document_tokens=60)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, dataset) -> pathlib.Path:
    """A 4-layer, 64-wide BERT with its MLM head and the dataset's vocabulary, as a Hugging Face directory."""
    torch.manual_seed(7)
    directory = tmp_path_factory.mktemp("teacher") / "hf"
    export(BertForPreTraining(TEACHER), directory, tokenizer_dir=dataset / "tokenizer")
    return directory


def tiny(dataset, teacher, out, **more):
    """The shipped test preset (its precisions ``auto``, as every shipped config's), the teacher's forward in fp32 so
    that the hand-computed terms compare at fp32's tolerance on any CPU."""
    overrides = {"data.path": dataset, "output_dir": out, "distillation.teacher": teacher,
                 "distillation.teacher_precision": "fp32", **more}
    return config.load(CONFIGS / "tinybert_tiny.yaml", [f"{key}={value}" for key, value in overrides.items()])


def test_the_layer_mapping_is_uniform_or_given():
    assert tinybert_layer_map(12, 4) == [3, 6, 9, 12]  # TinyBERT-4 of BERT-base: g(m) = 3m
    assert tinybert_layer_map(12, 6) == [2, 4, 6, 8, 10, 12] and tinybert_layer_map(6, 3) == [2, 4, 6]
    assert tinybert_layer_map(4, 3) == [1, 2, 4]  # M does not divide N: m x N / M rounded down
    assert tinybert_layer_map(12, 4, [1, 2, 11, 12]) == [1, 2, 11, 12]
    for wrong in ([3, 6, 9], [0, 3, 6, 9], [3, 6, 9, 13]):
        with pytest.raises(ValueError, match=r"distillation.layer_map .*one teacher layer from 1 to 12"):
            tinybert_layer_map(12, 4, wrong)


def test_the_projections_map_the_students_width_to_the_teachers_and_start_from_the_seed():
    projections = Projections(32, 64, seed=5)
    for linear in (projections.hidden, projections.embedding):
        assert linear.weight.shape == (64, 32) and linear.bias.shape == (64,) and not linear.bias.any()
        assert 0.015 < float(linear.weight.detach().std()) < 0.025  # BERT's N(0, 0.02)
    assert projections.hidden(torch.zeros(3, 7, 32)).shape == (3, 7, 64)
    again, other = Projections(32, 64, seed=5), Projections(32, 64, seed=6)
    assert all(torch.equal(a, b) for a, b in zip(projections.state_dict().values(), again.state_dict().values()))
    assert not torch.equal(projections.hidden.weight, other.hidden.weight)
    assert not list(Projections(64, 64, seed=5).parameters())  # equal widths: the identity, nothing to train


@pytest.mark.parametrize("documents", [False, True])
def test_the_attention_scores_are_the_ones_the_layer_uses(documents):
    """``forward_with_scores`` gives the layer's own output (SDPA's) and the scores Q K^T / sqrt(d) of a manual
    computation; padding and packed documents masked as the model masks them."""
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=24, num_hidden_layers=1, num_attention_heads=3, intermediate_size=48)
    layer, embeddings = BertLayer(cfg).eval(), BertForPreTraining(cfg).bert.embeddings.eval()
    ids = torch.randint(5, 100, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    document_ids = torch.tensor([[0] * 4 + [1] * 5, [0] * 3 + [1] * 6]) if documents else None
    x, attn_mask, _ = embed(embeddings, ids, None, mask, None, document_ids=document_ids)
    out, scores = layer.forward_with_scores(x, attn_mask)
    torch.testing.assert_close(out, layer(x, attn_mask), rtol=1e-5, atol=1e-5)
    attention = layer.attention.self
    q = (x @ attention.query.weight.T + attention.query.bias).view(2, 9, 3, 8)
    k = (x @ attention.key.weight.T + attention.key.bias).view(2, 9, 3, 8)
    manual = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(8)
    torch.testing.assert_close(scores, manual, rtol=1e-5, atol=1e-6)
    # The output is softmax over the allowed keys of these very scores, times V.
    v = (x @ attention.value.weight.T + attention.value.bias).view(2, 9, 3, 8)
    probabilities = manual.masked_fill(~attn_mask, float("-inf")).softmax(-1)
    attended = torch.einsum("bhqk,bkhd->bqhd", probabilities, v).reshape(2, 9, 24)
    y = layer.attention.output(attended, x)
    torch.testing.assert_close(out, layer.output(layer.intermediate(y), y), rtol=1e-5, atol=1e-5)


def test_the_attention_term_leaves_out_masked_pairs_and_padded_queries():
    """1 row, 1 head, 3 tokens, the last one padding: only the 2 x 2 real (query, key) pairs count."""
    student = torch.tensor([[[[1.0, 2.0, 9.0], [0.0, 4.0, 9.0], [5.0, 5.0, 5.0]]]])
    teacher = torch.tensor([[[[0.0, 0.0, -9.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]]])
    real = torch.tensor([[True, True, False]])
    attn_mask = real[:, None, None, :]
    # query 0: ((1-0)^2 + (2-0)^2) / 2 = 2.5; query 1: ((0-1)^2 + (4-1)^2) / 2 = 5; padded query 2 left out.
    assert float(score_mse(student, teacher, attn_mask, real)) == pytest.approx(7.5)


def test_every_term_of_the_loss_by_hand(dataset, teacher, tmp_path):
    """The module's loss and statistics against transformers' BertModel (hidden states) and Q K^T / sqrt(d) of its
    weights, with the prediction term on (weight 0.5, T 2) so that every term counts."""
    cfg = tiny(dataset, teacher, tmp_path / "run", **{"distillation.prediction_weight": 0.5,
                                                       "distillation.temperature": 2.0})
    family = for_config(cfg)
    student = family.new_model(vocab_size=0, pad_token_id=0)
    objective = family.loss_module(student).eval()
    assert isinstance(objective, TinyBertLoss) and objective.layer_map == [2, 4]
    assert {k for k in objective.state_dict() if not k.startswith("model.")} == {
        "projections.hidden.weight", "projections.hidden.bias", "projections.embedding.weight",
        "projections.embedding.bias"}
    torch.manual_seed(1)
    ids = torch.randint(1000, 2000, (2, 12))
    attention = torch.ones(2, 12, dtype=torch.long)
    attention[1, 9:] = 0
    masked, labels = torch.tensor([1, 4, 13, 15, 20]), torch.randint(1000, 2000, (5,))
    batch = dict(input_ids=ids, token_type_ids=torch.zeros_like(ids), attention_mask=attention,
                 masked_positions=masked, masked_labels=labels, next_sentence_labels=torch.zeros(2, dtype=torch.long),
                 mlm_loss_scale=torch.tensor(1 / 5), token_loss_scale=torch.tensor(1 / 21))
    loss, stats = objective(**batch)
    loss.backward()
    assert all(p.grad is None for p in objective.teacher.parameters())
    assert objective.projections.hidden.weight.grad is not None

    def reference(model, directory):
        export(model, directory)
        hf = transformers.BertModel.from_pretrained(directory, attn_implementation="eager").eval()
        out = hf(ids, attention_mask=attention, output_hidden_states=True)
        scores = []
        for layer, h in zip(hf.encoder.layer, out.hidden_states):
            a = layer.attention.self
            q, k = (t.view(2, 12, a.num_attention_heads, -1).transpose(1, 2) for t in (a.query(h), a.key(h)))
            scores.append(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]))
        logits = model.cls.predictions(out.last_hidden_state.reshape(-1, model.config.hidden_size)[masked])
        return out.hidden_states, scores, logits

    with torch.no_grad():
        (hs, ss, ls), (ht, st, lt) = reference(student, tmp_path / "s"), reference(objective.teacher, tmp_path / "t")
        real = attention.bool()
        w_h, w_e = objective.projections.hidden, objective.projections.embedding
        mse = lambda a, b: ((a - b) ** 2).mean(-1)[real].mean()  # noqa: E731  per real token, mean over width
        embedding = mse(w_e(hs[0]), ht[0])
        hidden = mse(w_h(hs[1]), ht[2]) + mse(w_h(hs[2]), ht[4])  # student layers 1, 2 fit teacher layers 2, 4
        keys = attention[:, None, None, :].float().expand(2, 2, 12, 12)
        per_query = lambda a, b: (((a - b) ** 2 * keys).sum(-1) / keys.sum(-1)).mean(1)[real].mean()  # noqa: E731
        scores = per_query(ss[0], st[1]) + per_query(ss[1], st[3])
        prediction = -(torch.softmax(lt / 2, -1) * torch.log_softmax(ls / 2, -1)).sum(-1).mean()
    assert loss.item() == pytest.approx(float(embedding + hidden + scores + 0.5 * prediction), rel=1e-4)
    s = dict(zip(STAT_NAMES, stats.tolist()))
    for name, want, count in (("embedding", embedding, 21), ("hidden", hidden, 21), ("attention", scores, 21),
                              ("prediction", prediction, 5)):
        assert s[f"{name}_loss_sum"] / count == pytest.approx(float(want), rel=1e-4), name
    assert s["tokens"] == 21 and s["mlm_tokens"] == 5 and s["agreement"] == float((ls.argmax(-1) == lt.argmax(-1)).sum())
    summary = family.summary(stats)
    assert summary["loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert summary["attention_loss"] == pytest.approx(float(scores), rel=1e-4) and "teacher_agreement" in summary


def test_the_tiny_preset_trains_and_exports_the_student_alone(one_rank, dataset, teacher, tmp_path):
    """A from-scratch 32-wide student; the checkpoint holds the projections, the export (the run's and
    ``python -m pretrain.export``'s, the same files) does not, and transformers loads it."""
    from pretrain.export import main

    run = tmp_path / "run"
    cfg = tiny(dataset, teacher, run, **{"checkpoint.every_steps": 4})
    assert train.run(cfg, one_rank, resume=False) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for r in records:
        terms = ("embedding_loss", "hidden_loss", "attention_loss")
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in terms) and r["prediction_loss"] == 0
        assert r["loss"] == pytest.approx(sum(r[k] for k in terms), rel=1e-6) and "teacher_agreement" not in r
    assert records[-1]["loss"] < records[0]["loss"]
    checkpoint = torch.load(next((run / "checkpoints").rglob("mp_rank_00_model_states.pt")), weights_only=False)
    assert any(k.startswith(PROJECTIONS) for k in checkpoint["module"])
    hf = transformers.BertForPreTraining.from_pretrained(run / "hf")
    assert hf.config.hidden_size == 32 and hf.config.num_hidden_layers == 2 and hf.config.intermediate_size == 64
    ours, _ = load_pretrained(run / "hf")
    names = set(ours.state_dict()) | {k for k in hf.state_dict()}
    assert not any("projection" in k for k in names)
    assert main([str(run), str(tmp_path / "exported")]) == 0
    files = lambda d: {p.relative_to(d): p.read_bytes() for p in d.rglob("*") if p.is_file()}  # noqa: E731
    assert files(tmp_path / "exported") == files(run / "hf")


def test_the_memory_plan_counts_the_projections_with_the_trained_parameters(dataset, teacher, tmp_path):
    from pretrain.memory import estimate_for_run

    cfg = tiny(dataset, teacher, tmp_path / "run")
    family = for_config(cfg)
    model = family.new_model(vocab_size=family.teacher_config.vocab_size, pad_token_id=0)
    loss = family.loss_module(model)
    trained = sum(p.numel() for p in loss.parameters() if p.requires_grad)
    assert trained == sum(p.numel() for p in model.parameters()) + sum(
        p.numel() for p in loss.projections.parameters())
    assert estimate_for_run(cfg, 1).parameters == trained
    same_width = tiny(dataset, teacher, tmp_path / "run", **{"distillation.student_hidden_size": TEACHER.hidden_size,
                                                              "distillation.student_intermediate_size": 128})
    family = for_config(same_width)
    model = family.new_model(vocab_size=family.teacher_config.vocab_size, pad_token_id=0)
    assert estimate_for_run(same_width, 1).parameters == sum(p.numel() for p in model.parameters())  # W = identity


def test_the_shipped_tinybert_4_is_the_papers_student(tmp_path):
    recipe = config.load(CONFIGS / "tinybert_4.yaml")
    d = recipe.distillation
    assert (d.loss, d.student_layers, d.student_hidden_size, d.student_intermediate_size,
            d.student_attention_heads) == ("tinybert", 4, 312, 1200, 12)
    assert (d.embedding_weight, d.hidden_weight, d.attention_weight, d.prediction_weight) == (1, 1, 1, 0)
    assert recipe.optimizer.lr == 5e-5 and recipe.train.global_batch_size == 256
    bert_base = tmp_path / "bert-base"  # its config is all the family reads before the teacher's weights
    bert_base.mkdir()
    (bert_base / "config.json").write_text(json.dumps({"model_type": "bert", **BertConfig().__dict__}))
    family = for_config(config.load(CONFIGS / "tinybert_4.yaml", [f"distillation.teacher={bert_base}"]))
    student = family.student_config()
    assert (student.num_hidden_layers, student.hidden_size, student.intermediate_size) == (4, 312, 1200)
    assert family.fitted == [3, 6, 9, 12] and not family.from_teacher_layers()
    assert 14_000_000 < count_parameters(student) < 15_000_000  # the paper's 14.5M


def test_tinybert_resumes_bitwise_on_two_ranks(sample_dataset, teacher, tmp_path):
    """NSP rows (the student's pair head trains too), dropout on, ZeRO 1, a from-scratch 32-wide student with its
    projections in the checkpoint: the resumed run's losses are the uninterrupted one's, bit for bit."""
    common = {"distillation.teacher": teacher, "distillation.loss": "tinybert", "distillation.student_layers": 2,
              "distillation.student_hidden_size": 32, "distillation.student_intermediate_size": 64,
              "distillation.student_attention_heads": 2, "distillation.teacher_precision": "fp32",
              "zero.stage": 1, "train.precision": "fp32", "train.global_batch_size": 8, "train.micro_batch_size": 4,
              "checkpoint.every_steps": 2, "checkpoint.keep_last": 5}
    full, part = tmp_path / "full", tmp_path / "part"
    result = launch("torchrun", 2, settings(sample_dataset, full, steps=4, **common))
    assert result.returncode == 0, result.stdout[-4000:]
    assert "32 wide, from scratch, tinybert loss fitting teacher layers 2, 4" in result.stdout
    (part / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / "step_00000002", part / "checkpoints" / "step_00000002")
    shutil.copy(full / "teacher.json", part / "teacher.json")
    result = launch("torchrun", 2, ["--resume", *settings(sample_dataset, part, steps=4, **common)])
    assert result.returncode == 0, result.stdout[-4000:]
    want, got = losses(full), losses(part)
    assert sorted(got) == [3, 4] and all(got[step] == want[step] for step in got), (got, want)
    records = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    assert all("nsp_loss" in r and "attention_loss" in r for r in records)


def test_what_tinybert_cannot_do_is_refused_in_one_line(dataset, teacher, tmp_path):
    def refused(**more):
        with pytest.raises((ValueError, ConfigError)) as error:
            family = for_config(tiny(dataset, teacher, tmp_path / "run", **more))
            family.loss_module(family.new_model(vocab_size=0, pad_token_id=0))
        assert "\n" not in str(error.value)
        return str(error.value)

    assert "student has 4 heads, the teacher 2" in refused(**{"distillation.student_attention_heads": 4})
    assert "padding_free is not implemented for distillation.loss tinybert" in refused(**{"model.padding_free": True})
    assert "one teacher layer from 1 to 4 for each of the 2" in refused(**{"distillation.layer_map": "[2, 5]"})
    assert "distillation.kl_weight applies to distillation.loss distilbert" in refused(**{"distillation.kl_weight": 1})
    assert "distillation.attention_weight applies to distillation.loss tinybert" in refused(
        **{"distillation.loss": "distilbert", "distillation.attention_weight": 2})
    assert "student_hidden_size must be the teacher's 64" in refused(**{"distillation.loss": "distilbert"})
    family = for_config(tiny(dataset, teacher, tmp_path / "run"))
    assert isinstance(family, DistillationFamily) and family.stat_names == STAT_NAMES

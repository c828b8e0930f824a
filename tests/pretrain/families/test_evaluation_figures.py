"""Each family's evaluation figures (pretrain.evaluation.evaluate) on the held-out split: the same numbers from one
rank and from two (threads standing in for ranks, with real all-reduce and all-gather semantics, dummy forwards
included), train mode and the random streams left as they were; BERT's NSP, ELECTRA's discriminator AUC (against
sklearn on the scores), distillation's agreement with the teacher (1 for a student that is the teacher)."""
import copy
import math
import threading

import pytest
import torch

from models.bert.hf import export
from models.bert.model import BertConfig, BertForPreTraining
from pretrain import config
from pretrain.data import open_evaluation
from pretrain.evaluation import Layout, LocalEngine, evaluate
from pretrain.families.bert import BertFamily
from pretrain.families.distillation import DistillationFamily
from pretrain.families.electra import ElectraFamily

ROWS, BATCH = 20, 6  # 4 evaluation micro-batches: 2 ranks take 2 each; 3 ranks would need a dummy forward


class _ThreadRank(LocalEngine):
    """Rank ``rank`` of ``world`` threads: all_reduce sums in rank order, all_gather lists in rank order."""

    def __init__(self, module, rank, world, shared):
        super().__init__(module)
        self.rank, self.world_size, self.shared = rank, world, shared

    def _exchange(self, value):
        barrier, slots = self.shared
        slots[self.rank] = value
        barrier.wait()
        out = list(slots)
        barrier.wait()
        return out

    def all_reduce(self, tensor):
        parts = self._exchange(tensor.clone())
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        tensor.copy_(total)

    def all_gather(self, value):
        return self._exchange(value)


def _on_ranks(module, family, split, world):
    shared, results = (threading.Barrier(world), [None] * world), [None] * world

    def rank(r):
        engine = _ThreadRank(copy.deepcopy(module), r, world, shared)
        results[r] = evaluate(engine, family, split, max_rows=ROWS, batch_size=BATCH, layout=Layout())

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(result == results[0] for result in results)
    return results[0]


@pytest.fixture(scope="module")
def split(split_dataset):
    return open_evaluation(split_dataset)


def _check(family, model, split):
    module = family.loss_module(model).train()
    before = torch.get_rng_state()
    alone = evaluate(LocalEngine(module), family, split, max_rows=ROWS, batch_size=BATCH)
    assert module.training and torch.equal(torch.get_rng_state(), before)
    assert _on_ranks(module, family, split, 2) == alone
    assert _on_ranks(module, family, split, 3) == alone  # 4 micro-batches on 3 ranks: one dummy forward
    assert alone["rows"] == ROWS and set(family.evaluation_metrics()) <= set(alone)
    return alone


def test_bert_reports_nsp_and_perplexity(split):
    family = BertFamily(config.ModelConfig(preset="tiny", max_position_embeddings=128), "nsp")
    torch.manual_seed(0)
    figures = _check(family, family.new_model(vocab_size=30528, pad_token_id=0), split)
    assert 0 <= figures["nsp_accuracy"] <= 1 and figures["mlm_perplexity"] == pytest.approx(
        math.exp(figures["mlm_loss"]), rel=1e-12)


def test_electra_reports_the_discriminators_auc(split):
    from sklearn.metrics import roc_auc_score

    family = ElectraFamily(config.ModelConfig(family="electra", preset="electra_tiny", max_position_embeddings=128),
                           config.ElectraTrainingConfig(), seed=0)
    torch.manual_seed(0)
    model = family.new_model(vocab_size=30528, pad_token_id=0)
    figures = _check(family, model, split)
    module = family.loss_module(model).eval()
    from pretrain.evaluation import evaluation_batch, micro_batch_rows
    from pretrain.loop import to_device

    scores = []
    with torch.no_grad():
        for index, rows in enumerate(micro_batch_rows(ROWS, BATCH)):
            batch = to_device(evaluation_batch(split, rows, Layout()), torch.device("cpu"))
            scores.append(module(**batch, **family.evaluation_inputs(index))[2])
    scores = torch.cat(scores).numpy()
    assert figures["disc_auc"] == pytest.approx(roc_auc_score(scores[:, 1], scores[:, 0]), abs=1e-12)
    assert {"disc_accuracy", "mlm_accuracy"} <= set(figures)


def test_distillation_reports_agreement_with_the_teacher(split, split_dataset, tmp_path):
    teacher = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, max_position_embeddings=128)
    torch.manual_seed(7)
    export(BertForPreTraining(teacher), tmp_path / "teacher", tokenizer_dir=split_dataset / "tokenizer")
    # A student of the teacher's every layer is the teacher: it agrees on every masked token.
    settings = config.DistillationConfig(teacher=str(tmp_path / "teacher"), student_layers=2, teacher_precision="fp32")
    family = DistillationFamily(config.ModelConfig(max_position_embeddings=128), "nsp", settings,
                                str(split_dataset), tmp_path / "run")
    figures = _check(family, family.new_model(vocab_size=30522, pad_token_id=0), split)
    assert figures["teacher_agreement"] == 1.0


@pytest.fixture(scope="module")
def electra_split(tmp_path_factory, bert_vocab):
    """Packed rows without a sentence-pair label (ELECTRA's), with a held-out split."""
    from common import preprocess_config
    from preprocess.executors import pipeline
    from tests.pretrain.conftest import SAMPLES

    out = tmp_path_factory.mktemp("electra-split") / "dataset"
    cfg = preprocess_config.load("configs/preprocess/tiny.yaml", [
        "instances.kind=full_sentences", "instances.sentence_objective=none", "instances.dupe_factor=1", "heldout.books.documents=1",
        "heldout.wikipedia.documents=8"])
    pipeline.run(cfg, wikipedia=[str(SAMPLES / "wikipedia")], books=[str(SAMPLES / "books")],
                 tokenizer=str(bert_vocab), output=str(out), progress=False)
    return out


def test_electra_in_a_run_through_deepspeed_equals_the_cli(one_rank, electra_split, tmp_path):
    """The run's evaluation (DeepSpeed's forward, the scores gathered) and ``python -m pretrain.evaluate`` on the
    run's checkpoint: the same generator draws (seeded by the micro-batch index), the same figures, AUC included."""
    import json

    from pretrain import evaluate as evaluate_cli
    from pretrain import train
    from tests.pretrain.launching import TINY, settings

    out = tmp_path / "run"
    more = {"model.family": "electra", "model.preset": "electra_tiny", "objective.sentence_objective": "none",
            "train.global_batch_size": 8, "train.micro_batch_size": 8, "train.precision": "fp32",
            "zero.stage": 0, "eval.max_rows": ROWS, "eval.batch_size": BATCH}
    cfg = config.load(TINY, [a for a in settings(electra_split, out, steps=1, **more) if a != "--set"])
    assert train.run(cfg, one_rank, resume=False) == 0
    in_run = json.loads((out / "summary.json").read_text())["evaluation"]["last"]
    assert 0 <= in_run["disc_auc"] <= 1
    report = tmp_path / "scores.json"
    assert evaluate_cli.main(["--model", str(out), "--data", str(electra_split), "--max-rows", str(ROWS),
                              "--batch-size", str(BATCH), "--output", str(report)]) == 0
    for name, value in json.loads(report.read_text())["figures"].items():
        assert value == pytest.approx(in_run[name], abs=1e-6), name

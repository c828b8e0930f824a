"""`python -m finetune suite --save-models`: each task's selected model as a transformers task-model directory,
loaded by AutoModelFor… and AutoTokenizer, whose pipeline predictions equal our evaluator's and whose scores equal
the report's, for every model family (tiny random BERT, ALBERT, ELECTRA, DeBERTa-v3 briefly finetuned; WordPiece
here, SentencePiece in test_task_models_sentencepiece.py) and task family (GLUE
single sentence, pair and STS-B regression, CoNLL-2003, SQuAD), and for the real MiniLM checkpoint on SST-2.

Everything runs in fp32: the report's scores are then our evaluator's on exactly the saved weights.
"""
import json
import math
import os
import pathlib

import numpy as np
import pytest
import torch

from common.errors import CheckpointError
from finetune import cli, config, conll, glue, metrics
from finetune.task_models import conll_word_offsets, median_seed
from tests.conftest import require
from tests.finetune import task_model_checks as checks
from tests.finetune.glue_sample import sst2_argv
from tests.finetune.test_end_to_end import _squad_slice
from tests.finetune.test_families import VOCAB

FAMILIES = ("bert", "albert", "electra", "deberta")
GLUE = ("sst2", "mrpc", "stsb")  # one sentence, a pair, regression
EVAL = 40
# Small slices of the real data; two seeds so that one is chosen (the lower middle of two).
SETTINGS = [
    "seeds=[1,2]",
    *(f"{b}.training.{k}" for b in ("glue", "squad", "conll")
      for k in ("precision=fp32", "epochs=2", "batch_size=16", "lr=5e-4")),
    "glue.training.max_train_examples=64", f"glue.training.max_eval_examples={EVAL}",
    "glue.per_task={stsb: {lr: 0.003}}",  # scores that spread out, so that Pearson and Spearman compare something
    "conll.training.max_train_examples=64", f"conll.training.max_eval_examples={EVAL}",
    "squad.training.max_seq_length=192", "squad.train_file=squad/slice.json", "squad.dev_file=squad/slice.json",
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, shared_data) -> pathlib.Path:
    root = tmp_path_factory.mktemp("task-model-data")
    (root / "glue").mkdir()
    for name in ("SST-2", "MRPC", "STS-B"):
        os.symlink(require(shared_data / "glue" / name, f"GLUE {name}"), root / "glue" / name)
    os.symlink(require(shared_data / "conll2003", "CoNLL-2003"), root / "conll2003")
    (root / "squad").mkdir()
    (root / "squad" / "slice.json").write_text(json.dumps(_squad_slice(shared_data, 16)))
    return root


@pytest.fixture(scope="module")
def tokenizer_dir(bert_vocab, tmp_path_factory) -> pathlib.Path:
    from common.tokenizer import load_tokenizer

    directory = tmp_path_factory.mktemp("tokenizer")
    load_tokenizer(str(bert_vocab), lowercase=True).save(str(directory))
    return directory


def _suite(checkpoint: pathlib.Path, data: pathlib.Path, out: pathlib.Path, tasks: str, settings: list[str]) -> dict:
    argv = ["suite", "--checkpoint", str(checkpoint), "--data", str(data), "--output", str(out), "--tasks", tasks,
            "--save-models"]
    assert cli.main(argv + [a for s in settings for a in ("--set", s)]) == 0
    report = json.loads((out / "report.json").read_text())
    return {"checkpoint": checkpoint, "out": out, "report": report, "settings": settings,
            "by_task": {r["task"]: r for r in report["results"]}}


def _tiny(family: str, directory: pathlib.Path, tokenizer_dir: pathlib.Path) -> None:
    """A tiny random model of ``family`` as test_families exports it, its weights drawn ten times wider than BERT's
    0.02: a narrow tiny encoder gives every sentence nearly the same [CLS] state, and predictions that barely vary
    (an STS-B score alike to 1e-4) would compare little."""
    torch.manual_seed(0)
    size = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, intermediate_size=64, initializer_range=0.2)
    if family == "bert":
        from models.bert.hf import export
        from models.bert.model import BertConfig, BertForPreTraining

        export(BertForPreTraining(BertConfig(num_hidden_layers=2, **size)), directory, tokenizer_dir)
    elif family == "albert":
        from models.albert.hf import export_albert
        from models.albert.model import AlbertForPreTraining, preset

        export_albert(AlbertForPreTraining(preset("albert_tiny", embedding_size=16, inner_group_num=2, **size)),
                      directory, tokenizer_dir)
    elif family == "electra":
        from models.electra.hf import export_discriminator
        from models.electra.model import ElectraConfig, ElectraDiscriminator

        export_discriminator(ElectraDiscriminator(ElectraConfig(embedding_size=16, num_hidden_layers=2, **size)),
                             directory, tokenizer_dir)
    else:
        from models.deberta_v2.hf import export_discriminator
        from models.deberta_v2.model import DebertaV2Config, DebertaV2ForReplacedTokenDetection

        config = DebertaV2Config(num_hidden_layers=2, position_buckets=8, max_relative_positions=32, **size)
        export_discriminator(DebertaV2ForReplacedTokenDetection(config), directory, tokenizer_dir)


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request, data_dir, tokenizer_dir, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp(request.param)
    _tiny(request.param, root / "hf", tokenizer_dir)
    return {"family": request.param, **_suite(root / "hf", data_dir, root / "out", f"{','.join(GLUE)},squad,conll",
                                              SETTINGS)}


@pytest.fixture(scope="module")
def minilm(minilm_dir, data_dir, tmp_path_factory) -> dict:
    settings = ["seeds=[1]", "glue.training.precision=fp32", "glue.training.max_train_examples=256",
                "glue.training.max_eval_examples=96", "glue.training.epochs=1", "glue.training.lr=1e-4"]
    return _suite(minilm_dir, data_dir, tmp_path_factory.mktemp("minilm"), "sst2", settings)


def _run_of(result: dict) -> dict:
    """The report's run of the seed whose model was saved."""
    return next(r for r in result["runs"] if r["seed"] == result["saved_model"]["seed"])


def _directory(suite: dict, task: str) -> pathlib.Path:
    return suite["out"] / suite["by_task"][task]["saved_model"]["path"]


def test_each_task_is_saved_as_the_family_task_class(saved):
    prefix = {"bert": "Bert", "albert": "Albert", "electra": "Electra", "deberta": "DebertaV2"}[saved["family"]]
    expected = {"sst2": "ForSequenceClassification", "mrpc": "ForSequenceClassification",
                "stsb": "ForSequenceClassification", "squad": "ForQuestionAnswering", "conll": "ForTokenClassification"}
    models = saved["out"] / "models"
    assert sorted(p.name for p in models.iterdir()) == sorted(expected)  # the staging area is gone
    for task, suffix in expected.items():
        entry = saved["by_task"]["conll_dev" if task == "conll" else task]["saved_model"]
        assert entry["path"] == f"models/{task}"
        # Two seeds: the lower-scoring one (the lower middle), by the task's main metric.
        scores = {run["seed"]: run["metrics"][entry["metric"]] for run in saved["by_task"][
            "conll_dev" if task == "conll" else task]["runs"]}
        assert entry["seed"] == median_seed(scores) and entry["score"] == scores[entry["seed"]]
        config_json = json.loads((models / task / "config.json").read_text())
        assert config_json["architectures"] == [prefix + suffix]
        files = {p.name for p in (models / task).iterdir()}
        assert {"vocab.txt", "tokenizer_config.json", "model.safetensors"} <= files
    assert saved["by_task"]["conll_test"]["saved_model"] == saved["by_task"]["conll_dev"]["saved_model"]
    conll_config = json.loads((models / "conll" / "config.json").read_text())
    assert conll_config["id2label"] == {str(i): label for i, label in enumerate(conll.LABELS)}
    assert conll_config["label2id"]["B-PER"] == conll.LABELS.index("B-PER")
    stsb = json.loads((models / "stsb" / "config.json").read_text())
    assert stsb["problem_type"] == "regression" and stsb["id2label"] == {"0": "score"}
    markdown = (saved["out"] / "report.md").read_text()
    assert all(f"| `models/{task}` |" in markdown for task in expected)


@pytest.mark.parametrize("task", GLUE)
def test_text_classification_pipeline_gives_our_predictions_and_the_report_scores(saved, data_dir, task):
    examples = glue.read_split(data_dir / "glue", task, "dev")[:EVAL]
    result = saved["by_task"][task]
    mine, theirs, found = checks.glue_parity(_directory(saved, task), saved["checkpoint"], task, examples,
                                             result["training"]["max_seq_length"])
    if glue.TASKS[task].regression:
        assert np.std(mine) > 1e-3, "a regression model whose scores barely vary would compare little"
        np.testing.assert_allclose(theirs, mine, rtol=1e-5, atol=1e-5)
    else:
        assert theirs.tolist() == mine.tolist()
    for key, value in _run_of(result)["metrics"].items():
        assert found[key] == pytest.approx(value, abs=1e-5), key  # the same predictions, to float rounding


def test_token_classification_pipeline_finds_our_entities_and_the_report_f1(saved, data_dir):
    sentences = conll.read_conll(data_dir / "conll2003" / "iob2" / "valid.txt")[:EVAL]
    mine, theirs, entities = checks.conll_parity(_directory(saved, "conll_dev"), saved["checkpoint"], sentences, 128)
    assert sum(len(found) for found in entities) >= 5  # spans to compare, not an all-O model
    assert theirs == mine
    check_conll_scores(saved, sentences, theirs)


def check_conll_scores(suite: dict, sentences: list, tags: list[list[str]]) -> None:
    """conlleval's precision, recall and F1 of the pipeline's ``tags`` are the report's CoNLL dev scores."""
    found = metrics.conll_evaluate([list(s.tags) for s in sentences], tags, scheme="IOB2")
    expected = _run_of(suite["by_task"]["conll_dev"])["metrics"]
    assert (found["precision"], found["recall"], found["f1"]) == pytest.approx(
        (expected["precision"], expected["recall"], expected["f1"]))


def test_question_answering_gives_our_answers_and_the_report_scores(saved, data_dir):
    check_question_answering(saved, data_dir)


def check_question_answering(suite: dict, data_dir: pathlib.Path) -> dict[str, str]:
    """The saved SQuAD model's answers through transformers equal ours within the official normalisation, and
    score the report's EM and F1; our answers, returned."""
    cfg = config.load(cli.DEFAULT_CONFIG, suite["settings"]).squad
    examples, raw = checks.squad_examples(data_dir / "squad" / "slice.json")
    entry = suite["by_task"]["squad"]["saved_model"]
    answers = checks.squad_answers(_directory(suite, "squad"), examples, max_seq_length=cfg.training.max_seq_length,
                                   n_best_size=cfg.n_best_size, max_answer_length=cfg.max_answer_length)
    ours = json.loads((suite["out"] / f"squad-predictions-seed{entry['seed']}.json").read_text())
    assert {q: metrics.normalize_answer(a) for q, a in answers.items()} == {
        q: metrics.normalize_answer(a) for q, a in ours.items()}
    found = metrics.squad_evaluate(raw, answers)
    expected = _run_of(suite["by_task"]["squad"])["metrics"]
    assert (found["exact_match"], found["f1"]) == pytest.approx((expected["exact_match"], expected["f1"]))
    return ours


def test_the_real_minilm_checkpoint_saved_on_sst2_classifies_as_our_evaluator(minilm, data_dir):
    examples = glue.read_split(data_dir / "glue", "sst2", "dev")[:96]
    result = minilm["by_task"]["sst2"]
    mine, theirs, found = checks.glue_parity(_directory(minilm, "sst2"), minilm["checkpoint"], "sst2", examples, 128)
    assert theirs.tolist() == mine.tolist() and len(set(mine.tolist())) == 2
    assert found["accuracy"] == pytest.approx(_run_of(result)["metrics"]["accuracy"])
    assert found["accuracy"] > 0.6  # it learned
    assert result["saved_model"]["seed"] == 1 and "median of 1 seed(s)" in result["saved_model"]["selected_by"]


def test_the_median_seed_is_the_lower_middle_run():
    assert median_seed({1: 0.5, 2: 0.9, 3: 0.7}) == 3
    assert median_seed({1: 0.5, 2: 0.9}) == 1  # even count: the lower of the two middle runs
    assert median_seed({1: 0.8, 2: 0.6, 3: 0.9, 4: 0.7}) == 4
    assert median_seed({1: 0.7, 2: 0.7, 3: 0.7}) == 2  # ties keep the order of the seeds
    assert median_seed({1: math.nan, 2: 0.4, 3: 0.5}) == 2  # a diverged run ranks lowest
    assert median_seed({5: 0.1}) == 5


def test_a_save_seed_outside_the_seeds_is_refused():
    with pytest.raises(ValueError, match=r"save_seed 4 is not one of seeds \[1, 2\]"):
        config.FinetuneConfig(seeds=[1, 2], save_seed=4)


def test_later_pieces_of_a_conll_word_read_as_sub_words():
    # "U.S. playing": u . s . | play ##ing; the pipeline calls a token a sub-word when its text and its span
    # differ in length.
    word_ids = [None, 0, 0, 0, 0, 1, 1, None]
    offsets = [(0, 0), (0, 1), (1, 2), (2, 3), (3, 4), (0, 4), (4, 7), (0, 0)]
    tokens = ["[CLS]", "u", ".", "s", ".", "play", "##ing", "[SEP]"]
    spans = conll_word_offsets(word_ids, offsets, tokens)
    assert spans[1] == (0, 1) and spans[5] == (0, 4)  # first pieces keep their own span
    assert all(end - start != len(tokens[i]) for i, (start, end) in enumerate(spans) if i in (2, 3, 4, 6))
    assert [end for _, end in spans] == [end for _, end in offsets]  # entities still end where their words do


def test_a_diverged_model_is_not_saved_and_the_command_says_so_in_one_line(bert_tiny, tmp_path, capsys):
    out = tmp_path / "out"
    argv = sst2_argv(bert_tiny, out, "--save-models", "--set", "seeds=[3]", "--set", "glue.training.epochs=1",
                     "--set", "glue.training.lr=1e30", "--set", "glue.training.precision=fp32")
    assert cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "task model(s) not saved: sst2 (seed 3)" in lines[0] and "NaN or inf" in lines[0]
    entry = json.loads((out / "report.json").read_text())["results"][0]["saved_model"]
    assert "NaN or inf" in entry["error"] and "path" not in entry
    assert not (out / "models" / "sst2").exists() and "not saved:" in (out / "report.md").read_text()


def test_a_tokenizer_transformers_cannot_be_given_is_refused_before_anything_trains(bert_tiny, shared_data,
                                                                                     tmp_path):
    from common.tokenizer import load_tokenizer
    from finetune.task_models import check_tokenizer
    from preprocess.vocab import train_sentencepiece

    lines = (shared_data / "books" / "austen-emma.txt").read_text().splitlines()
    train_sentencepiece([line for line in lines if line.strip()][:2000], 1000, str(tmp_path / "bpe"),
                        model_type="bpe")
    with pytest.raises(CheckpointError, match="save_models cannot write transformers' tokenizer files: its "
                                              "SentencePiece model is not unigram"):
        check_tokenizer(load_tokenizer(str(tmp_path / "bpe")), bert_tiny)


@pytest.fixture
def bert_tiny(tokenizer_dir, tmp_path) -> pathlib.Path:
    _tiny("bert", tmp_path / "bert", tokenizer_dir)
    return tmp_path / "bert"

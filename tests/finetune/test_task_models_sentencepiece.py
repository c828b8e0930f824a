"""`--save-models` with a SentencePiece tokenizer (ALBERT's and DeBERTa-v3's kind, and the demo's): the task models
carry a transformers tokenizer.json built from the SentencePiece model, AutoTokenizer and the pipelines load them,
and their predictions equal our evaluator's and their scores the report's on SST-2, MRPC, CoNLL-2003 and SQuAD.

As in test_task_models.py (whose data and checks this reuses), tiny random models are finetuned briefly in fp32;
here one seed per task, the choice of seed being tested there.
"""
import json
import pathlib

import pytest
import torch

from finetune import conll, glue
from tests.finetune import task_model_checks as checks
from tests.finetune.test_task_models import (  # noqa: F401 (data_dir: a fixture)
    EVAL,
    SETTINGS,
    _directory,
    _run_of,
    _suite,
    check_conll_scores,
    check_question_answering,
    data_dir,
)

TASKS = ("sst2", "mrpc")


def _tiny(family: str, directory: pathlib.Path, tokenizer_dir: pathlib.Path, vocab_size: int) -> None:
    torch.manual_seed(0)
    size = dict(vocab_size=vocab_size, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                initializer_range=0.2)
    if family == "albert":
        from models.albert.hf import export_albert
        from models.albert.model import AlbertForPreTraining, preset

        export_albert(AlbertForPreTraining(preset("albert_tiny", embedding_size=16, inner_group_num=2, **size)),
                      directory, tokenizer_dir)
    else:
        from models.deberta_v2.hf import export_discriminator
        from models.deberta_v2.model import DebertaV2Config, DebertaV2ForReplacedTokenDetection

        cfg = DebertaV2Config(num_hidden_layers=2, position_buckets=8, max_relative_positions=32, **size)
        export_discriminator(DebertaV2ForReplacedTokenDetection(cfg), directory, tokenizer_dir)


@pytest.fixture(scope="module", params=["albert", "deberta"])
def saved(request, data_dir, books_sentencepiece, tmp_path_factory) -> dict:  # noqa: F811
    from common.tokenizer import load_tokenizer

    root = tmp_path_factory.mktemp(f"{request.param}-sentencepiece")
    _tiny(request.param, root / "hf", books_sentencepiece, load_tokenizer(str(books_sentencepiece)).vocab_size)
    # One seed; CoNLL at a lower rate, or these tiny models all settle on "O" at once, leaving nothing to compare.
    settings = [{"seeds=[1,2]": "seeds=[1]", "conll.training.lr=5e-4": "conll.training.lr=1e-4"}.get(s, s)
                for s in SETTINGS]
    return {"family": request.param,
            **_suite(root / "hf", data_dir, root / "out", f"{','.join(TASKS)},squad,conll", settings)}


def test_each_task_model_carries_a_fast_tokenizer_of_the_sentencepiece_model(saved):
    for task in (*TASKS, "squad", "conll"):
        directory = saved["out"] / "models" / task
        files = {p.name for p in directory.iterdir()}
        assert {"tokenizer.json", "tokenizer_config.json", "model.safetensors", "tokenizer"} <= files
        assert "vocab.txt" not in files
        settings = json.loads((directory / "tokenizer_config.json").read_text())
        assert settings["tokenizer_class"] == "PreTrainedTokenizerFast" and settings["split_special_tokens"]


@pytest.mark.parametrize("task", TASKS)
def test_text_classification_pipeline_gives_our_predictions_and_the_report_scores(saved, data_dir, task):
    examples = glue.read_split(data_dir / "glue", task, "dev")[:EVAL]
    result = saved["by_task"][task]
    mine, theirs, found = checks.glue_parity(_directory(saved, task), saved["checkpoint"], task, examples,
                                             result["training"]["max_seq_length"])
    assert theirs.tolist() == mine.tolist()
    for key, value in _run_of(result)["metrics"].items():
        assert found[key] == pytest.approx(value, abs=1e-5), key


def test_token_classification_pipeline_labels_each_word_as_our_evaluator(saved, data_dir):
    sentences = conll.read_conll(data_dir / "conll2003" / "iob2" / "valid.txt")[:EVAL]
    mine, theirs, labelled = checks.conll_parity_by_tokens(_directory(saved, "conll_dev"), saved["checkpoint"],
                                                           sentences, 128)
    assert sum(tag != "O" for tags in mine for tag in tags) >= 5  # labels to compare, not an all-O model
    assert theirs == mine
    check_conll_scores(saved, sentences, theirs)


def test_question_answering_gives_our_answers_and_the_report_scores(saved, data_dir):
    # A "▁" piece's offsets include the space before its word, so an answer may start with one, which the official
    # normalisation strips.
    ours = check_question_answering(saved, data_dir)
    assert len(set(ours.values())) > 1  # answers that differ between questions

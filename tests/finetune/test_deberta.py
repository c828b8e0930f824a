"""Finetuning reads a DeBERTa-v3 export (config.json model_type deberta-v2) as it reads the other families.

A tiny, randomly initialised discriminator is written by our exporter with bert-base-uncased's vocabulary (what the
tests can build offline; DeBERTa-v3's own is a 128k SentencePiece model); its encoder must give transformers'
``DebertaV2Model`` outputs, its heads those of transformers' ``DebertaV2For{SequenceClassification (ContextPooler),
TokenClassification, QuestionAnswering}``, and ``python -m finetune glue`` must finetune it on the bundled sample.
"""
import json
import math
import pathlib

import pytest
import torch

from finetune import cli, pretrained
from finetune.heads import SequenceClassifier, SpanExtractor, TokenClassifier
from models.attention import Unpadding
from tests.finetune.glue_sample import ONE_SEED_ONE_EPOCH, sst2_argv
from tests.finetune.head_parity import assert_trains_like
from tests.finetune.test_families import VOCAB, _batch, tokenizer_dir  # noqa: F401 (a fixture)


@pytest.fixture(scope="module")
def deberta_dir(tokenizer_dir, tmp_path_factory) -> pathlib.Path:  # noqa: F811
    from models.deberta_v2.hf import export_discriminator
    from models.deberta_v2.model import DebertaV2Config, DebertaV2ForReplacedTokenDetection

    torch.manual_seed(0)
    cfg = DebertaV2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, position_buckets=8, max_relative_positions=32)
    discriminator = DebertaV2ForReplacedTokenDetection(cfg)
    with torch.no_grad():  # a trained pooler-free encoder has non-trivial LayerNorms
        for name, parameter in discriminator.named_parameters():
            if "LayerNorm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    directory = tmp_path_factory.mktemp("deberta") / "hf"
    export_discriminator(discriminator, directory, tokenizer_dir)
    return directory


def test_the_family_comes_from_config_json(deberta_dir):
    assert pretrained.model_type(deberta_dir) == "deberta-v2"
    assert pretrained.resolve(deberta_dir, deberta_dir.parent) == deberta_dir
    tokenizer = pretrained.load_tokenizer_for(deberta_dir)
    assert tokenizer.vocab_size == VOCAB and tokenizer.pad_id == 0
    assert pretrained.load_encoder(deberta_dir).config.hidden_size == 32


@pytest.mark.parametrize("padding_free", [True, False], ids=["padding-free", "padded"])
def test_the_encoder_gives_transformers_automodel_outputs(deberta_dir, padding_free):
    import transformers

    ours = pretrained.load_encoder(deberta_dir).eval()
    theirs = transformers.AutoModel.from_pretrained(str(deberta_dir), torch_dtype=torch.float32).eval()
    assert type(theirs).__name__ == "DebertaV2Model"
    batch = _batch(lengths=(5, 37, 9, 3))  # 37: distances beyond the 4 exact buckets, log-bucketed
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        expected = theirs(**batch).last_hidden_state
        if padding_free:
            unpadding = Unpadding.from_attention_mask(batch["attention_mask"])
            hidden, pooled = ours(unpadding.unpad(batch["input_ids"]), unpadding.unpad(batch["token_type_ids"]),
                                  unpadding=unpadding)
            hidden = unpadding.pad(hidden)
        else:
            hidden, pooled = ours(batch["input_ids"], batch["token_type_ids"], attention_mask=batch["attention_mask"])
    assert pooled is None  # DeBERTa's pooler is the sequence head's
    torch.testing.assert_close(hidden[real], expected[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head", ["sequence", "token", "span"])
def test_heads_give_the_outputs_of_transformers_task_models(deberta_dir, head):
    """Our state dict loads name for name into transformers' DebertaV2 task model (the sequence head's
    ``pooler.dense`` is its ContextPooler) and, training, from the same random state gives the same loss."""
    import transformers

    torch.manual_seed(5)
    encoder = pretrained.load_encoder(deberta_dir)
    batch = _batch()
    if head == "sequence":
        ours, kind = SequenceClassifier(encoder, 3), transformers.AutoModelForSequenceClassification
        targets, options = {"labels": torch.tensor([0, 2, 1, 1])}, {"num_labels": 3}
    elif head == "token":
        ours, kind = TokenClassifier(encoder, 5), transformers.AutoModelForTokenClassification
        labels = torch.randint(0, 5, batch["input_ids"].shape, generator=torch.Generator().manual_seed(2))
        targets, options = {"labels": labels.masked_fill(batch["attention_mask"] == 0, -100)}, {"num_labels": 5}
    else:
        ours, kind = SpanExtractor(encoder), transformers.AutoModelForQuestionAnswering
        targets, options = {"start_positions": torch.tensor([1, 4, 2, 0]),
                            "end_positions": torch.tensor([3, 9, 2, 0])}, {}
    theirs = kind.from_pretrained(str(deberta_dir), torch_dtype=torch.float32, **options)
    assert type(theirs).__name__.startswith("DebertaV2For")
    result = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert not result.missing_keys and not result.unexpected_keys, result
    assert_trains_like(ours, theirs, batch, targets, head)


def test_glue_finetunes_a_deberta_export_and_writes_a_report(deberta_dir, tmp_path):
    out = tmp_path / "report"
    assert cli.main(sst2_argv(deberta_dir, out, *ONE_SEED_ONE_EPOCH)) == 0
    (result,) = json.loads((out / "report.json").read_text())["results"]
    assert result["task"] == "sst2" and result["runs"][0]["steps"] > 0
    assert all(math.isfinite(v) for v in result["mean"].values())

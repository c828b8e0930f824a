"""Finetuning reads Hugging Face BERT, ALBERT and ELECTRA directories alike (config.json's model_type).

Each family's tiny, randomly initialised model is written by its own exporter with bert-base-uncased's
vocabulary; its encoder must give transformers' outputs, its heads the outputs of transformers' task models,
and `python -m finetune glue` must finetune it on the bundled sample and write a report.
"""
import json
import math
import pathlib
import shutil

import pytest
import torch

from common.errors import CheckpointError
from finetune import cli, pretrained
from finetune.heads import SequenceClassifier, SpanExtractor, TokenClassifier, pad_batch
from tests.finetune.glue_sample import ONE_SEED_ONE_EPOCH, SAMPLES, sst2_argv
from tests.finetune.head_parity import assert_trains_like

FAMILIES = ("bert", "albert", "electra")
VOCAB = 30522  # bert-base-uncased


@pytest.fixture(scope="module")
def tokenizer_dir(bert_vocab, tmp_path_factory) -> pathlib.Path:
    from common.tokenizer import load_tokenizer

    directory = tmp_path_factory.mktemp("tokenizer")
    load_tokenizer(str(bert_vocab), lowercase=True).save(str(directory))
    return directory


def _export(family: str, directory: pathlib.Path, tokenizer_dir: pathlib.Path) -> None:
    torch.manual_seed(0)
    if family == "bert":
        from models.bert.hf import export
        from models.bert.model import BertConfig, BertForPreTraining

        export(BertForPreTraining(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=4, intermediate_size=64)), directory, tokenizer_dir)
    elif family == "albert":
        from models.albert.hf import export_albert
        from models.albert.model import AlbertForPreTraining, preset

        # Two layers sharing one group of two inner layers: the sharing is what differs from BERT.
        cfg = preset("albert_tiny", vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_attention_heads=4,
                     intermediate_size=64, inner_group_num=2)
        export_albert(AlbertForPreTraining(cfg), directory, tokenizer_dir)
    else:
        from models.electra.hf import export_discriminator
        from models.electra.model import ElectraConfig, ElectraDiscriminator

        # embedding_size < hidden_size: the encoder projects (embeddings_project), as ELECTRA-small does.
        cfg = ElectraConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=64)
        export_discriminator(ElectraDiscriminator(cfg), directory, tokenizer_dir)


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request, tokenizer_dir, tmp_path_factory) -> tuple[str, pathlib.Path]:
    directory = tmp_path_factory.mktemp(request.param) / "hf"
    _export(request.param, directory, tokenizer_dir)
    return request.param, directory


def _batch(lengths=(5, 17, 9, 3)) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    rows = [{"input_ids": [101, *torch.randint(1000, VOCAB, (n - 2,), generator=generator).tolist(), 102],
             "token_type_ids": [0] * (n // 2) + [1] * (n - n // 2)} for n in lengths]
    return pad_batch(rows, 0)


def test_the_family_comes_from_config_json(family_dir):
    family, directory = family_dir
    assert pretrained.model_type(directory) == family
    assert pretrained.resolve(directory, directory.parent) == directory
    tokenizer = pretrained.load_tokenizer_for(directory)
    assert tokenizer.vocab_size == VOCAB and tokenizer.pad_id == 0
    encoder = pretrained.load_encoder(directory)
    assert encoder.config.hidden_size == 32 == pretrained.load_model_config(directory).hidden_size


@pytest.mark.parametrize("padding_free", [True, False], ids=["padding-free", "padded"])
def test_the_encoder_gives_transformers_automodel_outputs(family_dir, padding_free):
    import transformers  # a dev dependency: a missing install fails here, it is never skipped

    from models.bert.model import Unpadding

    family, directory = family_dir
    ours = pretrained.load_encoder(directory).eval()
    theirs = transformers.AutoModel.from_pretrained(str(directory), torch_dtype=torch.float32).eval()
    assert type(theirs).__name__ == {"bert": "BertModel", "albert": "AlbertModel", "electra": "ElectraModel"}[family]
    batch = _batch()
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        expected = theirs(**batch)
        if padding_free:
            unpadding = Unpadding.from_attention_mask(batch["attention_mask"])
            hidden, pooled = ours(unpadding.unpad(batch["input_ids"]), unpadding.unpad(batch["token_type_ids"]),
                                  unpadding=unpadding)
            hidden = unpadding.pad(hidden)
        else:
            hidden, pooled = ours(batch["input_ids"], batch["token_type_ids"], attention_mask=batch["attention_mask"])
    torch.testing.assert_close(hidden[real], expected.last_hidden_state[real], rtol=1e-5, atol=1e-5)
    if family == "electra":
        assert pooled is None  # ELECTRA has no pooler
    else:
        torch.testing.assert_close(pooled, expected.pooler_output, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head", ["sequence", "token", "span"])
def test_heads_give_the_outputs_of_transformers_task_models(family_dir, head):
    """Our state dict loads name for name into the family's transformers task model (ELECTRA's sequence head is
    its ElectraClassificationHead), and in training mode from the same random state gives the same loss."""
    import transformers

    family, directory = family_dir
    torch.manual_seed(5)
    encoder = pretrained.load_encoder(directory)
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
    theirs = kind.from_pretrained(str(directory), torch_dtype=torch.float32, **options)
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    # transformers' BERT token and span models have no pooler; ours keeps the checkpoint's (unused by those heads)
    assert not missing and all(".pooler." in k for k in unexpected), (missing, unexpected)
    # ALBERT's FFN dropout sits where google-research/albert puts it (transformers never applies it): equal only
    # at the exported dropout, 0, where the two agree; the classifier dropout is on for every family.
    assert family != "albert" or encoder.config.hidden_dropout_prob == 0.0
    assert_trains_like(ours, theirs, batch, targets, head)


@pytest.mark.parametrize("head", ["sequence", "token", "span"])
def test_padding_free_and_padded_heads_agree(family_dir, head):
    _, directory = family_dir
    batch = _batch()
    outputs = []
    for padding_free in (True, False):
        torch.manual_seed(3)  # the same head weights both times
        encoder = pretrained.load_encoder(directory)
        model = {"sequence": lambda: SequenceClassifier(encoder, 2, padding_free=padding_free),
                 "token": lambda: TokenClassifier(encoder, 4, padding_free=padding_free),
                 "span": lambda: SpanExtractor(encoder, padding_free=padding_free)}[head]().eval()
        with torch.no_grad():
            result = model(**batch)
        outputs.append(result if isinstance(result, tuple) else (result,))
    real = batch["attention_mask"].bool()
    for free, padded in zip(*outputs):
        if head == "sequence":
            torch.testing.assert_close(free, padded, rtol=1e-5, atol=1e-5)
        else:
            torch.testing.assert_close(free[real], padded[real], rtol=1e-5, atol=1e-5)


def test_glue_finetunes_the_family_and_writes_a_report(family_dir, tmp_path):
    family, directory = family_dir
    out = tmp_path / "report"
    assert cli.main(sst2_argv(directory, out, *ONE_SEED_ONE_EPOCH)) == 0
    report = json.loads((out / "report.json").read_text())
    (result,) = report["results"]
    assert result["task"] == "sst2" and result["seeds"] == [3] and result["runs"][0]["steps"] > 0
    assert result["train_examples"] == 224 and result["eval_examples"] == 64
    assert 0.0 <= result["mean"]["accuracy"] <= 1.0 and all(math.isfinite(v) for v in result["mean"].values())
    assert report["checkpoint"] == str(directory) and (out / "report.md").is_file()


def test_an_unknown_model_type_is_refused_in_one_line(family_dir, tmp_path, capsys):
    _, directory = family_dir
    other = tmp_path / "roberta"
    shutil.copytree(directory, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "roberta"}))
    with pytest.raises(CheckpointError, match=r"config\.json: model_type 'roberta' cannot be finetuned here"):
        pretrained.load_encoder(other)
    assert cli.main(sst2_argv(other, tmp_path / "out")) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(other / "config.json") in lines[0] and "'roberta'" in lines[0], lines
    assert not (tmp_path / "out" / "report.json").exists()
    with pytest.raises(CheckpointError,
                       match="no config.json; pass a Hugging Face bert, albert, deberta-v2, electra directory"):
        pretrained.load_encoder(tmp_path)


def _sentencepiece(path: pathlib.Path, pad: str, unk: str) -> None:
    import sentencepiece as spm

    text = (SAMPLES / "books" / "the-voyage-of-the-marigold.txt").read_text().splitlines()
    with open(path, "wb") as handle:
        spm.SentencePieceTrainer.Train(sentence_iterator=iter([line for line in text if line.strip()]),
                                       model_writer=handle, vocab_size=200, pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
                                       pad_piece=pad, unk_piece=unk, control_symbols=["[CLS]", "[SEP]", "[MASK]"],
                                       num_threads=1, minloglevel=2)


def test_an_albert_directory_with_only_spiece_model_reads_it(tmp_path):
    from common.errors import InputError
    from models.albert.hf import export_albert
    from models.albert.model import AlbertForPreTraining, preset

    directory = tmp_path / "albert"
    export_albert(AlbertForPreTraining(preset("albert_tiny", vocab_size=200)), directory)  # no tokenizer
    _sentencepiece(directory / "spiece.model", "[PAD]", "[UNK]")
    tokenizer = pretrained.load_tokenizer_for(directory)
    assert tokenizer.kind == "sentencepiece" and tokenizer.vocab_size == 200 and tokenizer.pad_id == 0
    # Google's releases name the pieces <pad> and <unk>: refused, naming the file and what it lacks.
    _sentencepiece(directory / "spiece.model", "<pad>", "<unk>")
    with pytest.raises(InputError, match=r"spiece\.model: the sentencepiece vocabulary lacks the BERT special "
                                         r"token\(s\) \[PAD\], \[UNK\]"):
        pretrained.load_tokenizer_for(directory)

"""models.vocab_growth and pretrain.grow_vocab: domain words into [unusedN] slots first, then appended; ids of every
other word unchanged; new rows the mean of the old pieces' rows; the result loads in transformers."""
from __future__ import annotations

import json

import pytest
import torch

from common import tokenizer as tok
from common.errors import InputError
from models import vocab_growth
from pretrain import grow_vocab


@pytest.fixture(scope="module")
def bert(minilm_dir):
    return tok.load_tokenizer(str(minilm_dir / "vocab.txt"))


def test_new_words_take_the_unused_slots_and_nothing_else_moves(bert):
    growth = vocab_growth.plan_growth(bert, ["asyncio", "kwargs", "Coroutine", "python", "asyncio"])
    assert growth.words == ("asyncio", "kwargs", "coroutine") and growth.skipped == ("python",)
    assert growth.ids == (1, 2, 3) and growth.reused_slots == 3 and growth.new_size == bert.vocab_size == 30522
    assert [bert.id_to_token(i) for i in growth.ids] == ["[unused0]", "[unused1]", "[unused2]"]
    assert growth.pieces[0] == tuple(bert.encode("asyncio")) and len(growth.pieces[0]) > 1
    grown = bert.with_tokens(list(growth.tokens))
    assert grown.encode("asyncio kwargs") == [1, 2]
    text = "The interpreter reads the source file and runs each statement in turn."
    assert grown.encode(text) == bert.encode(text)
    assert all(growth.tokens[i] == bert.id_to_token(i) for i in range(bert.vocab_size) if i not in growth.ids)
    assert growth.describe() == ("added 3 word(s) (3 in [unused] slots, 0 appended), vocabulary 30,522 -> 30,522; "
                                 "1 already in it")


def test_words_past_the_unused_slots_are_appended(tmp_path):
    vocab = ["[PAD]", "[unused1]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "##a", "##b",
             "##c"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    small = tok.load_tokenizer(str(tmp_path / "vocab.txt"))
    growth = vocab_growth.plan_growth(small, ["abc", "cab", "bca"])
    assert growth.ids == (2, 1, 13) and growth.reused_slots == 2 and growth.new_size == 14  # [unused0] first
    assert growth.describe().startswith("added 3 word(s) (2 in [unused] slots, 1 appended), vocabulary 13 -> 14")
    assert small.with_tokens(list(growth.tokens)).encode("bca abc") == [13, 2]


def test_a_phrase_is_refused_in_one_line(bert):
    with pytest.raises(InputError, match="'async io' is 2 words to this tokenizer"):
        vocab_growth.plan_growth(bert, ["async io"])


def test_grown_rows_are_the_mean_of_the_old_pieces_rows(bert):
    growth = vocab_growth.plan_growth(bert, ["asyncio", "kwargs"])
    growth = vocab_growth.Growth(growth.words, (growth.ids[0], bert.vocab_size), growth.pieces,
                                 growth.tokens + ("kwargs",), growth.old_size, 1, ())  # one slot, one appended
    generator = torch.Generator().manual_seed(0)
    state = {"bert.embeddings.word_embeddings.weight": torch.randn(bert.vocab_size, 8, generator=generator),
             "cls.predictions.bias": torch.randn(bert.vocab_size, generator=generator),
             "bert.embeddings.position_embeddings.weight": torch.randn(512, 8, generator=generator)}
    grown = vocab_growth.grow_weights(state, growth)
    embeddings = grown["bert.embeddings.word_embeddings.weight"]
    assert embeddings.shape == (bert.vocab_size + 1, 8) and grown["cls.predictions.bias"].shape == (bert.vocab_size + 1,)
    for word_id, pieces in zip(growth.ids, growth.pieces):
        old = state["bert.embeddings.word_embeddings.weight"][list(pieces)].mean(0)
        assert torch.allclose(embeddings[word_id], old)
        assert torch.allclose(grown["cls.predictions.bias"][word_id], state["cls.predictions.bias"][list(pieces)].mean())
    others = [i for i in range(bert.vocab_size) if i not in growth.ids]
    assert torch.equal(embeddings[others], state["bert.embeddings.word_embeddings.weight"][others])
    assert grown["bert.embeddings.position_embeddings.weight"] is state["bert.embeddings.position_embeddings.weight"]
    with pytest.raises(InputError, match="no tensor of the checkpoint has 30,522 rows"):
        vocab_growth.grow_weights({"x.word_embeddings.weight": torch.zeros(10, 2)}, growth)


def test_the_corpus_words_are_the_frequent_ones_cut_into_pieces(bert, shared_data):
    docs = sorted((shared_data / "python-docs").rglob("*.rst.txt"))[:40]
    found = vocab_growth.frequent_split_words(bert, grow_vocab.corpus_lines(docs), top=30, min_pieces=3)
    assert len(found) == 30 and [c for _, c, _ in found] == sorted((c for _, c, _ in found), reverse=True)
    assert all(n >= 3 and c >= 5 and bert.token_to_id(w) is None for w, c, n in found)
    assert all(len(bert.encode(w)) == n for w, _, n in found)


def test_the_grown_checkpoint_loads_in_transformers_with_the_old_ids_kept(minilm_dir, bert, tmp_path, shared_data):
    from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertForMaskedLM

    source = tmp_path / "small-bert"
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=bert.vocab_size, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=64, max_position_embeddings=128))
    model.save_pretrained(source)
    (source / "vocab.txt").write_bytes((minilm_dir / "vocab.txt").read_bytes())
    (source / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    words = tmp_path / "words.txt"
    words.write_text("asyncio\nkwargs\ncoroutine\n")
    out = tmp_path / "grown"
    assert grow_vocab.main(["--model", str(source), "--output", str(out), "--words", str(words)]) == 0
    record = json.loads((out / "vocab_growth.json").read_text())
    assert [w["word"] for w in record["words"]] == ["asyncio", "kwargs", "coroutine"]
    assert record["words"][0]["old_pieces"] == [bert.id_to_token(i) for i in bert.encode("asyncio")]
    loaded_tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert loaded_tokenizer("asyncio kwargs", add_special_tokens=False)["input_ids"] == [1, 2]
    text = (shared_data / "python-docs" / "glossary.rst.txt").read_text()[:3000]
    assert loaded_tokenizer(text, add_special_tokens=False)["input_ids"] == bert.encode(text)  # no new word in it
    grown = AutoModelForMaskedLM.from_pretrained(str(out))
    old_rows = model.bert.embeddings.word_embeddings.weight.detach()
    new_rows = grown.bert.embeddings.word_embeddings.weight.detach()
    assert torch.allclose(new_rows[1], old_rows[bert.encode("asyncio")].mean(0), atol=1e-6)
    assert torch.equal(new_rows[1000:], old_rows[1000:])
    assert grown.cls.predictions.decoder.weight.data_ptr() == grown.bert.embeddings.word_embeddings.weight.data_ptr()
    assert tok.load_tokenizer(str(out / "tokenizer")).encode("asyncio") == [1]


def test_the_command_refuses_a_directory_without_a_tokenizer_in_one_line(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    words = tmp_path / "words.txt"
    words.write_text("asyncio\n")
    assert grow_vocab.main(["--model", str(tmp_path / "model"), "--output", str(tmp_path / "out"), "--words",
                            str(words)]) == 2
    assert "no tokenizer" in capsys.readouterr().err

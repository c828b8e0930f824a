"""common.tokenizer_hf: a Hugging Face tokenizer.json as a tokenizer, with the ids AutoTokenizer gives on real text
of every task, as written by save_pretrained (transformers 5 writes no vocab.txt), saved, pickled and exported."""
from __future__ import annotations

import json
import pickle
import shutil

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, trainers

from common import tokenizer as tok
from common.errors import InputError
from common.tokenizer_hf import FILE_NAME, HuggingFaceTokenizer
from models import hf_tokenizer

BERT_SPECIALS = list(tok.SPECIAL_TOKENS)


@pytest.fixture(scope="module")
def real_texts(shared_data) -> list[str]:
    """Text of every task's real data: SQuAD contexts and questions, GLUE sentences, CoNLL sentences, Python docs."""
    squad = json.loads((shared_data / "squad" / "dev-v1.1.json").read_text())
    texts = []
    for article in squad["data"][:3]:
        for paragraph in article["paragraphs"][:10]:
            texts.append(paragraph["context"])
            texts += [qa["question"] for qa in paragraph["qas"][:3]]
    for tsv in sorted((shared_data / "glue").glob("*/dev.tsv"))[:4]:
        texts += [max(line.split("\t"), key=len) for line in tsv.read_text().splitlines()[1:60]]  # the sentence
    conll = shared_data / "conll2003" / "iob2" / "test.txt"
    words = [line.split()[0] for line in conll.read_text().splitlines()[:3000] if line.strip() and " " in line]
    texts += [" ".join(words[i:i + 40]) for i in range(0, len(words), 40)]
    docs = sorted((shared_data / "python-docs").rglob("*.rst.txt"))[:3]
    texts += [doc.read_text(errors="replace")[:4000] for doc in docs]
    texts.append("Ünïcödé naïve café — 東京 and a URL https://example.org/x?y=1 " + "x" * 150)  # a word of 150
    return [text for text in texts if text.strip()]


def test_a_bert_tokenizer_json_gives_autotokenizers_ids_on_every_tasks_text(minilm_dir, real_texts):
    from transformers import AutoTokenizer

    ours = tok.load_tokenizer(str(minilm_dir / "tokenizer.json"))
    theirs = AutoTokenizer.from_pretrained(str(minilm_dir))
    assert isinstance(ours, HuggingFaceTokenizer) and ours.kind == "huggingface" and ours.lowercase
    assert ours.special_ids == {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
    for text in real_texts:
        assert ours.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text[:80]
    assert ours.encode_batch(real_texts) == [ours.encode(text) for text in real_texts]
    ids, spans = ours.encode_with_offsets(real_texts[0])
    assert ids == ours.encode(real_texts[0]) and len(spans) == len(ids)
    wordpiece = tok.load_tokenizer(str(minilm_dir / "vocab.txt"))  # the same vocabulary as a vocab.txt
    assert ours.identity()["vocab_sha256"] == wordpiece.identity()["vocab_sha256"]
    assert (ours.is_continuation == wordpiece.is_continuation).all()
    assert (ours.replacement_ids == wordpiece.replacement_ids).all()


def test_a_transformers_5_directory_without_vocab_txt_is_read_and_finetuning_finds_its_tokenizer(minilm_dir,
                                                                                                  tmp_path):
    from finetune.pretrained import load_tokenizer_for

    directory = tmp_path / "minilm-saved-by-transformers-5"
    directory.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(minilm_dir / name, directory / name)
    assert tok.load_tokenizer(str(directory)).kind == "huggingface"
    found = load_tokenizer_for(directory)
    assert found.kind == "huggingface" and found.vocab_size == 30522 and found.pad_id == 0


def test_saved_pickled_and_exported_it_stays_the_same_tokenizer(minilm_dir, tmp_path, real_texts):
    from transformers import AutoTokenizer

    ours = tok.load_tokenizer(str(minilm_dir / "tokenizer.json"))
    saved = tmp_path / "tokenizer"
    ours.save(str(saved))
    assert sorted(p.name for p in saved.iterdir()) == sorted([FILE_NAME, tok.META_FILE])
    again = tok.load_tokenizer(str(saved))
    assert again.identity() == ours.identity() and again.encode(real_texts[0]) == ours.encode(real_texts[0])
    assert pickle.loads(pickle.dumps(ours)).encode(real_texts[1]) == ours.encode(real_texts[1])
    exported = tmp_path / "hf"
    exported.mkdir()
    assert hf_tokenizer.write_tokenizer_files(saved, exported, max_length=128)
    loaded = AutoTokenizer.from_pretrained(str(exported))
    for text in real_texts[:20]:
        assert loaded(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    assert loaded("a b")["input_ids"][0] == ours.cls_id and loaded("a b")["input_ids"][-1] == ours.sep_id


def _byte_level_bpe(texts: list[str], specials: list[str]) -> HFTokenizer:
    from tokenizers import decoders

    bpe = HFTokenizer(models.BPE(unk_token=specials[1] if len(specials) > 1 else None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return bpe


def test_a_byte_level_bpe_file_masks_whole_words_by_its_word_starts(real_texts, tmp_path):
    bpe = _byte_level_bpe(real_texts, BERT_SPECIALS)
    path = tmp_path / "bpe.json"
    bpe.save(str(path))
    ours = tok.load_tokenizer(str(path))
    for text in real_texts[:30]:
        assert ours.encode(text) == bpe.encode(text, add_special_tokens=False).ids
    ids = ours.encode(" unbelievably comfortable")
    pieces = [ours.id_to_token(i) for i in ids]
    assert [ours.is_continuation[i] for i in ids] == [not p.startswith("\u0120") for p in pieces]
    assert not ours.is_continuation[list(ours.special_ids.values())].any()
    assert not set(ours.special_ids.values()) & set(ours.replacement_ids.tolist())


def test_a_roberta_style_file_is_refused_in_one_line_naming_its_tokens(real_texts, tmp_path):
    path = tmp_path / "roberta.json"
    _byte_level_bpe(real_texts, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]).save(str(path))
    with pytest.raises(InputError, match=r"roberta.json: .*lacks the BERT special token.*<mask>.*not supported yet")\
            as raised:
        tok.load_tokenizer(str(path))
    assert "\n" not in str(raised.value)
    path.write_text('{"model": {"type": "WordPiece"}, "version": "1.0"')  # truncated
    with pytest.raises(InputError, match="not a Hugging Face tokenizer file"):
        tok.load_tokenizer(str(path))

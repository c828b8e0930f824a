"""transformers' tokenizer files written from ours (``models.hf_tokenizer``): AutoTokenizer must give the ids our
stages give, on real text of every task, for a SentencePiece model as for a WordPiece vocabulary."""
import json

import pytest

from common.tokenizer import load_tokenizer
from finetune import conll, glue, squad
from finetune.suite import pair_features
from models.hf_tokenizer import unwritable_reason, write_tokenizer_files
from preprocess.vocab import train_sentencepiece

# Text our tokenizers are not often shown: whitespace runs and tabs, literal special tokens, compatibility forms that
# NFKC folds, a zero-width space, scripts and symbols outside the vocabulary (byte fallback), empty text.
AWKWARD = ["  leading,  double  spaces\t and a tab ", "[CLS] a literal [MASK] and [SEP] [PAD] [UNK]",
           "Ünïcödé ｆｕｌｌｗｉｄｔｈ ① ﬁ", "zero\u200bwidth", "日本語のテキスト", "emoji 😀 here", "a\nnew line", ""]


@pytest.fixture(scope="module")
def real_text(shared_data) -> dict:
    """Dev text of GLUE (single sentences and pairs), SQuAD (questions and contexts) and CoNLL-2003 (words)."""
    pairs = []
    for task in ("sst2", "mrpc", "stsb", "rte"):
        pairs += [(e.text_a, e.text_b) for e in glue.read_split(shared_data / "glue", task, "dev")[:150]]
    examples, _ = squad.load_squad_json(str(shared_data / "squad" / "dev-v1.1.json"))
    pairs += [(e.question, e.context) for e in examples[:100]]
    sentences = conll.read_conll(shared_data / "conll2003" / "iob2" / "valid.txt")[:300]
    return {"pairs": pairs, "sentences": [list(s.words) for s in sentences]}


def _auto(tokenizer_dir, tmp_path, max_length=512):
    import transformers

    write_tokenizer_files(tokenizer_dir, tmp_path, max_length=max_length)
    return transformers.AutoTokenizer.from_pretrained(str(tmp_path))


@pytest.fixture(params=["sentencepiece", "sentencepiece-lowercase", "wordpiece"])
def tokenizer_dir(request, books_sentencepiece, bert_vocab, shared_data, tmp_path_factory):
    if request.param == "sentencepiece":
        return books_sentencepiece
    directory = tmp_path_factory.mktemp(request.param)
    if request.param == "wordpiece":
        load_tokenizer(str(bert_vocab), lowercase=True).save(str(directory))
    else:
        lines = (shared_data / "books" / "austen-emma.txt").read_text().splitlines()
        train_sentencepiece([line for line in lines if line.strip()][:3000], 2000, str(directory), lowercase=True)
    return directory


def test_auto_tokenizer_gives_our_ids_on_every_task(tokenizer_dir, real_text, tmp_path):
    ours = load_tokenizer(str(tokenizer_dir))
    theirs = _auto(tokenizer_dir, tmp_path)
    texts = [t for pair in real_text["pairs"] for t in pair if t is not None] + AWKWARD
    assert [theirs(t, add_special_tokens=False)["input_ids"] for t in texts] == [ours.encode(t) for t in texts]
    cut = 0
    for a, b in real_text["pairs"]:  # BERT's [CLS] a [SEP] b [SEP], its types, the longer side cut first
        expected = pair_features(ours, a, b, 65)
        found = theirs(a, b, truncation=True, max_length=65)
        assert (found["input_ids"], found["token_type_ids"]) == (expected["input_ids"], expected["token_type_ids"])
        cut += len(ours.encode(a)) + len(ours.encode(b or "")) > 62
    assert cut >= 50  # pairs over the budget (SQuAD's contexts, long MRPC and RTE pairs) were compared


def test_transformers_gives_the_odd_token_of_an_evenly_cut_pair_to_the_longer_text(tokenizer_dir, real_text,
                                                                                    tmp_path):
    """Where both texts of a pair must be cut and the budget is odd, run_classifier.py (and we) give the odd token
    to the first text, transformers to the text that was longer: the one difference, documented in
    docs/finetuning.md."""
    ours = load_tokenizer(str(tokenizer_dir))
    theirs = _auto(tokenizer_dir, tmp_path)
    both_cut = 0
    for a, b in real_text["pairs"]:
        expected = pair_features(ours, a, b, 64)  # 61 tokens of text
        found = theirs(a, b, truncation=True, max_length=64)["token_type_ids"]
        first = len(expected["token_type_ids"]) - sum(expected["token_type_ids"]) - 2
        if b is None or min(len(ours.encode(a)), len(ours.encode(b))) <= 30:
            assert theirs(a, b, truncation=True, max_length=64)["input_ids"] == expected["input_ids"]
            continue
        both_cut += 1
        assert first == 31 and len(found) - sum(found) - 2 == (31 if len(ours.encode(a)) > len(ours.encode(b)) else 30)
    assert both_cut >= 5


    for words in real_text["sentences"]:  # CoNLL: each word encoded on its own, as our evaluation reads it
        expected = conll.encode_sentence(words, ours, 512)["input_ids"]
        found = theirs(words, is_split_into_words=True)["input_ids"]
        assert found == expected


def test_the_special_tokens_are_ours_and_never_read_from_text(books_sentencepiece, tmp_path):
    ours = load_tokenizer(str(books_sentencepiece))
    theirs = _auto(books_sentencepiece, tmp_path, max_length=128)
    assert type(theirs).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend") and theirs.is_fast
    assert (theirs.pad_token_id, theirs.unk_token_id, theirs.cls_token_id, theirs.sep_token_id,
            theirs.mask_token_id) == (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id)
    assert theirs.model_max_length == 128
    literal = theirs("[MASK]", add_special_tokens=False)["input_ids"]
    assert ours.mask_id not in literal and literal == ours.encode("[MASK]")
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert settings["tokenizer_class"] == "PreTrainedTokenizerFast" and not (tmp_path / "vocab.txt").exists()


def test_a_sentencepiece_bpe_model_is_named_unwritable(shared_data, tmp_path):
    lines = (shared_data / "books" / "austen-emma.txt").read_text().splitlines()
    train_sentencepiece([line for line in lines if line.strip()][:2000], 1000, str(tmp_path / "bpe"),
                        model_type="bpe")
    assert "not unigram" in unwritable_reason(tmp_path / "bpe")
    (tmp_path / "out").mkdir()
    assert not write_tokenizer_files(tmp_path / "bpe", tmp_path / "out", max_length=128)
    assert not any((tmp_path / "out").iterdir())  # an export then carries only our tokenizer/

"""CoNLL-2003 reading, IOB1/IOB2 conversion and sub-token alignment (finetune/conll.py).

The six real files (IOB2 release and original IOB1 release) are parsed once per module; the
alignment tests use the real bert-base-uncased vocabulary.
"""
import pytest

from common.tokenizer import load_tokenizer
from finetune import conll
from finetune.errors import DataError

# file -> (sentences, tokens), from PROVENANCE.md; each IOB2 file is paired with its original IOB1 file.
EXPECTED = {
    "iob2/train.txt": (14041, 203621), "original_iob1/eng.train": (14041, 203621),
    "iob2/valid.txt": (3250, 51362), "original_iob1/eng.testa": (3250, 51362),
    "iob2/test.txt": (3453, 46435), "original_iob1/eng.testb": (3453, 46435),
}
PAIRS = [("iob2/train.txt", "original_iob1/eng.train"), ("iob2/valid.txt", "original_iob1/eng.testa"),
         ("iob2/test.txt", "original_iob1/eng.testb")]


@pytest.fixture(scope="module")
def corpus(shared_data):
    return {name: conll.read_conll(shared_data / "conll2003" / name) for name in EXPECTED}


@pytest.fixture(scope="module")
def tokenizer(bert_vocab):
    return load_tokenizer(str(bert_vocab))


def entity_spans(tags, scheme):
    """(type, start, end) of every entity, read the way conlleval reads the given scheme."""
    tags = list(tags) if scheme == "IOB2" else conll.iob1_to_iob2(tags)
    spans, start = [], None
    for i, tag in enumerate([*tags, "O"]):
        if start is not None and not tag.startswith("I-"):
            spans.append((tags[start][2:], start, i))
            start = None
        if tag.startswith("B-"):
            start = i
    return spans


# --------------------------------------------------------------------------- the real files


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sentence_and_token_counts_match_provenance(corpus, name):
    sentences = corpus[name]
    assert (len(sentences), sum(len(s.words) for s in sentences)) == EXPECTED[name]
    assert all(len(s.words) == len(s.tags) > 0 for s in sentences)
    assert not any("-DOCSTART-" in s.words for s in sentences)


@pytest.mark.parametrize("iob2, iob1", PAIRS)
def test_scheme_is_detected(corpus, iob2, iob1):
    assert conll.detect_scheme(corpus[iob2]) == "IOB2"
    assert conll.detect_scheme(corpus[iob1]) == "IOB1"


@pytest.mark.parametrize("iob2, iob1", PAIRS)
def test_converting_the_original_gives_the_iob2_release(corpus, iob2, iob1):
    # The two releases hold the same words sentence by sentence, so tags can be compared exactly.
    assert [s.words for s in corpus[iob1]] == [s.words for s in corpus[iob2]]
    converted = [conll.iob1_to_iob2(s.tags) for s in corpus[iob1]]
    assert converted == [list(s.tags) for s in corpus[iob2]]


@pytest.mark.parametrize("iob2, iob1", PAIRS)
def test_iob2_round_trips_through_iob1(corpus, iob2, iob1):
    assert all(conll.iob1_to_iob2(conll.iob2_to_iob1(s.tags)) == list(s.tags) for s in corpus[iob2])


@pytest.mark.parametrize("name", ["original_iob1/eng.testa", "original_iob1/eng.testb"])
def test_original_evaluation_files_round_trip_exactly(corpus, name):
    assert all(conll.iob2_to_iob1(conll.iob1_to_iob2(s.tags)) == list(s.tags) for s in corpus[name])


def test_original_train_round_trips_but_for_two_redundant_b_tags(corpus):
    # eng.train has two B-MISC right after O ("Atlanta Games", "Urdu-speaking Moslems"): IOB1 writes
    # B- only between two adjacent entities of one type, so these are annotation slips. They mean the
    # same entity as I-MISC would, so the round trip changes the tag but not the entities.
    changed = []
    for sentence in corpus["original_iob1/eng.train"]:
        back = conll.iob2_to_iob1(conll.iob1_to_iob2(sentence.tags))
        assert entity_spans(back, "IOB1") == entity_spans(sentence.tags, "IOB1")
        changed += [(word, old, new) for word, old, new in zip(sentence.words, sentence.tags, back) if old != new]
    assert changed == [("Atlanta", "B-MISC", "I-MISC"), ("Urdu-speaking", "B-MISC", "I-MISC")]


def test_every_tag_is_a_training_label(corpus):
    for name, sentences in corpus.items():
        assert {tag for s in sentences for tag in s.tags} <= set(conll.LABELS), name


# --------------------------------------------------------------------------- conversions, by hand


def test_conversions_on_adjacent_entities():
    iob1 = ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG", "I-ORG", "O", "I-MISC"]
    iob2 = ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG", "I-ORG", "O", "B-MISC"]
    assert conll.iob1_to_iob2(iob1) == iob2
    assert conll.iob2_to_iob1(iob2) == iob1
    assert conll.detect_scheme([conll.Sentence(words=tuple("abcdefghi"), tags=tuple(iob1))]) == "IOB1"
    assert conll.detect_scheme([conll.Sentence(words=tuple("abcdefghi"), tags=tuple(iob2))]) == "IOB2"
    assert conll.detect_scheme([conll.Sentence(words=("a",), tags=("O",))]) == "IOB2"


def test_ill_formed_model_output_converts_without_losing_entities():
    predicted = ["O", "I-PER", "I-LOC", "B-LOC", "I-LOC"]  # IOB2 never starts with I-, a model may
    assert conll.iob2_to_iob1(predicted) == ["O", "I-PER", "I-LOC", "B-LOC", "I-LOC"]


# --------------------------------------------------------------------------- reading, small files


def test_reader_skips_document_markers_and_keeps_an_unterminated_last_sentence(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n\n"
                    "-DOCSTART- -X- -X- O\nPeter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n\n"
                    "BRUSSELS NNP B-NP B-LOC", encoding="utf-8")
    assert conll.read_conll(path) == [
        conll.Sentence(words=("EU", "rejects"), tags=("B-ORG", "O")),
        conll.Sentence(words=("Peter", "Blackburn"), tags=("B-PER", "I-PER")),
        conll.Sentence(words=("BRUSSELS",), tags=("B-LOC",)),
    ]


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match=rf"{tmp_path / 'eng.train'} not found: expected a CoNLL-2003"):
        conll.read_conll(tmp_path / "eng.train")


def test_unknown_tag_names_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP B-PRODUCT\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{path}, line 2: NER tag 'B-PRODUCT' is not one of O, B-PER"):
        conll.read_conll(path)


def test_line_without_a_tag_names_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("EU NNP B-NP B-ORG\nrejects\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{path}, line 2: expected a word and its NER tag"):
        conll.read_conll(path)


# --------------------------------------------------------------------------- sub-token alignment


def test_labels_sit_on_first_sub_tokens_and_predictions_map_back(corpus, tokenizer):
    label_index = {label: i for i, label in enumerate(conll.LABELS)}
    split_words = 0
    for sentence in corpus["iob2/valid.txt"][:300]:
        encoded = conll.encode_sentence(sentence.words, tokenizer, max_seq_length=512)
        ids, starts = encoded["input_ids"], encoded["word_starts"]
        assert ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id
        assert encoded["token_type_ids"] == [0] * len(ids)
        # Each word's sub-tokens are exactly its own encoding, laid end to end.
        ends = [*starts[1:], len(ids) - 1]
        for word, start, end in zip(sentence.words, starts, ends):
            assert ids[start:end] == (tokenizer.encode(word) or [tokenizer.unk_id])
            split_words += end - start > 1
        word_labels = [label_index[t] for t in sentence.tags]
        targets = conll.label_ids(word_labels, starts, len(ids))
        assert [i for i, t in enumerate(targets) if t != -100] == starts
        tags_per_token = [conll.LABELS[t] if t != -100 else "B-MISC" for t in targets]  # filler never read
        assert conll.words_from_token_predictions(tags_per_token, starts) == list(sentence.tags)
        assert conll.words_from_token_predictions(targets, starts, outside=0) == word_labels
    assert split_words > 100  # the check above met many multi-piece words


def test_truncated_words_get_no_label_and_predict_o(tokenizer):
    words = ["Peter", "Blackburn", "visited", "Brussels", "yesterday"]
    encoded = conll.encode_sentence(words, tokenizer, max_seq_length=5)
    assert len(encoded["input_ids"]) == 5 and encoded["input_ids"][-1] == tokenizer.sep_id
    kept = [s for s in encoded["word_starts"] if s >= 0]
    assert encoded["word_starts"][len(kept):] == [-1] * (len(words) - len(kept)) and len(kept) >= 2
    targets = conll.label_ids([1, 2, 0, 5, 0], encoded["word_starts"], 5)
    assert targets[0] == targets[-1] == -100 and sum(t != -100 for t in targets) == len(kept)
    predicted = conll.words_from_token_predictions(["B-LOC"] * 5, encoded["word_starts"])
    assert predicted == ["B-LOC"] * len(kept) + ["O"] * (len(words) - len(kept))


def test_word_without_pieces_becomes_unk(tokenizer):
    assert tokenizer.encode("\u200b") == []  # a zero-width space normalizes away
    encoded = conll.encode_sentence(["a", "\u200b", "b"], tokenizer, max_seq_length=16)
    assert encoded["word_starts"] == [1, 2, 3]
    assert encoded["input_ids"][2] == tokenizer.unk_id


def test_label_ids_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="2 labels for 3 words"):
        conll.label_ids([0, 1], [1, 2, 3], 5)

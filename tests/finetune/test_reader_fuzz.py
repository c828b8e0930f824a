"""Fuzzing the finetuning data readers (finetune.squad, finetune.conll, finetune.glue): every mutated or damaged
SQuAD JSON, CoNLL column file or GLUE TSV is read into examples or refused in one DataError line naming the file."""
import json
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from finetune import conll, glue, squad
from finetune.errors import DataError
from tests.fuzz_documents import FUZZ, damaged_bytes, listing, mutated

SAMPLES = pathlib.Path(__file__).resolve().parents[2] / "samples" / "glue"
SQUAD = {"version": "v2.0", "data": [{"title": "Cats", "paragraphs": [
    {"context": "The cat sat on the mat in Caf\u00e9 Z\u00fcrich.",
     "qas": [{"id": "q1", "question": "Who sat?", "answers": [{"text": "The cat", "answer_start": 0}]},
             {"id": "q2", "question": "Where?", "answers": [], "is_impossible": True},
             {"id": "q3", "question": "Which caf\u00e9?"}]}]}]}
CONLL = ("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP I-MISC\ncall NN I-NP O\n\n"
         "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n")
# Each task's sample rows: the bundled RTE and SST-2 files (their first lines), and the real layouts of the others.
GLUE = {
    "rte": b"".join((SAMPLES / "RTE" / "train.tsv").read_bytes().splitlines(keepends=True)[:12]),
    "sst2": b"".join((SAMPLES / "SST-2" / "train.tsv").read_bytes().splitlines(keepends=True)[:12]),
    "cola": b"gj04\t1\t\tOur friends won't buy this analysis.\ngj04\t0\t*\tThey drank the pub.\n",
    "stsb": (b"genre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
             b"main-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\tA plane takes off.\t5.000\n"),
    "mrpc": b"\xef\xbb\xbfQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t702876\t702977\tHe said.\tHe said so.\n",
}


def _write(directory: pathlib.Path, name: str, data: bytes) -> pathlib.Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _read_or_refuse(read, path: pathlib.Path):
    """``read()``; None when refused, which must be one DataError line naming ``path``."""
    before = listing(path.parent)
    try:
        return read()
    except DataError as error:
        assert "\n" not in str(error) and str(path) in str(error), repr(error)
        return None
    finally:
        assert listing(path.parent) == before


def test_mutated_squad_files_are_read_or_refused_in_one_line(tmp_path):
    # ensure_ascii writes odd characters as \\u escapes, lone surrogates included; raw UTF-8 comes via the bytes.
    documents = st.one_of(mutated(SQUAD).map(lambda document: json.dumps(document).encode()),
                          damaged_bytes(json.dumps(SQUAD, ensure_ascii=False).encode()))

    @settings(FUZZ, max_examples=200)
    @given(documents, st.booleans())
    def check(data, version_2):
        path = _write(tmp_path, "squad.json", data)
        examples = _read_or_refuse(lambda: squad.read_squad(str(path), version_2=version_2), path)
        for example in examples or ():
            for text in (example.qid, example.context, example.question, *(text for text, _ in example.answers)):
                text.encode("utf-8")  # what the tokenizer will take
            assert all(0 <= start <= len(example.context) for _, start in example.answers)

    check()


def test_damaged_conll_files_are_read_or_refused_in_one_line(tmp_path):
    newlines = st.sampled_from(["\n", "\r\n", "\r", "\x0b", "\x1c", "\u2028", "\x85"])

    @settings(FUZZ, max_examples=200)
    @given(newlines.flatmap(lambda newline: damaged_bytes(CONLL.replace("\n", newline).encode())))
    def check(data):
        path = _write(tmp_path, "train.txt", data)
        sentences = _read_or_refuse(lambda: conll.read_conll(path), path)
        for sentence in sentences or ():
            assert len(sentence.words) == len(sentence.tags)
            conll.iob1_to_iob2(sentence.tags)
        if sentences is not None:
            conll.detect_scheme(sentences)

    check()


def test_damaged_glue_files_are_read_or_refused_in_one_line(tmp_path):
    @settings(FUZZ, max_examples=200)
    @given(st.sampled_from(sorted(GLUE)).flatmap(lambda task: st.tuples(st.just(task), damaged_bytes(GLUE[task]))))
    def check(task_and_data):
        task, data = task_and_data
        path = _write(tmp_path, f"{glue.TASKS[task].directory}/train.tsv", data)
        _read_or_refuse(lambda: glue.load_split(tmp_path, task, "train"), path)

    check()


# ---- regressions: each a bug the fuzzing found, kept as a plain test

def test_a_squad_file_nested_thousands_deep_is_refused_not_a_recursion_error(tmp_path):
    path = _write(tmp_path, "squad.json", b'{"data": ' + b"[" * 100_000)
    with pytest.raises(DataError, match="not valid UTF-8 JSON"):
        squad.read_squad(str(path))


def test_a_squad_text_with_a_lone_surrogate_escape_is_refused_naming_the_question(tmp_path):
    document = json.loads(json.dumps(SQUAD))
    document["data"][0]["paragraphs"][0]["qas"][0]["question"] = "Who \ud800sat?"
    path = _write(tmp_path, "squad.json", json.dumps(document).encode())  # written as the escape \\ud800
    expected = r'qas\[0\] "question" holds a lone surrogate escape \(\\ud800 at character 4\)'
    with pytest.raises(DataError, match=expected):
        squad.read_squad(str(path), version_2=True)


def test_a_conll_file_that_is_not_utf8_is_refused_naming_the_line(tmp_path):
    path = _write(tmp_path, "train.txt", CONLL.encode() + b"M\xfcnchen NNP B-NP B-LOC\n")
    with pytest.raises(DataError, match=r"train\.txt, line 10: not UTF-8 text"):
        conll.read_conll(path)


def test_a_glue_file_that_is_not_utf8_is_refused_naming_the_file(tmp_path):
    path = _write(tmp_path, "RTE/train.tsv", GLUE["rte"] + b"99\tM\xfcnchen\tx\tentailment\n")
    with pytest.raises(DataError, match=r"RTE/train\.tsv, line 13: not UTF-8 text"):
        glue.load_split(tmp_path, "rte", "train")


def test_a_glue_field_over_the_csv_limit_is_refused_naming_the_line(tmp_path):
    path = _write(tmp_path, "RTE/train.tsv", b"index\tsentence1\tsentence2\tlabel\n0\t" + b"x" * 200_000
                  + b"\ty\tentailment\n")
    with pytest.raises(DataError, match=r"RTE/train\.tsv, line 2: field larger than field limit"):
        glue.load_split(tmp_path, "rte", "train")

"""GLUE task table and TSV reader (finetune/glue.py).

The real-data tests read every GLUE file under shared/data/glue once and compare against the
counts recorded in shared/data/PROVENANCE.md; the error tests write small files into tmp_path.
"""
import collections
import logging

import pytest

from finetune import glue
from finetune.errors import DataError

# (task, split) -> rows, from PROVENANCE.md. MNLI, QQP and the QNLI/WNLI train files are not in the snapshot.
EXPECTED_ROWS = {
    ("cola", "train"): 8551, ("cola", "dev"): 1043,
    ("mrpc", "train"): 3668, ("mrpc", "dev"): 408,
    ("qnli", "dev"): 5463,
    ("rte", "train"): 2490, ("rte", "dev"): 277,
    ("sst2", "train"): 67349, ("sst2", "dev"): 872,
    ("stsb", "train"): 5749, ("stsb", "dev"): 1500,
    ("wnli", "dev"): 71,
}
# (task, split) -> {label string: count}, where PROVENANCE.md gives the distribution.
EXPECTED_LABELS = {
    ("cola", "train"): {"1": 6023, "0": 2528},
    ("cola", "dev"): {"1": 721, "0": 322},
    ("rte", "train"): {"entailment": 1249, "not_entailment": 1241},
    ("rte", "dev"): {"entailment": 146, "not_entailment": 131},
    ("wnli", "dev"): {"0": 40, "1": 31},
    ("qnli", "dev"): {"entailment": 2702, "not_entailment": 2761},
    ("sst2", "dev"): {"1": 444, "0": 428},
}


@pytest.fixture(scope="module")
def glue_dir(shared_data):
    return shared_data / "glue"


@pytest.fixture(scope="module")
def present(glue_dir):
    """Every split whose file is in the snapshot, read once: (task, split) -> SplitReport."""
    return {(task, split): glue.load_split(glue_dir, task, split)
            for task in glue.GLUE_TASKS for split in ["train", *glue.eval_splits(task)]
            if glue.split_path(glue_dir, task, split).is_file()}


# --------------------------------------------------------------------------- the table


def test_table_covers_the_nine_tasks_in_the_glue_layout():
    assert glue.GLUE_TASKS == ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"]
    directories = {task: spec.directory for task, spec in glue.TASKS.items()}
    assert directories == {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP",
                           "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
    assert glue.eval_splits("mnli") == ["mnli_matched", "mnli_mismatched"]
    assert glue.TASKS["mnli"].eval_files == {"mnli_matched": "dev_matched.tsv",
                                             "mnli_mismatched": "dev_mismatched.tsv"}
    assert all(glue.eval_splits(task) == ["dev"] for task in glue.GLUE_TASKS if task != "mnli")
    assert glue.TASKS["mnli"].labels == ("contradiction", "entailment", "neutral")
    assert glue.TASKS["qnli"].labels == glue.TASKS["rte"].labels == ("entailment", "not_entailment")
    assert glue.TASKS["stsb"].regression and glue.TASKS["stsb"].num_labels == 1
    for task in ("cola", "sst2", "mrpc", "qqp", "wnli"):
        assert glue.TASKS[task].labels == ("0", "1") and not glue.TASKS[task].regression
    single_sentence = {task for task, spec in glue.TASKS.items() if spec.text_b is None}
    assert single_sentence == {"cola", "sst2"}
    # Only a headerless file needs its column count from the table (CoLA); the others take the header's.
    assert all(spec.has_header == (spec.num_columns is None) for spec in glue.TASKS.values())


def test_required_files_name_every_split(tmp_path):
    assert glue.required_files(tmp_path, "mnli") == [tmp_path / "MNLI" / name for name in
                                                      ("train.tsv", "dev_matched.tsv", "dev_mismatched.tsv")]
    assert glue.required_files(tmp_path, "sst2") == [tmp_path / "SST-2" / "train.tsv", tmp_path / "SST-2" / "dev.tsv"]


# --------------------------------------------------------------------------- the real files


def test_every_present_file_has_an_expected_count(present):
    # A file added to the snapshot later must get its count recorded here too.
    assert set(present) == set(EXPECTED_ROWS)


@pytest.mark.parametrize("task, split", sorted(EXPECTED_ROWS))
def test_record_counts_match_provenance(present, task, split):
    report = present[(task, split)]
    assert len(report.examples) == EXPECTED_ROWS[(task, split)]
    assert report.skipped_lines == ()
    assert len({e.guid for e in report.examples}) == len(report.examples)


@pytest.mark.parametrize("task, split", sorted(EXPECTED_LABELS))
def test_label_distributions_match_provenance(present, task, split):
    labels = glue.TASKS[task].labels
    found = collections.Counter(labels[e.label] for e in present[(task, split)].examples)
    assert found == EXPECTED_LABELS[(task, split)]


def test_pair_tasks_have_both_texts(present):
    for (task, _), report in present.items():
        pair = glue.TASKS[task].text_b is not None
        assert all((e.text_b is not None) == pair and e.text_a for e in report.examples), task


def test_rte_keeps_the_leading_quote(present):
    # With csv's default quoting this row would lose its quote and swallow the lines after it.
    quoted = [e for e in present[("rte", "train")].examples if e.text_a.startswith('"That film')]
    assert len(quoted) == 1
    assert quoted[0].guid == "train-2166"  # row index 2164: after the header, line = index + 2
    assert quoted[0].text_b == 'The film "WarGames" was shot in 1983.'


def test_mrpc_byte_order_mark_does_not_leak(present):
    # The BOM sits before the header's first name, "Quality", which is the label column: a leaked BOM
    # would make the reader fail to find it.
    for split in ("train", "dev"):
        examples = present[("mrpc", split)].examples
        assert not any("\ufeff" in e.text_a + e.text_b for e in examples)
    first = present[("mrpc", "train")].examples[0]
    assert first.text_a.startswith("Amrozi accused his brother") and first.label == 1


def test_stsb_labels_are_float_scores(present):
    for split in ("train", "dev"):
        scores = [e.label for e in present[("stsb", split)].examples]
        assert all(isinstance(s, float) and 0.0 <= s <= 5.0 for s in scores)
        assert min(scores) == 0.0 and max(scores) == 5.0


def test_cola_dev_last_row_without_final_newline(present):
    last = present[("cola", "dev")].examples[-1]
    assert last.guid == "dev-1043" and last.text_a.strip() and last.label in (0, 1)


def test_qnli_keeps_byte_order_marks_inside_text(present):
    # Three U+FEFF in one sentence, copied from SQuAD; they are text, not a file BOM.
    marked = [e for e in present[("qnli", "dev")].examples if "\ufeff" in e.text_b]
    assert len(marked) == 1 and marked[0].text_b.count("\ufeff") == 3


def test_read_split_returns_the_examples(glue_dir, present):
    assert glue.read_split(glue_dir, "wnli", "dev") == present[("wnli", "dev")].examples


# --------------------------------------------------------------------------- bad input


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_missing_file_names_the_expected_layout(tmp_path):
    with pytest.raises(DataError) as error:
        glue.read_split(tmp_path, "rte", "dev")
    message = str(error.value)
    assert str(tmp_path / "RTE" / "dev.tsv") in message
    assert f"expected the GLUE layout {tmp_path}/RTE/dev.tsv" in message
    assert "download_glue_data.py layout" in message


def test_unknown_task_lists_the_known_ones(tmp_path):
    with pytest.raises(DataError, match="unknown GLUE task 'mnli-mm'.*cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli"):
        glue.read_split(tmp_path, "mnli-mm", "dev")


def test_unknown_split_lists_the_task_splits(tmp_path):
    with pytest.raises(DataError, match="no split 'dev'.*train, mnli_matched, mnli_mismatched"):
        glue.read_split(tmp_path, "mnli", "dev")


def test_bad_label_names_file_and_line(tmp_path):
    path = write(tmp_path / "RTE" / "dev.tsv", "index\tsentence1\tsentence2\tlabel\n"
                                               "0\tA cat sat.\tA cat exists.\tentailment\n"
                                               "1\tA dog ran.\tNo dog ran.\tcontradiction\n")
    with pytest.raises(DataError) as error:
        glue.read_split(tmp_path, "rte", "dev")
    assert f"{path}, line 3: unknown label 'contradiction'; expected one of entailment, not_entailment" in str(error.value)


def test_bad_regression_score_names_file_and_line(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    write(tmp_path / "STS-B" / "dev.tsv", header + "0\tg\tf\t2012\t0\tn\tn\tA.\tB.\thigh\n")
    with pytest.raises(DataError, match=r"dev.tsv, line 2: label 'high' is not a number"):
        glue.read_split(tmp_path, "stsb", "dev")


def test_missing_header_column_is_named(tmp_path):
    write(tmp_path / "SST-2" / "dev.tsv", "text\tlabel\nfine .\t1\n")
    with pytest.raises(DataError, match="header lacks column.*'sentence'.*found 'text', 'label'"):
        glue.read_split(tmp_path, "sst2", "dev")


def test_malformed_rows_are_skipped_and_counted(tmp_path, caplog):
    # The real QQP train file has rows like these: a question with a tab or a newline in it.
    write(tmp_path / "QQP" / "train.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
                                          "0\t1\t2\tWhy?\tHow?\t0\n"
                                          "1\t3\t4\tA question cut short\n"
                                          "2\t5\t6\tWhat is \"this\"?\tWhat's this?\t1\n"
                                          "3\t7\t8\tone\ttoo\tmany\t0\n")
    report = glue.load_split(tmp_path, "qqp", "train")
    assert report.skipped_lines == (3, 5)
    assert [(e.guid, e.text_a, e.text_b, e.label) for e in report.examples] == [
        ("train-2", "Why?", "How?", 0), ("train-4", 'What is "this"?', "What's this?", 1)]
    with caplog.at_level(logging.WARNING, logger="finetune.glue"):
        assert glue.read_split(tmp_path, "qqp", "train") == report.examples
    assert "skipped 2 row(s) with the wrong number of columns (lines 3, 5)" in caplog.text


def test_headerless_cola_and_mnli_gold_label_by_name(tmp_path):
    write(tmp_path / "CoLA" / "train.tsv", "src\t1\t\tGood sentence.\nsrc\t0\t*\tBad sentence sentence.")
    assert [(e.text_a, e.label) for e in glue.read_split(tmp_path, "cola", "train")] == [
        ("Good sentence.", 1), ("Bad sentence sentence.", 0)]
    # MNLI's dev files carry five annotator labels before gold_label; train has one.
    names = ["index", "promptID", "pairID", "genre", "s1b", "s2b", "s1p", "s2p", "sentence1", "sentence2",
             "label1", "label2", "label3", "label4", "label5", "gold_label"]
    row = ["0", "1", "1e", "fiction", "", "", "", "", "P.", "H.", "neutral", "entailment", "neutral", "neutral",
           "neutral", "neutral"]
    write(tmp_path / "MNLI" / "dev_mismatched.tsv", "\t".join(names) + "\n" + "\t".join(row) + "\n")
    [example] = glue.read_split(tmp_path, "mnli", "mnli_mismatched")
    assert (example.guid, example.text_a, example.text_b, example.label) == ("mnli_mismatched-2", "P.", "H.", 2)

"""bench.preprocess.irreducible: the pipeline's reading, cleaning, splitting and tokenizing alone, as a process of its own."""
import json
import pathlib
import sys

from bench import record
from bench.preprocess import irreducible
from common import processes

SAMPLES = pathlib.Path(__file__).resolve().parents[3] / "samples"
CONFIG = "configs/preprocess/phase1_seq128.yaml"


def test_runs_as_a_module_and_reports_one_json_line(bert_vocab):
    out = processes.run([sys.executable, "-m", "bench.preprocess.irreducible", "--config", CONFIG, "--tokenizer", str(bert_vocab),
                         "--books", *map(str, sorted((SAMPLES / "books").glob("*.txt")))], cwd=record.REPO,
                        capture_output=True, text=True, check=True, timeout=120).stdout
    found = json.loads(out)
    assert found["documents"] > 0 and found["corpus_tokens"] > found["sentences"] > 0
    assert found["work_cpu_s"] >= found["tokenize_cpu_s"]


def test_dumps_and_books_add_up(bert_vocab):
    wiki = [str(SAMPLES / "wikipedia" / "samplewiki-pages-articles.xml.bz2")]
    books = [str(p) for p in sorted((SAMPLES / "books").glob("*.txt"))]
    both = irreducible.measure(wiki, books, str(bert_vocab), CONFIG)
    alone = [irreducible.measure(w, b, str(bert_vocab), CONFIG) for w, b in ((wiki, []), ([], books))]
    for key in ("documents", "sentences", "corpus_tokens", "rejected"):
        assert both[key] == alone[0][key] + alone[1][key], key

"""bench.preprocess.formats: the JSON lines and .jsonl.zst inputs it writes from the shared data, read by the
pipeline and by the irreducible work alike (on the bundled samples)."""
import json
import pathlib

import zstandard

from bench.preprocess import formats
from bench.preprocess import runs as preprocess_runs

SAMPLES = pathlib.Path(__file__).resolve().parents[3] / "samples"


def _texts() -> list[bytes]:
    shared = {"wiki": [str(SAMPLES / "wikipedia" / "samplewiki-pages-articles.xml.bz2")],
              "books": [str(p) for p in sorted((SAMPLES / "books").glob("*.txt"))]}
    return formats.clean_documents(shared, str(preprocess_runs.REPO / preprocess_runs.CONFIG))


def test_the_json_lines_copies_give_the_pipeline_and_the_irreducible_work_the_same_tokens(tmp_path, bert_vocab):
    texts = _texts()
    files = formats.write_jsonl_copies(texts, tmp_path / "jsonl", 2)
    records = [json.loads(line) for line in pathlib.Path(files[1]).read_text().splitlines()]
    assert len(records) == len(texts) > 10 and records[0]["id"] == "2-0" and records[0]["text"]
    config = formats.source_config(tmp_path / "jsonl.yaml", str(tmp_path / "jsonl" / "web-*.jsonl"))
    setting = preprocess_runs.Setting({"wiki": [], "books": []}, bert_vocab, tmp_path, quiet_wait=0, config=config)
    run = preprocess_runs.run_pipeline(setting, tmp_path / "out", preprocess_runs.MODES["workers_1"],
                                       setting.logs / "run.log")
    alone = preprocess_runs.irreducible(setting, setting.logs / "irreducible.log")
    assert alone["corpus_tokens"] == run["corpus_tokens"] > 0 and alone["documents"] == run["documents_used"]
    assert run["documents_read"] == 2 * len(texts)


def test_the_large_file_is_zstd_json_lines_of_distinct_ids_up_to_its_size(tmp_path):
    texts = _texts()
    path = tmp_path / "web.jsonl.zst"
    info = formats.write_zst(texts, path, 64 << 10)
    assert info["stored_bytes"] == path.stat().st_size >= 64 << 10
    with zstandard.ZstdDecompressor().stream_reader(path.open("rb")) as stream:
        lines = stream.read().splitlines()
    ids = [json.loads(line)["id"] for line in lines]
    assert len(ids) == len(set(ids)) == info["copies"] * len(texts) and sum(map(len, lines)) + len(lines) == \
        info["decompressed_bytes"]
    assert formats.write_zst(texts, path, 64 << 10) == info  # reused while its stamp says so

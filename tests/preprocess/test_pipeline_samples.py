"""The demo path on the bundled sample corpus: train SentencePiece, build a dataset, read it back."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from common.tokenizer import load_tokenizer
from tests.preprocess.conftest import SAMPLES, read_manifest, run_cli, shard_hashes


def test_train_tokenizer_then_build_dataset_from_the_samples(tmp_path):
    tokenizer_dir = tmp_path / "tokenizer"
    proc = run_cli("tokenizer", "train", "--input", SAMPLES / "wikipedia", SAMPLES / "books", "--vocab-size", "1500",
                   "--lowercase", "--output", tokenizer_dir)
    assert "1,500 pieces" in proc.stdout
    tok = load_tokenizer(str(tokenizer_dir))
    assert tok.kind == "sentencepiece" and tok.special_ids["[MASK]"] == 4

    out = tmp_path / "dataset"
    proc = run_cli("run", "--config", "configs/preprocess/tiny.yaml", "--wikipedia", SAMPLES / "wikipedia",
                   "--books", SAMPLES / "books", "--tokenizer", tokenizer_dir, "--output", out, "--provenance",
                   "--set", "instances.mask_unit=whole_word")
    for line in ("documents:", "instances:", "corpus:", "output:"):
        assert line in proc.stdout
    manifest = read_manifest(out)
    docs = manifest["statistics"]["documents"]
    # 40 articles, 6 redirects, 3 pages of other namespaces, and a stub in the sample dump (samples/README.md).
    assert docs["skipped"]["redirect"] == 6 and docs["skipped"]["non_article_namespace"] == 3
    assert manifest["tokenizer"]["vocab_sha256"] == tok.identity()["vocab_sha256"]
    assert manifest["parameters"]["instances"]["mask_unit"] == "whole_word"
    table = pa.concat_tables(ipc.open_file(pa.memory_map(str(out / s["name"]))).read_all() for s in manifest["shards"])
    assert table.num_rows == manifest["rows"] > 500
    assert set(table.column_names) == {"input_ids", "segment_a_len", "masked_positions", "masked_labels",
                                       "next_sentence_label", "doc_a", "doc_b"}
    # Whole-word masking: a masked continuation piece is masked together with the piece before it, unless a
    # segment starts with it (truncation can cut a word; [CLS]/[SEP] precede it then).
    rows = zip(table.column("segment_a_len").to_pylist(), table.column("masked_positions").to_pylist(),
               table.column("masked_labels").to_pylist())
    checked = 0
    for a_len, positions, labels in rows:
        masked = dict(zip(positions, labels))
        for pos, label in masked.items():
            if tok.is_continuation[label] and pos - 1 not in (0, a_len - 1):
                assert pos - 1 in masked, "a word is masked entirely or not at all"
                checked += 1
    assert checked > 100


@pytest.fixture(scope="module")
def sample_tokenizer(tmp_path_factory):
    out = tmp_path_factory.mktemp("samples") / "tokenizer"
    run_cli("tokenizer", "train", "--input", SAMPLES / "wikipedia", SAMPLES / "books", "--vocab-size", "2000",
            "--lowercase", "--output", out)
    return out


def test_the_demos_flags_give_the_same_shards_for_any_worker_count_and_mode(sample_tokenizer, tmp_path):
    """``--direct_num_workers 1 --direct_running_mode multi_processing`` once ended in a traceback (a handoff lot
    not open in Beam's worker process); every count in either mode now builds the in-memory run's shards, and
    what cannot run is refused in one line before anything is read."""
    common = ["run", "--config", "configs/preprocess/tiny.yaml", "--wikipedia", SAMPLES / "wikipedia", "--books",
              SAMPLES / "books", "--tokenizer", sample_tokenizer]
    run_cli(*common, "--output", tmp_path / "in-memory")
    reference = shard_hashes(tmp_path / "in-memory")
    # Which path each count and mode takes is tested for every combination in tests/preprocess/executors/
    # test_beamargs.py; a pool of 2 is compared with the in-memory run in test_pipeline_real.py.
    for workers, mode in (("1", "multi_processing"), ("2", "in_memory")):
        out = tmp_path / f"{workers}-{mode}"
        proc = run_cli(*common, "--output", out, "--direct_num_workers", workers, "--direct_running_mode", mode)
        assert shard_hashes(out) == reference, f"{workers} {mode} differs from the in-memory run:\n{proc.stdout}"
    refused = run_cli(*common, "--output", tmp_path / "threads", "--direct_num_workers", "2",
                      "--direct_running_mode", "multi_threading", check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].endswith("use multi_processing")
    assert not (tmp_path / "threads").exists()

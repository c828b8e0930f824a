"""The demo path on the bundled sample corpus: train SentencePiece, build a dataset, read it back."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.ipc as ipc

from common.tokenizer import load_tokenizer
from tests.preprocess.conftest import SAMPLES, read_manifest, run_cli


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

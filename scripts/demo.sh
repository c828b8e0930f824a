#!/usr/bin/env bash
# The demo: on the sample corpus that ships in samples/ (a Wikipedia-format XML dump and three books),
# train a SentencePiece vocabulary, then build BERT instances with 2 Beam worker processes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-demo-output}
python3 -m pip install --quiet --disable-pip-version-check -e ".[preprocess]"
python3 -m preprocess tokenizer train --input samples/wikipedia samples/books \
  --vocab-size 2000 --lowercase --output "$OUT/tokenizer"
python3 -m preprocess run --config configs/preprocess/tiny.yaml \
  --wikipedia samples/wikipedia --books samples/books --tokenizer "$OUT/tokenizer" \
  --output "$OUT/dataset" --overwrite --direct_num_workers 2 --direct_running_mode multi_processing
python3 - "$OUT/dataset" <<'PY'
import json, sys
m = json.load(open(f"{sys.argv[1]}/manifest.json"))
print(f"manifest: {m['rows']:,} rows in {len(m['shards'])} shards; first shard sha256 {m['shards'][0]['sha256'][:16]}…")
PY

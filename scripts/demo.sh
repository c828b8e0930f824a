#!/usr/bin/env bash
# The demo, on the sample corpus that ships in samples/ (a Wikipedia-format XML dump and three books):
# 1. train a SentencePiece vocabulary; 2. build BERT instances with 2 Beam worker processes;
# 3. pretrain a tiny BERT on them with DeepSpeed (ZeRO 1; precision auto: bf16 where the CPU computes it natively,
#    fp32 otherwise) on 2 CPU processes, evaluating it on the dataset's held-out split, and export it;
# 4. finetune that checkpoint on the bundled GLUE-format sample (samples/glue), write a report and save each task's
#    model as a Hugging Face directory; 5. classify two sentences with the saved SST-2 model through transformers.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-demo-output}
# --no-compile: Python compiles what the demo imports as it imports it, instead of pip compiling every file of every
# package first (in a new environment the installs took 137 s with it and 85 s without, on 2 cores).
python3 -m pip install --quiet --disable-pip-version-check --no-compile "torch==2.13.0"
python3 -m pip install --quiet --disable-pip-version-check --no-compile -e ".[preprocess,pretrain,finetune]"
INSTALLED=$SECONDS
python3 -m preprocess tokenizer train --input samples/wikipedia samples/books \
  --vocab-size 2000 --lowercase --output "$OUT/tokenizer"
python3 -m preprocess run --config configs/preprocess/tiny.yaml \
  --wikipedia samples/wikipedia --books samples/books --tokenizer "$OUT/tokenizer" \
  --output "$OUT/dataset" --overwrite --direct_num_workers 2 --direct_running_mode multi_processing \
  --set heldout.wikipedia.documents=8 --set heldout.books.documents=1  # the held-out split pretraining scores
python3 - "$OUT/dataset" <<'PY'
import json, sys
m = json.load(open(f"{sys.argv[1]}/manifest.json"))
print(f"manifest: {m['rows']:,} rows in {len(m['shards'])} shards; first shard sha256 {m['shards'][0]['sha256'][:16]}…")
PY
rm -rf "$OUT/pretrain"
DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 python3 -m torch.distributed.run --nproc_per_node 2 --master_port 29577 \
  pretrain/run.py --config configs/pretrain/tiny.yaml --set data.path="$OUT/dataset" --set output_dir="$OUT/pretrain"
python3 - "$OUT/pretrain" <<'PY'
import json, sys
e = json.load(open(f"{sys.argv[1]}/summary.json"))["evaluation"]["last"]
print(f"evaluation: step {e['step']} on {e['rows']:,} held-out rows: masked-LM accuracy {e['mlm_accuracy']:.4f}, "
      f"loss {e['mlm_loss']:.4f}, perplexity {e['mlm_perplexity']:.2f}; NSP accuracy {e['nsp_accuracy']:.4f}")
PY
# The report opens with what this is: a toy run on synthetic data, whose scores mean nothing beside the paper's.
python3 -m finetune suite --checkpoint "$OUT/pretrain" --tasks sst2,rte --data samples \
  --config configs/finetune/tiny.yaml --output "$OUT/finetune" --save-models \
  --note "Demo scale: a tiny BERT pretrained for a minute on the sample corpus and finetuned on samples/glue, a \
synthetic GLUE-format sample generated from templates (samples/glue/make_sample.py), not GLUE. Its scores show that \
every stage runs end to end; they are not comparable with the BERT paper's and say nothing about BERT."
# The saved task model leaves the pipeline: transformers loads it as it is (its tokenizer too, built from the
# SentencePiece vocabulary of step 1).
python3 - "$OUT/finetune/models/sst2" <<'PY'
import sys
from transformers import pipeline
classify = pipeline("text-classification", model=sys.argv[1])
for text in ("the river cruise is the best thing we did all year", "the fishing cooperative's supper was not worth the ticket"):
    print(f"transformers' pipeline on {sys.argv[1]}: {text!r} -> {classify(text, truncation=True)[0]}")
PY
echo "demo: done in ${SECONDS} s, $((SECONDS - INSTALLED)) s of it after the install; outputs in $OUT/"

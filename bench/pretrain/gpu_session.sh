#!/usr/bin/env bash
# The GPU step's grid (bench.pretrain.gpu_grid) fed by synthetic datasets in the real shard format, as one prepared
# run on a GPU machine.
#
#   bench/pretrain/gpu_session.sh VOCAB RESULTS_DIR [ROWS_SEQ128] [ROWS_SEQ512]
#
# Writes a phase-1 dataset (seq 128, 20 predictions; default 100 M rows, about 30 GiB) and a phase-2 one (seq 512,
# 80 predictions; default 4 M rows, about 4 GiB) with `python -m preprocess.synthetic` under $BENCH_DATA (default
# /tmp/bench-data; the writer checks the free space first and refuses), reusing any already there. Then the grid:
# every variant (eager, regional and whole-model compilation, padding-free, each attention kernel, torch's AdamW,
# activation checkpointing) at seq 128 and 512 in its own process with a timeout, within $GRID_BUDGET seconds
# (default 480), and the best of each phase again through the pretraining loader on those datasets with a profile.
# $GRID_ARGS go to the grid. Results: RESULTS_DIR/pretrain-gpu-grid-<device>.json, written after every variant.
set -euo pipefail
vocab=$1 results=$2 rows128=${3:-100000000} rows512=${4:-4000000}
data=${BENCH_DATA:-/tmp/bench-data}
seq128=$data/seq128-$rows128 seq512=$data/seq512-$rows512
mkdir -p "$data" "$results"
if [ ! -d "$seq128" ]; then
  python3 -m preprocess.synthetic --rows "$rows128" --tokenizer "$vocab" --output "$seq128" --workers "$(nproc)"
fi
if [ ! -d "$seq512" ]; then
  python3 -m preprocess.synthetic --rows "$rows512" --max-seq-length 512 --max-predictions 80 --tokenizer "$vocab" \
    --output "$seq512" --workers "$(nproc)"
fi
python3 -m bench.pretrain.gpu_grid --data128 "$seq128" --data512 "$seq512" --budget "${GRID_BUDGET:-480}" \
  --results "$results" ${GRID_ARGS:-}

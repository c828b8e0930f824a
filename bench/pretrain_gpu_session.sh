#!/usr/bin/env bash
# bench.pretrain_gpu fed by synthetic datasets in the real shard format, as one prepared run on a GPU machine.
#
#   bench/pretrain_gpu_session.sh VOCAB RESULTS_DIR [ROWS_SEQ128] [ROWS_SEQ512]
#
# Writes a phase-1 dataset (seq 128, 20 predictions; default 100 M rows, about 30 GiB) and a phase-2 one (seq 512,
# 80 predictions; default 4 M rows, about 4 GiB) with `python -m preprocess.synthetic` under $BENCH_DATA (default
# /tmp/bench-data; the writer checks the free space first and refuses), reusing any already there. Then BERT-Large
# phase 1 and 2 in the eager $MODES (default padded,padding-free), read through the pretraining loader; then the
# $COMPILE_MODES (default padded+compile,padded+compile-whole: regional and whole-model compilation) within
# $COMPILE_SECONDS (default 180; a run cut short says so and leaves the eager results). $BENCH_GPU_ARGS go to both. Results: RESULTS_DIR/pretrain-gpu-<device>.json and
# RESULTS_DIR/compile/pretrain-gpu-<device>.json.
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
python3 -m bench.pretrain_gpu --data128 "$seq128" --data512 "$seq512" --modes "${MODES:-padded,padding-free}" \
  --results "$results" ${BENCH_GPU_ARGS:-}
status=0
timeout -k 10 "${COMPILE_SECONDS:-180}" python3 -m bench.pretrain_gpu --data128 "$seq128" --data512 "$seq512" \
  --modes "${COMPILE_MODES:-padded+compile,padded+compile-whole}" --results "$results/compile" ${BENCH_GPU_ARGS:-} || status=$?
[ "$status" -eq 0 ] || echo "${COMPILE_MODES:-padded+compile,padded+compile-whole} did not finish within ${COMPILE_SECONDS:-180} s (exit $status)"

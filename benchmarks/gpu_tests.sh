#!/usr/bin/env bash
# The GPU record: `pytest -m gpu tests/` on a machine with a GPU, its first lines the commit it
# ran at, the date, the device and the versions.  From the repository root:
#
#   COMMIT=$(git rev-parse --short HEAD) OUT=results/benchmarks bash benchmarks/gpu_tests.sh [PYTEST ARGS]
#
# Wheels in .whl/ (the server's stack, which the serve tests need) are installed first
# (benchmarks/gpu_env.sh).  Writes $OUT/gpu-tests.log (default results/benchmarks).
set -uo pipefail
OUT=${OUT:-results/benchmarks}
mkdir -p "$OUT"
source benchmarks/gpu_env.sh > /dev/null
{
    echo "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
    echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "device $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n 1)"
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    echo "command: pytest -m gpu tests/ $*"
    python3 -m pytest -m gpu -p no:cacheprovider -q tests/ "$@" 2>&1
} | tee "$OUT/gpu-tests.log"

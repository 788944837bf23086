#!/usr/bin/env bash
# The engine on one GPU: its GPU tests, then cyb bench decode (per-token rates against batch,
# shared / private / gated pauses, the offline job against the previous static batches).
#
#   OUT=/some/folder bash benchmarks/engine_gpu.sh            # from the repository root
#   PART=rates|offline|gated|tests|all  (default all)          # one part only
#   BENCH_QUICK=1 OUT=/tmp/x bash benchmarks/engine_gpu.sh    # tiny CPU smoke run of the script
#
# Writes to $OUT (default outputs/engine_gpu): pytest_gpu.log, rates.json/.log (batches 1 to
# 1024, M = 1, fixed and adaptive M = 4 at dk shares 0.1 and 0.5, shared and private),
# offline.json/.log (2,000 prompts of 16-512 tokens with answers of 8-256, shared and private),
# gated.json/.log (gated pauses, 512 new tokens at batch 32: the engine against recomputing the
# row), engine_gpu.log (everything printed, with the device and versions first).
set -uo pipefail

START=$(date +%s)
OUT=${OUT:-outputs/engine_gpu}
PART=${PART:-all}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/engine_gpu.log") 2>&1
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
export TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

QUICK=()
[[ -n "${BENCH_QUICK:-}" ]] && QUICK=(--quick)
run() { [[ $PART == all || $PART == "$1" ]]; }
stamp() { echo "== $1 ($(( $(date +%s) - START )) s)"; }

if run tests && $PY -c "import pytest" 2>/dev/null; then
    stamp tests
    timeout 240 $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_engine.py > "$OUT/pytest_gpu.log" 2>&1
    tail -n 5 "$OUT/pytest_gpu.log"
fi
if run rates; then
    stamp rates
    timeout 420 $PY -m cyb bench decode ${QUICK[@]+"${QUICK[@]}"} --batches ${BATCHES:-1 32 256 1024} \
        --visibility shared private --pause-fraction 0.1 0.5 --impls engine_one engine_block static_batches \
        --new-tokens ${NEW_TOKENS:-48} --budget-s ${RATES_BUDGET_S:-360} --out "$OUT/rates.json" > "$OUT/rates.log" 2>&1
    grep -E "^(engine|static|eager|hf)|MET|MISSED" "$OUT/rates.log" | tail -n 80
fi
if run offline; then
    stamp offline
    timeout 420 $PY -m cyb bench decode ${QUICK[@]+"${QUICK[@]}"} --batches 1 --modes adaptive \
        --impls engine_one --visibility shared private --pause-fraction 0.1 --new-tokens 8 \
        --offline ${OFFLINE_PROMPTS:-2000} --offline-batch 256 --out "$OUT/offline.json" > "$OUT/offline.log" 2>&1
    grep -E "^offline|MET|MISSED" "$OUT/offline.log" | tail -n 20
fi
if run gated; then
    stamp gated
    timeout 300 $PY -m cyb bench decode ${QUICK[@]+"${QUICK[@]}"} --batches 32 --modes adaptive \
        --impls eager_pos engine_one engine_block --visibility gated --pause-fraction 0.1 --prompt-len 64 \
        --new-tokens ${GATED_TOKENS:-512} --warmup-steps 2 --out "$OUT/gated.json" > "$OUT/gated.log" 2>&1
    grep -E "^(engine|eager)|MET|MISSED" "$OUT/gated.log" | tail -n 20
fi
stamp done

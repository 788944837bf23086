#!/usr/bin/env bash
# The engine's GPU tests run again and again at one commit, spread over the GPUs of one host: for
# each GPU in GPUS, LANES processes side by side, each running the tests ROUNDS times in a row.
# From the repository root, on a GPU machine:
#
#   GPUS="1 2" LANES=2 ROUNDS=2 OUT=/some/folder bash benchmarks/gpu_repeats.sh
#
# Writes $OUT/repeats.log: one line per run (GPU, lane, round, the time it started, pytest's
# summary line), then how many runs were green.  TESTS overrides the test files.
set -uo pipefail
OUT=${OUT:-outputs/gpu_repeats}
GPUS=${GPUS:-0}
LANES=${LANES:-1}
ROUNDS=${ROUNDS:-1}
TESTS=${TESTS:-tests/test_engine.py tests/test_engine_schedules.py tests/test_row_attention.py}
mkdir -p "$OUT"
source benchmarks/gpu_env.sh > /dev/null
lane() {  # GPU, lane
    for round in $(seq 1 "$ROUNDS"); do
        start=$(date -u +%H:%M:%SZ)
        summary=$(CUDA_VISIBLE_DEVICES=$1 python3 -m pytest -m gpu -p no:cacheprovider -q $TESTS 2>&1 | tail -n 1)
        echo "gpu $1 lane $2 round $round ($start): $summary" >> "$OUT/repeats.log"
    done
}
for gpu in $GPUS; do
    for l in $(seq 1 "$LANES"); do
        lane "$gpu" "$l" &
    done
done
wait
runs=$(grep -c "round" "$OUT/repeats.log")
green=$(grep "round" "$OUT/repeats.log" | grep " passed" | grep -vc "failed\|error")
echo "$green of $runs runs green" | tee -a "$OUT/repeats.log"

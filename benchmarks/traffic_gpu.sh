#!/usr/bin/env bash
# The engine under traffic in one call on one GPU, in under 10 minutes: the step timeline of the
# traffic job (benchmarks/engine_gaps.py: gaps between tokens, what each step did), cyb serve
# against its engine offline at 512 and 2,048 requests (cyb bench serve, 256 closed-loop
# streams), and, first, the decoding step and the prefill forward with and without fused kernels
# (benchmarks/engine_fused.py).
# From the repository root, with the server's wheels in .whl/ (see benchmarks/serve_gpu.sh):
#
#   OUT=/some/folder bash benchmarks/traffic_gpu.sh
#
# Each part writes into $OUT as it finishes (fused.json, gaps/, serve-512.*, serve-2048.*), so a
# call cut short keeps what is done; CASES overrides "none private-adaptive".
set -uo pipefail
OUT=${OUT:-outputs/traffic_gpu}
CASES=${CASES:-none private-adaptive}
mkdir -p "$OUT"
source benchmarks/gpu_env.sh
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
timeout 170 python3 benchmarks/engine_fused.py --out "$OUT/fused.json" --batches 1 8 64 256
python3 benchmarks/engine_gaps.py --out "$OUT/gaps" --cases $CASES > "$OUT/gaps.log" 2>&1
grep -E '"(tok_s|itl_ms_p50|itl_ms_p99|p99_over_p50)"' "$OUT/gaps.log"
for n in 512 2048; do
    timeout -k 5 200 python3 -m cyb bench serve --concurrency 256 --no-static --budget-s 120 --cases $CASES \
        --requests "$n" --out "$OUT/serve-$n.json" > "$OUT/serve-$n.log" 2>&1
    grep -E "offline engine|MET|MISSED" "$OUT/serve-$n.log"
done

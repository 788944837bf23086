#!/usr/bin/env bash
# One GPU run of the benchmarks -- decode, training step, loss -- in under 8 minutes.
#
#   bash benchmarks/run_gpu.sh            # from the repository root, on a machine with one GPU
#
# Writes to $OUT (default results/benchmarks): decode.json, train.json, loss.json, a log per
# benchmark, run_gpu.log (everything printed), env.txt and benchmarks.md (a preview of
# docs/record/benchmarks/).  Each benchmark runs under its own time limit and writes its JSON after
# every row, so a benchmark cut off by its limit keeps the rows it finished; one that fails does
# not stop the others.  Copy the JSON files to results/benchmarks/ and run
# `python benchmarks/make_docs.py` to render their tables for docs/record/benchmarks/.
set -uo pipefail

START=$(date +%s)
TOTAL_S=${BENCH_TOTAL_S:-465}   # leaves a margin under 8 minutes
OUT=${OUT:-results/benchmarks}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run_gpu.log") 2>&1

python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
export PYTHONPATH=src:${PYTHONPATH:-}
export TOKENIZERS_PARALLELISM=false

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
    python3 - <<'EOF'
import importlib.metadata as md, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu",
      torch.cuda.get_device_name() if torch.cuda.is_available() else None)
for name in ("transformers", "triton", "liger-kernel"):
    try:
        print(name, md.version(name))
    except Exception as e:
        print(name, "missing:", e)
EOF
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

left() { echo $(( TOTAL_S - ($(date +%s) - START) )); }

# bench NAME LIMIT_S ARGS...: `python3 -m cyb bench ARGS` under a time limit (cut to what is left)
bench() {
    local name=$1 limit=$2; shift 2
    local remain; remain=$(left)
    (( limit > remain )) && limit=$remain
    if (( limit < 30 )); then
        echo "== $name: skipped, only ${remain}s left"
        return
    fi
    echo "== $name (limit ${limit}s, $(( $(date +%s) - START ))s elapsed): cyb bench $*"
    local t0; t0=$(date +%s)
    timeout -k 10 "$limit" python3 -m cyb bench "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $(( $(date +%s) - t0 ))s$( ((rc == 124)) && echo ' (time limit)')"
    tail -n 45 "$OUT/$name.log"
}

# Internal budgets (--budget-s) skip rows that would not finish; the outer limits are a backstop.
# BENCH_QUICK=1 runs the same steps with tiny CPU shapes (a smoke test of this script).
if [[ -n "${BENCH_QUICK:-}" ]]; then
    QUICK=(--quick)
    LOSS_GRID=(--methods naive_cyb fused_torch fused_triton liger_flce --skip-check)
else
    QUICK=()
    LOSS_GRID=(--repeats 3 --methods naive_cyb fused_triton fused_readout_cyb ce_full liger_flce
               --vocab 32768 131072 262144 --positions 8192 16384 32768 65536)
fi
# decode captures CUDA graphs: default allocator settings for it (the engine's full set: engine_gpu.sh)
bench decode 100 decode ${QUICK[@]+"${QUICK[@]}"} --out "$OUT/decode.json" --budget-s 75
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True   # less fragmentation after OOM rows
bench train 275 train ${QUICK[@]+"${QUICK[@]}"} --out "$OUT/train.json" --budget-s 235
bench loss 200 loss ${QUICK[@]+"${QUICK[@]}"} --out "$OUT/loss.json" "${LOSS_GRID[@]}"
unset PYTORCH_CUDA_ALLOC_CONF

# The GPU tests of the benchmark code and the kernels, if pytest is here and time is left.
if (( $(left) >= 45 )) && python3 -c "import pytest" 2>/dev/null; then
    echo "== pytest -m gpu ($(left)s left)"
    timeout -k 5 $(( $(left) - 5 )) python3 -m pytest -q -m gpu -p no:cacheprovider \
        tests/test_bench.py tests/test_kernels.py > "$OUT/pytest_gpu.log" 2>&1
    echo "== pytest: exit $?"; tail -n 15 "$OUT/pytest_gpu.log"
fi

python3 benchmarks/make_docs.py --results "$OUT" --out "$OUT/benchmarks.md" || true
echo "== done in $(( $(date +%s) - START ))s; results in $OUT"

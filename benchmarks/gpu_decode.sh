#!/usr/bin/env bash
# The decode benchmark, a profile of the decode step and the GPU decode tests on one GPU
# (about 4 minutes; every part has its own time limit, BENCH_TOTAL_S = 400 s in all at most).
#
#   OUT=/some/folder bash benchmarks/gpu_decode.sh       # from the repository root
#   BENCH_QUICK=1 OUT=/tmp/x bash benchmarks/gpu_decode.sh   # tiny CPU smoke run of the script
#
# Writes to $OUT (default outputs/gpu_decode):
#   decode.json       cyb bench decode: graph vs eager, fixed vs adaptive, M = 1 and 4, batch 1
#                     and 32, the float32 graph = eager check at batch 32, generate end to end
#   decode.md         the same rendered as docs/benchmarks.md renders it (tables, targets)
#   decode.log        what the benchmark printed
#   profile.tar.gz    benchmarks/profile_decode.py: top-ops tables per decoder, summary.json
#   parts.json        benchmarks/decode_step_parts.py: graph step time, M = 1 vs 4, per attention
#                     backend, sequential readout vs a bare argmax
#   trained.json      (with TRAINED_MODEL=DIR [TRAINED_PROMPTS=FILE]) cyb bench decode --model on a
#                     trained model, batch 1 and 32, timing each prompt's first tokens
#   pytest_gpu.log    the tests marked gpu of tests/test_generation_static.py and tests/test_bench.py
#   gpu_decode.log    everything printed, with the device and versions first
set -uo pipefail

START=$(date +%s)
TOTAL_S=${BENCH_TOTAL_S:-400}
OUT=${OUT:-outputs/gpu_decode}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_decode.log") 2>&1

if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
export TOKENIZERS_PARALLELISM=false

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
python3 - <<'PY'
import importlib.metadata as md, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu",
      torch.cuda.get_device_name() if torch.cuda.is_available() else None)
for name in ("transformers", "triton"):
    try:
        print(name, md.version(name))
    except Exception as e:
        print(name, "missing:", e)
PY

left() { echo $(( TOTAL_S - ($(date +%s) - START) )); }
# part NAME LIMIT_S CMD...: run CMD under min(LIMIT_S, what is left)
part() {
    local name=$1 limit=$2; shift 2
    local remain; remain=$(left)
    (( limit > remain )) && limit=$remain
    if (( limit < 20 )); then echo "== $name: skipped, only ${remain}s left"; return; fi
    echo "== $name (limit ${limit}s, $(( $(date +%s) - START ))s elapsed): $*"
    local t0; t0=$(date +%s)
    timeout -k 10 "$limit" "$@"
    local rc=$?
    echo "== $name: exit $rc after $(( $(date +%s) - t0 ))s$( ((rc == 124)) && echo ' (time limit)')"
}

QUICK=()
[[ -n "${BENCH_QUICK:-}" ]] && QUICK=(--quick)

# 1. the benchmark (its own budget skips rows that would not finish; the JSON is written per row)
part decode 170 python3 -m cyb bench decode ${QUICK[@]+"${QUICK[@]}"} --out "$OUT/decode.json" \
    --budget-s 140 > "$OUT/decode.log" 2>&1
tail -n 60 "$OUT/decode.log"

# 2. the profile of one step of each decoder
PROF=$(mktemp -d)
part profile 90 python3 benchmarks/profile_decode.py ${QUICK[@]+"${QUICK[@]}"} --out "$PROF/profile"
tar czf "$OUT/profile.tar.gz" -C "$PROF" profile 2>/dev/null && cat "$PROF/profile/summary.json"
rm -rf "$PROF"

# 2b. where the graph step's time goes (attention backends, readout)
part parts 90 python3 benchmarks/decode_step_parts.py ${QUICK[@]+"${QUICK[@]}"} --out "$OUT/parts.json"

# 2c. a trained model: its own dk decisions, real prompts
if [[ -n "${TRAINED_MODEL:-}" ]]; then
    TP=()
    [[ -n "${TRAINED_PROMPTS:-}" ]] && TP=(--prompts "$TRAINED_PROMPTS")
    part trained 120 python3 -m cyb bench decode ${QUICK[@]+"${QUICK[@]}"} --model "$TRAINED_MODEL" \
        ${TP[@]+"${TP[@]}"} --new-tokens "${TRAINED_TOKENS:-4}" --warmup-steps 0 \
        --out "$OUT/trained.json" --budget-s 90 > "$OUT/trained.log" 2>&1
    grep -v '^N/A' "$OUT/trained.log" | tail -n 30
fi

# 3. the GPU tests of the decoders (graph = eager in float32)
if python3 -c "import pytest" 2>/dev/null; then
    part pytest 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_generation_static.py \
        tests/test_bench.py > "$OUT/pytest_gpu.log" 2>&1
    tail -n 15 "$OUT/pytest_gpu.log"
fi

# 4. the Markdown of the decode results
RES=$(mktemp -d)
cp "$OUT/decode.json" "$RES/" 2>/dev/null && \
    python3 benchmarks/make_docs.py --results "$RES" --out "$OUT/decode.md" || true
rm -rf "$RES"
echo "== done in $(( $(date +%s) - START ))s; results in $OUT"

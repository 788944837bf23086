#!/usr/bin/env bash
# cyb serve under load on one GPU, in under 5 minutes: cyb bench serve for no pauses, shared and
# private pauses in fixed and adaptive mode (the 134 M Llama with random weights, M = 4, bf16),
# concurrency 1, 16, 64 and 256 (closed loop), prompts of 16-512 tokens and answers of 8-256;
# each against the engine offline and generate() in static batches on the same prompts.
#
#   OUT=/some/folder bash benchmarks/serve_gpu.sh           # from the repository root
#   ARRIVALS=poisson RATE=200 bash benchmarks/serve_gpu.sh  # Poisson arrivals instead (at most C in flight)
#   BENCH_QUICK=1 OUT=/tmp/x bash benchmarks/serve_gpu.sh   # tiny CPU smoke run of the script
#   CONCURRENCY=256 REQUESTS=2048 CASES="none private-adaptive" bash benchmarks/serve_gpu.sh
#                                                            # steady state at 256 streams (no first-wave weight)
#   HTTP_PROCESSES=1 bash benchmarks/serve_gpu.sh            # the server with one HTTP process (default: cyb serve's)
#
# The server needs starlette and uvicorn (the serve extra). On a machine without a package
# index, put their wheels in .whl/ first; on a machine with one:
#   python3 -m pip download --no-deps -d .whl starlette uvicorn h11 click anyio idna sniffio
# (all pure Python; httptools and uvloop make uvicorn faster but are optional).
#
# Writes to $OUT (default outputs/serve_gpu): serve.json (every row, the targets), serve.log (what
# cyb bench serve printed: one line per case and concurrency, the table, MET / MISSED lines),
# serve_gpu.log (everything, with the device and versions first).
set -uo pipefail

START=$(date +%s)
OUT=${OUT:-outputs/serve_gpu}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/serve_gpu.log") 2>&1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
export TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
$PY - <<'PYEOF'
import importlib.metadata as md
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda,
      "gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None)
for name in ("transformers", "starlette", "uvicorn", "httptools", "uvloop"):
    try:
        print(name, md.version(name))
    except Exception as e:  # noqa: BLE001
        print(name, "missing:", type(e).__name__)
PYEOF
if ! $PY -c "import starlette, uvicorn" 2>/dev/null; then
    echo "serve_gpu: starlette and uvicorn are missing: put their wheels in .whl/ (see the top of this script)"
    exit 2
fi

QUICK=()
[[ -n "${BENCH_QUICK:-}" ]] && QUICK=(--quick)
POISSON=()
[[ "${ARRIVALS:-closed}" == poisson ]] && POISSON=(--arrivals poisson --rate "${RATE:-200}")
CONC=${CONCURRENCY:-1 16 64 256}
[[ -n "${BENCH_QUICK:-}" ]] && CONC=${CONCURRENCY:-1 4}
MORE=()
[[ -n "${REQUESTS:-}" ]] && MORE+=(--requests "$REQUESTS")
[[ -n "${CASES:-}" ]] && MORE+=(--cases $CASES)
[[ -n "${HTTP_PROCESSES:-}" ]] && MORE+=(--http-processes "$HTTP_PROCESSES")

echo "== cyb bench serve ($(( $(date +%s) - START )) s elapsed)"
timeout -k 10 ${LIMIT_S:-285} $PY -m cyb bench serve ${QUICK[@]+"${QUICK[@]}"} ${POISSON[@]+"${POISSON[@]}"} \
    ${MORE[@]+"${MORE[@]}"} --concurrency $CONC --budget-s ${BUDGET_S:-255} --out "$OUT/serve.json" > "$OUT/serve.log" 2>&1
rc=$?
echo "== exit $rc after $(( $(date +%s) - START )) s$( ((rc == 124)) && echo ' (time limit: serve.json keeps the rows that finished)')"
grep -E "^\||MET|MISSED|N/A|error" "$OUT/serve.log" | tail -n 60

#!/usr/bin/env bash
# The engine at real model sizes on one GPU (benchmarks/serve_sizes.py), in under 8 minutes:
# one call for the models, jobs and cases given, every piece's JSON written to $OUT as it ends,
# then the table and the goals as MET / MISSED / N/A lines.
#
#   OUT=/some/folder bash benchmarks/serve_sizes_gpu.sh                 # SmolLM2-1.7B, the mixed job
#   MODELS=gemma3-1b JOBS="mixed eval" CASES="none private-adaptive" OUT=... bash benchmarks/serve_sizes_gpu.sh
#   JOBS=fewshot REQUESTS=1000 EXTRA="--no-check --no-batch1" OUT=... bash benchmarks/serve_sizes_gpu.sh
#   SMOKE=1 ...                      # first the tiny models on the GPU (a few seconds), to catch a broken path
#   SERVE=1 ...                      # the mixed job through cyb serve too (starlette and uvicorn in .whl/)
#   STEP_BUDGET=1024 ...             # prompts written inside the decoding steps (EngineOptions.step_budget)
#   PREFILL_CHUNK=512 PREFILL_ROWS=1 ...   # smaller prefill forwards between the decoding steps
#   VARIANTS="step_budget=2048 prefill_chunk=512,prefill_rows=1" ...   # each job and case again under these
#   PROFILE=1 ...                    # each engine run under torch.profiler, the engine's phases labelled
#   python benchmarks/serve_sizes.py --from OUT1 OUT2 ...               # later: the goals of several calls
#
# Writes to $OUT (default outputs/serve_sizes): records.tar.gz (every piece's MODEL-*.json, packed
# once the call ends: a device call returns at most 8 files; a call killed before then leaves them
# loose), summary.json, goals.txt and serve_sizes.log (everything, with the device and versions first).
set -uo pipefail

START=$(date +%s)
OUT=${OUT:-outputs/serve_sizes}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/serve_sizes.log") 2>&1
source benchmarks/gpu_env.sh
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
PY=${PYTHON:-python3}

MORE=()
[[ -n "${REQUESTS:-}" ]] && MORE+=(--requests "$REQUESTS")
[[ -n "${SERVE:-}" ]] && MORE+=(--serve)
[[ -n "${BLOCK_SIZE:-}" ]] && MORE+=(--block-size "$BLOCK_SIZE")
[[ -n "${STEP_BUDGET:-}" ]] && MORE+=(--step-budget "$STEP_BUDGET")
[[ -n "${PREFILL_CHUNK:-}" ]] && MORE+=(--prefill-chunk "$PREFILL_CHUNK")
[[ -n "${PREFILL_ROWS:-}" ]] && MORE+=(--prefill-rows "$PREFILL_ROWS")
[[ -n "${VARIANTS:-}" ]] && MORE+=(--variants $VARIANTS)
[[ -n "${PROFILE:-}" ]] && MORE+=(--profile)
if [[ -n "${SMOKE:-}" ]]; then
    echo "== smoke: tiny models on the GPU"
    timeout -k 10 120 $PY benchmarks/serve_sizes.py --quick --device cuda --out "$OUT/smoke" --jobs mixed \
        --budget-s 100 | grep -E "^(MET|MISSED|N/A)|error" | head -n 20
fi
echo "== serve_sizes ($(( $(date +%s) - START )) s elapsed)"
timeout -k 10 ${LIMIT_S:-460} $PY benchmarks/serve_sizes.py --out "$OUT" --models ${MODELS:-smollm2-1.7b} \
    --jobs ${JOBS:-mixed} --cases ${CASES:-none private-adaptive shared-fixed} \
    --budget-s ${BUDGET_S:-$(( ${LIMIT_S:-460} - 30 - ($(date +%s) - START) ))} \
    ${MORE[@]+"${MORE[@]}"} ${EXTRA:-}
rc=$?
# (a device call returns at most 8 files: the records go back as one archive; `--from` reads it)
records=()
for f in "$OUT"/*.json; do [[ -f $f && $(basename "$f") != summary.json ]] && records+=("$(basename "$f")"); done
if (( ${#records[@]} )); then
    tar -czf "$OUT/records.tar.gz" -C "$OUT" "${records[@]}" && (cd "$OUT" && rm -f "${records[@]}")
fi
echo "== exit $rc after $(( $(date +%s) - START )) s$( ((rc == 124)) && echo ' (time limit: the JSON of the pieces that ended is kept)')"

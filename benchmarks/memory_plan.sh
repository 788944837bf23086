#!/usr/bin/env bash
# The memory plan on the GPU: `cyb bench memory` for Gemma 1 2B, Gemma 3 4B and Llama 3 8B
# shapes (random weights), full fine-tuning and LoRA, with and without gradient checkpointing,
# CYB at 2048 real tokens x M = 4, micro-batch 1, bf16 -- split over N GPUs in parallel.
#
#   bash benchmarks/memory_plan.sh [N_GPUS]     # repository root; default: every visible GPU
#
# Each (shape, configuration) runs in its own process on one GPU (CUDA_VISIBLE_DEVICES); the
# pairs are dealt out round-robin, largest model first. Writes to $OUT (default outputs/memory):
# memory.jsonl (one row per pair), memory.md (the table for docs/record/benchmarks/memory.md) and
# memory.tar.gz (both, the logs of every GPU and the device list). About 6-8 minutes on one
# 80 GB GPU, 2-3 minutes on four; no pair starts after MEMORY_PLAN_BUDGET_S (420) seconds, so
# the run stays under 10 minutes (late pairs are recorded as skipped). Then, in the repository:
#   cyb bench memory --from memory.jsonl --fill-doc docs/record/benchmarks/memory.md   # the table of the docs
set -uo pipefail
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
py=${PYTHON:-python3}
out=${OUT:-outputs/memory}
work=$(mktemp -d)
mkdir -p "$out"
n=${1:-$(nvidia-smi -L 2>/dev/null | wc -l)}
(( n >= 1 )) || n=1
echo "memory plan on $n GPU(s), results in $out"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > "$work/device.txt" 2>&1 || true
$py -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    >> "$work/device.txt" 2>&1

start=$(date +%s)
budget=${MEMORY_PLAN_BUDGET_S:-420}  # no new pair starts after this many seconds (each <= 170 s)
pairs=()
# MEMORY_PLAN_SHAPES / MEMORY_PLAN_ARGS: other shapes / options (a CPU smoke test of this
# script: MEMORY_PLAN_SHAPES=tiny MEMORY_PLAN_ARGS=--quick bash benchmarks/memory_plan.sh 1);
# MEMORY_PLAN_CONFIGS: a subset of the configurations (e.g. "lora lora-ckpt")
for shape in ${MEMORY_PLAN_SHAPES:-llama3-8b gemma3-4b gemma1-2b}; do
    for config in ${MEMORY_PLAN_CONFIGS:-full full-ckpt lora lora-ckpt}; do
        pairs+=("$shape:$config")
    done
done

run_gpu() {  # run_gpu GPU PAIR...: the pairs one after another on that GPU
    local gpu=$1; shift
    for pair in "$@"; do
        local shape=${pair%%:*} config=${pair##*:}
        if (( $(date +%s) - start > budget )); then  # keep the whole run inside the limit
            echo "{\"shape\": \"$shape\", \"config\": \"$config\", \"status\": \"skipped\", \"reason\": \"time budget of ${budget}s spent\"}" \
                > "$work/$shape-$config.jsonl"
            continue
        fi
        CUDA_VISIBLE_DEVICES=$gpu $py -m cyb bench memory --shapes "$shape" --configs "$config" \
            --timeout-s 170 --out "$work/$shape-$config.jsonl" ${MEMORY_PLAN_ARGS:-}
    done > "$work/gpu$gpu.log" 2>&1
}

# MEMORY_PLAN_GPUS: the GPU indices to use (default 0 .. N-1)
read -r -a gpus <<< "${MEMORY_PLAN_GPUS:-$(seq -s ' ' 0 $((n - 1)))}"
n=${#gpus[@]}
for ((g = 0; g < n; g++)); do
    mine=()
    for ((i = g; i < ${#pairs[@]}; i += n)); do mine+=("${pairs[i]}"); done
    run_gpu "${gpus[g]}" "${mine[@]}" &
done
wait
echo "grid done in $(( $(date +%s) - start )) s on $n GPU(s)"

cat "$work"/*.jsonl > "$work/memory.jsonl" 2>/dev/null
$py -m cyb bench memory --from "$work/memory.jsonl" --markdown "$work/memory.md"
cat "$work/device.txt"
cp "$work/memory.jsonl" "$work/memory.md" "$out/"
tar -czf "$out/memory.tar.gz" -C "$work" memory.jsonl memory.md device.txt $(cd "$work" && ls gpu*.log)
rm -rf "$work"
echo "wrote $out/memory.jsonl $out/memory.md $out/memory.tar.gz"

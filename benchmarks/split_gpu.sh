#!/usr/bin/env bash
# Private and gated pauses trained at full speed (the split attention, cyb.kernels.split_attention),
# on a GPU machine.  From the repository root:
#
#   PART=check bash benchmarks/split_gpu.sh   # CUDA tests (-m gpu) and one layer's attention
#   PART=jobs JOBS="0:256 1:512 0:1024 1:2048 0:smollm2" bash benchmarks/split_gpu.sh
#       # cyb bench train, every layout, at that many real tokens per row (8192 per batch) or the
#       # SmolLM2-135M shape at 32 x 256; GPU:JOB, one queue per GPU, the GPUs at once
#
# Writes $OUT (default results/benchmarks/split).  Liger-Kernel's wheel may be placed in .whl/.
set -uo pipefail
OUT=${OUT:-results/benchmarks/split}
PART=${PART:-check}
BUDGET=${BUDGET:-250}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/split_gpu_$PART.log") 2>&1
source benchmarks/gpu_env.sh
VARIANTS="tbys_liger cyb_fused cyb_private cyb_private_split cyb_gated cyb_gated_dense"

train_rows() {  # real tokens, batch, gpu
    CUDA_VISIBLE_DEVICES=$3 timeout $((BUDGET + 40)) python3 -m cyb bench train --case 32768:$2 \
        --real-tokens $1 --variants $VARIANTS --modes compile --budget-s $BUDGET \
        --out "$OUT/train-$1.json" 2>&1 | grep -v Warning > "$OUT/train-$1.log"
}

run_jobs() {  # "gpu:job ..." where a job is a number of real tokens or smollm2; one queue per GPU
    for gpu in $(printf '%s\n' "$@" | cut -d: -f1 | sort -u); do
        (for spec in "$@"; do
            [ "${spec%%:*}" = "$gpu" ] || continue
            job=${spec#*:}
            case $job in
            check) CUDA_VISIBLE_DEVICES=$gpu check ;;
            smollm2) smollm2 $gpu ;;
            *) train_rows $job $((8192 / job)) $gpu ;;
            esac
        done) &
    done
    wait
}

check() {
    echo "== CUDA tests"
    timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short tests/test_split_attention.py \
        2>&1 | tail -40
    echo "== one layer's attention"
    timeout 200 python3 benchmarks/split_attention_bench.py --out "$OUT/attention.json" ${PROFILE:+--real-tokens 256 --profile "private split compiled" "private split triton compiled" "gated split compiled"}
}

smollm2() {
    CUDA_VISIBLE_DEVICES=$1 timeout $((BUDGET + 40)) python3 -m cyb bench train --shape smollm2 \
        --case 49152:32 --real-tokens 256 --variants ${SMOLLM2_VARIANTS:-$VARIANTS} --modes compile --budget-s $BUDGET \
        --out "$OUT/train-smollm2-256.json" 2>&1 | grep -v Warning > "$OUT/train-smollm2-256.log"
}

case $PART in
check) check ;;
jobs) run_jobs $JOBS
    for f in "$OUT"/train-*.log; do echo "== $f"; cat "$f"; done ;;
*) echo "PART must be check or jobs"; exit 2 ;;
esac

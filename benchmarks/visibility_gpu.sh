#!/usr/bin/env bash
# Private pauses on one GPU: the CUDA checks of the FlexAttention path, the training step at 2048
# and 256 real tokens (M = 4) for shared CYB, private CYB and TBYS, Hugging Face + Liger TBYS and
# the no-pause baseline, eager and compiled (decoding: benchmarks/engine_gpu.sh).  From the
# repository root:
#
#   bash benchmarks/visibility_gpu.sh          # writes $OUT (default results/visibility-gpu)
#
# Wheels for liger-kernel (and anything else missing) may be placed in .whl/.
set -uo pipefail
OUT=${OUT:-results/visibility-gpu}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/visibility_gpu.log") 2>&1
source benchmarks/gpu_env.sh
echo "== CUDA checks"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_visibility.py 2>&1 | tail -15
VARIANTS="cyb_fused cyb_private tbys_private tbys_liger baseline_hf"
echo "== training step, 2048 real tokens x 4 rows"
timeout 300 python3 -m cyb bench train --case 32768:4 --real-tokens 2048 --variants $VARIANTS \
    --modes eager compile --out "$OUT/train-2048.json" --budget-s 260 2>&1 | grep -v Warning | tail -20
echo "== training step, 256 real tokens x 32 rows"
timeout 200 python3 -m cyb bench train --case 32768:32 --real-tokens 256 --variants $VARIANTS \
    --modes compile --out "$OUT/train-256.json" --budget-s 170 2>&1 | grep -v Warning | tail -12
# (decoding with private pauses: benchmarks/engine_gpu.sh)

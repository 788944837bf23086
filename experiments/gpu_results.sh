#!/usr/bin/env bash
# The job that made results/experiments/text (docs/record/results/text.md) on one machine with 4 GPUs:
#   bash experiments/gpu_results.sh [SECONDS]
# from the repository root, with techdocs copied to .data/techdocs. Three jobs share each GPU;
# jobs that cannot finish within SECONDS (default 560) are not started, and a rerun skips
# the runs that finished. Results (without weights) are packed into $OUT/text.tar.gz after
# every finished run.
set -eu
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} CYB_DATA=$PWD/.data/techdocs PYTHONUNBUFFERED=1
out=${OUT:-.}
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/device.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$out/device.txt"
python3 experiments/run_suite.py pretrain epochs finetune hparams --seeds 0,1,2 \
  --out results/experiments/text --gpus "$gpus" --per-gpu 3 --deadline "${1:-560}" --unit-seconds 140 \
  --pack "$out/text.tar.gz" 2>&1 | tee "$out/driver.log"

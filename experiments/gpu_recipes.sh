#!/usr/bin/env bash
# The job that made results/experiments/recipes (docs/record/results/recipes.md), from the repository root with
# techdocs copied to .data/techdocs:
#   bash experiments/gpu_recipes.sh [GPUS] [SECONDS]     (GPUS: e.g. 0,1,2,3; default every GPU)
# Three jobs share each GPU; jobs that cannot finish within SECONDS (default 540) are not
# started. Results (without weights) are packed into $OUT/recipes.tar.gz after every finished run.
# RES=DIR writes them elsewhere (default results/experiments/recipes); ONLY="PART ..." runs only
# the jobs whose names contain one of the parts, with their bases (run_suite.py --only), e.g.
#   RES=results/experiments/recipes-h100 ONLY="rc-cyb-p3 ponder_cost-0.02" bash experiments/gpu_recipes.sh
set -eu
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} CYB_DATA=$PWD/.data/techdocs PYTHONUNBUFFERED=1
out=${OUT:-.}
gpus=${1:-$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)}
res=${RES:-results/experiments/recipes}
only=()
[[ -n "${ONLY:-}" ]] && read -r -a only <<< "$ONLY" && only=(--only "${only[@]}")
mkdir -p "$res"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$res/device.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$res/device.txt"
python3 experiments/run_suite.py recipes --seeds 0,1,2 --out "$res" --gpus "$gpus" --per-gpu 3 \
  --deadline "${2:-540}" --unit-seconds 140 --pack "$out/recipes.tar.gz" ${only[@]+"${only[@]}"} 2>&1 \
  | tee "$res/driver.log"

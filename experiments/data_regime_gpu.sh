#!/usr/bin/env bash
# The data-regime study (experiments/data_regime.py) on a GPU machine that cannot reach the network,
# staged as the SmolLM2 suites are (experiments/stage_smollm2.sh: SmolLM2 in .data/gguf/part00,
# part01, ... of experiments/split_smollm2.sh, one part per call, techdocs in .data/techdocs, the
# wheels in .whl):
#
#   bash experiments/data_regime_gpu.sh time [SECONDS]          # a step's time per row, then the plan's estimate
#   bash experiments/data_regime_gpu.sh start SECONDS [WAIT]    # the cells, in a session of their own for SECONDS
#   bash experiments/data_regime_gpu.sh wait [WAIT]             # wait for them up to WAIT s (default 480)
#
# `time` runs `data_regime.py time` within SECONDS (default 420; rows it could not time are timed
# by the next call; CYB_CONCURRENT=2 also measures two cells at once on one GPU). `start` runs the
# cells not finished yet, detached (experiments/detached.sh: they outlive the call while the machine
# is held), until SECONDS from now: give it what is left of the machine's hold less two minutes, so
# that the last pack comes back before the machine goes; then it waits WAIT s (default 420). Each
# later call of the hold runs `wait`. A cell that cannot end before SECONDS is not started; one cut
# there resumes from its checkpoint in the next `start` on the same machine.
#
# CYB_GPUS (default: every GPU) and CYB_PER_GPU (default 1) say where the cells go; CYB_SEEDS (default
# 0,1) which seeds. Each call leaves in $OUT what came so far: device.txt, timing.json, the driver's
# log and data-regime.tar.gz (every finished cell, no weights). Keep them in the repository with
#   python experiments/data_regime_report.py results/experiments/data-regime --keep data-regime.tar.gz
# (and copy timing.json there); a fresh machine starts from the kept summary.jsonl and timing.json.
set -u
action=${1:-}
dir=/tmp/data-regime  # the detached driver's folder
out=${OUT:-.}
mkdir -p "$out"
case $action in
  time | start) ;;
  wait)
    bash experiments/detached.sh wait "$dir" "${2:-480}" "$out"
    exit $?
    ;;
  *)
    sed -n '6,8p' "$0" | sed 's/^# *//'
    exit 2
    ;;
esac
t0=$(date +%s)
source experiments/stage_smollm2.sh
stage_smollm2 || exit 1
gpus=${CYB_GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
mkdir -p outputs/data-regime
kept=results/experiments/data-regime
[ -f outputs/data-regime/timing.json ] || { [ -f "$kept/timing.json" ] && cp "$kept/timing.json" outputs/data-regime/; }
left() { echo $(( $1 - ($(date +%s) - t0) )); }
if [ "$action" = time ]; then
  python3 experiments/data_regime.py time --gpus "$gpus" --per-gpu "${CYB_PER_GPU:-1}" --seeds "${CYB_SEEDS:-0,1}" \
    --concurrent "${CYB_CONCURRENT:-0}" --deadline "$(left "${2:-420}")" 2>&1 | tee "$out/time.log"
  cp outputs/data-regime/timing.json "$out/" 2>/dev/null
  exit 0
fi
[ $# -ge 2 ] || { echo "usage: bash experiments/data_regime_gpu.sh start SECONDS [WAIT]"; exit 2; }
bash experiments/detached.sh start "$dir" python3 experiments/data_regime.py run --seeds "${CYB_SEEDS:-0,1}" \
  --gpus "$gpus" --per-gpu "${CYB_PER_GPU:-1}" --deadline "$(left "$2")" --pack "$dir/data-regime.tar.gz" || exit 1
cp outputs/data-regime/timing.json "$out/" 2>/dev/null
bash experiments/detached.sh wait "$dir" "${3:-420}" "$out"

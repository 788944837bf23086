#!/usr/bin/env bash
# The SmolLM2-135M evidence of docs/results.md on one machine of 4 GPUs, three suites side by side
# (SmolLM2 arrives as in experiments/stage_smollm2.sh):
#
#   bash experiments/real_model_gpu.sh [SECONDS]      # default 540
#
# * smollm2 at about one epoch (--scale smollm2-epoch): baseline and private CYB 3, seeds 0-2;
# * smollm2 at 500 steps: TBYS 3 shared, CYB 1 and 2 private, CYB-decoupled private and the
#   LoRA rows, seeds 0-2, and the baseline of seed 0 again (compiled; the first rows ran eager);
# * smollm2-arith: 5-digit addition, six methods, seeds 0-2.
#
# Each GPU runs one job of each suite at a time. SECONDS counts from the script's start (the
# staging included): leave a minute under a call's time limit for the last packing, or the
# call ends with the jobs still running. Runs are checkpointed: running the script again on the
# same machine resumes them (finished runs are skipped). Results (no weights) are packed into
# $OUT/<suite>.tar.gz after every run.
set -u
start=$SECONDS
source experiments/stage_smollm2.sh
stage_smollm2 || exit 1
out=${OUT:-.}
deadline=$(( ${1:-540} - (SECONDS - start) ))  # what the staging left
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
suite() {  # NAME SUITE [run_suite.py options]
  local name=$1
  shift
  python3 experiments/run_suite.py "$@" --seeds 0,1,2 --out "outputs/$name" --gpus 0,1,2,3 --per-gpu 1 \
    --deadline "$deadline" --pack "$out/$name.tar.gz" > "$out/$name.log" 2>&1
}
suite smollm2-epoch smollm2 --scale smollm2-epoch --only sm-baseline-p3 sm-cyb-p3-private &
suite smollm2 smollm2 --scale smollm2 --only sm-baseline-p3-s0 sm-tbys-p3-s sm-cyb-p1 sm-cyb-p2 sm-cyb_decoupled sm-lora &
suite smollm2-arith smollm2-arith --scale smollm2-arith &
wait
tail -n 3 "$out"/smollm2*.log

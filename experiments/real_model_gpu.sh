#!/usr/bin/env bash
# The SmolLM2-135M evidence of docs/results.md on one machine of 4 GPUs, two suites side by side
# (SmolLM2 arrives as in experiments/stage_smollm2.sh):
#
#   bash experiments/real_model_gpu.sh [SECONDS]      # default 540
#
# * smollm2 at 500 steps: the rows not yet run for every seed: CYB 1 and 2 pauses shared, the
#   baseline with 4x the context (compute-matched), CYB-ponder tau=-0.05 private, and the
#   missing seeds of the LoRA CYB, CYB-decoupled and shared TBYS rows;
# * smollm2-arith: 5-digit addition, seed 2 of every row, seed 1 of shared CYB and
#   CYB-decoupled, and seed 0 of shared CYB again (its scoring was cut before).
# (The script as of commit 00bc2df ran the one-epoch suite and the first rows of these two.)
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
suite smollm2 smollm2 --scale smollm2 --only sm-cyb-p1-s sm-cyb-p2-s sm-baseline_nx sm-cyb_ponder \
  sm-lora-cyb-p3-private-s1 sm-lora-cyb-p3-private-s2 sm-cyb_decoupled-p3-private-s2 sm-tbys-p3-s1 &
suite smollm2-arith smollm2-arith --scale smollm2-arith --only ar-baseline-p3-s2 ar-tbys-p3-private-s2 \
  ar-tbys-p3-s2 ar-cyb-p3-private-s2 ar-cyb-p3-s ar-cyb_decoupled-p3-private-s1 ar-cyb_decoupled-p3-private-s2 &
wait
tail -n 3 "$out"/smollm2*.log

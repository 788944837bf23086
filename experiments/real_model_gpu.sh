#!/usr/bin/env bash
# The SmolLM2-135M evidence of docs/record/results/ (smollm2.md, smollm2-arithmetic.md) on one machine of 4 GPUs, two suites side by side
# (SmolLM2 arrives as in experiments/stage_smollm2.sh):
#
#   bash experiments/real_model_gpu.sh [SECONDS]      # default 540
#
# * smollm2 at 500 steps: seed 0 of private TBYS, CYB 3 gated (method.pause_visibility, the dense
#   mask), the quality-compute sweep (private CYB with dk priors 0.5 and 0.99, CYB-ponder
#   tau=-0.2 and -0.5), then their seeds 1 and 2;
# * smollm2-arith: the gated rows (CYB-decoupled, CYB, TBYS), seed 2 of the shared rows, then
#   seeds 1 and 2 of the gated rows (those of TBYS last: not run yet).
# (The script as of commit 00bc2df ran the one-epoch suite and the first rows of these two; as
# of e071510 and 7d8499a the rows added then.)
#
# Each GPU runs two jobs of smollm2 and one of smollm2-arith at a time, the rows in the order
# listed. SECONDS counts from the script's start (the staging included): leave a minute under
# a call's time limit for the last packing, or the call ends with the jobs still running. Runs are checkpointed: running the script again on the
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
  python3 experiments/run_suite.py "$@" --seeds 0,1,2 --out "outputs/$name" --gpus 0,1,2,3 \
    --deadline "$deadline" --pack "$out/$name.tar.gz" > "$out/$name.log" 2>&1
}
sm=(sm-tbys-p3-private-s0 sm-cyb-p3-gated-s0 sm-cyb_ponder-p3-tau-0.2-private-s0 sm-cyb_ponder-p3-tau-0.5-private-s0
    sm-cyb-p3-dk0.99-private-s0 sm-cyb-p3-dk0.5-private-s0 sm-cyb-p3-gated-s1 sm-cyb-p3-gated-s2)
for seed in 1 2; do
  sm+=(sm-cyb_ponder-p3-tau-0.2-private-s$seed sm-cyb_ponder-p3-tau-0.5-private-s$seed
       sm-cyb-p3-dk0.99-private-s$seed sm-cyb-p3-dk0.5-private-s$seed)
done
ar=(ar-cyb_decoupled-p3-gated-s0 ar-cyb-p3-gated-s0 ar-tbys-p3-gated-s0 ar-cyb-p3-s2 ar-tbys-p3-s2
    ar-cyb_decoupled-p3-gated-s1 ar-cyb_decoupled-p3-gated-s2 ar-cyb-p3-gated-s1 ar-cyb-p3-gated-s2
    ar-tbys-p3-gated-s1 ar-tbys-p3-gated-s2)
suite smollm2 smollm2 --scale smollm2 --per-gpu 2 --only "${sm[@]}" &
suite smollm2-arith smollm2-arith --scale smollm2-arith --per-gpu 1 --only "${ar[@]}" &
wait
tail -n 3 "$out"/smollm2*.log

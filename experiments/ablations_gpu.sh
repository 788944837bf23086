#!/usr/bin/env bash
# The SmolLM2 rows that say where the gain comes from and what pause-step adapters do on text, on
# a machine of 4 GPUs of 80 GB that cannot reach the network (staged as for the smollm2 suites:
# experiments/stage_smollm2.sh, techdocs in .data/techdocs, the wheels in .whl):
#
#   bash experiments/ablations_gpu.sh SECONDS OUTDIR [SEEDS]   # seeds default 0,1,2
#
# - 5-digit addition (run_suite.py smollm2-arith): the baseline given the pause rows' training
#   compute (4x the steps over the same sums, and over 4x as many; about 3.5 GiB each) and private
#   CYB with its pause rows frozen (about 8.4 GiB);
# - one epoch of techdocs (run_suite.py smollm2 --scale smollm2-epoch): private CYB with pause-step
#   adapters of rank 16, and gated CYB (about 34 GiB each).
# Laid out by their memory estimates (about 72 GiB at most on a GPU; nvidia-smi showed 77.5 of 80
# GiB used on GPUs 0 and 1): the text runs two each on GPUs 0 and 1 and one each on 2 and 3, the
# compute-matched baselines two each on 2 and 3 and one each on 0 and 1, the frozen-row runs on 2
# and 3. Measured so on 4 x H100: the compute-matched baselines about 990 s, the frozen-row runs
# 480-560 s, the adapter runs about 1,100 s with their scoring; the gated text runs reached only
# steps 810-1215 of 1,620 in 1,380 s (two to a GPU): give them about twice that.
# The three drivers share SECONDS (runs still training then are killed; runs scoring their
# trained model get GRACE_S, default 100, more) and write their packs (no weights) to OUTDIR after
# every finished run: smollm2-arith-4x.tar.gz, smollm2-arith-frozen.tar.gz (the two drivers share
# outputs/smollm2-arith) and smollm2-epoch.tar.gz.
# Fold them with python experiments/keep_pack.py PACK... --into results/experiments/smollm2-arith
# (or smollm2-epoch). A machine without outputs/smollm2-arith (or -epoch) starts from the kept
# summary.jsonl in results/experiments/: finished runs are not run again. EPOCH_ONLY (default
# "sm-cyb-p3-adapters16-private sm-cyb-p3-gated") names the text rows to run: the adapter runs of
# seeds 0 and 1 lack only their whole-file evaluation, so EPOCH_ONLY=sm-cyb-p3-gated runs what is
# missing.
#
# The compute-matched baselines train for about 15 minutes, longer than one GPU call: start the
# script in a session of its own (experiments/detached.sh), so that it outlives the call, and have
# each later call on the same machine wait for it and bring OUTDIR back through $OUT:
#
#   bash experiments/detached.sh start /tmp/ablations bash experiments/ablations_gpu.sh 1380 /tmp/ablations
#   bash experiments/detached.sh wait /tmp/ablations 570     # in the same call, then in each later one
set -u
[ $# -ge 2 ] || { echo "usage: bash experiments/ablations_gpu.sh SECONDS OUTDIR [SEEDS]"; exit 2; }
total=$1
out=$2
seeds=${3:-0,1,2}
start=$(date +%s)
mkdir -p "$out"
source experiments/stage_smollm2.sh
stage_smollm2 || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
for name in smollm2-arith smollm2-epoch; do  # runs finished in earlier sessions are not run again
  if [ ! -f "outputs/$name/summary.jsonl" ] && [ -f "results/experiments/$name/summary.jsonl" ]; then
    mkdir -p "outputs/$name" && cp "results/experiments/$name/summary.jsonl" "outputs/$name/"
  fi
done
left=$(( total - ($(date +%s) - start) ))
suite() {  # NAME GPUS PER_GPU run_suite.py arguments...
  local name=$1 gpus=$2 per=$3
  shift 3
  python3 experiments/run_suite.py "$@" --seeds "$seeds" --gpus "$gpus" --per-gpu "$per" --deadline "$left" \
    --grace "${GRACE_S:-100}" --pack "$out/$name.tar.gz" > "$out/$name.log" 2>&1
}
suite smollm2-epoch 0,1,2,3 2 smollm2 --scale smollm2-epoch --out outputs/smollm2-epoch \
  --only ${EPOCH_ONLY:-sm-cyb-p3-adapters16-private sm-cyb-p3-gated} &
suite smollm2-arith-4x 2,3,0,1 2 smollm2-arith --scale smollm2-arith --out outputs/smollm2-arith --only ar-baseline-4x &
suite smollm2-arith-frozen 2,3 2 smollm2-arith --scale smollm2-arith --out outputs/smollm2-arith \
  --only ar-cyb-p3-private-frozenrows &
wait
tail -n 1 "$out"/smollm2-*.log

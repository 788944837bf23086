# Sourced by the GPU scripts of benchmarks/ from the repository root: installs the wheels in .whl/
# (packages the device machine lacks, e.g. liger-kernel) into /tmp/site, puts src/ on
# PYTHONPATH and prints the GPUs and the torch and transformers versions.
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

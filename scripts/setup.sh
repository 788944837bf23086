#!/usr/bin/env bash
# Creates .venv (if needed) and installs cyb into it, with the extras in CYB_EXTRAS (default: test).
# CPU machines get the CPU build of torch 2.13.0; machines with an NVIDIA driver get a CUDA build.
# Override the torch requirement with CYB_TORCH (e.g. CYB_TORCH="torch==2.13.0+cpu") and add an
# index with PIP_EXTRA_INDEX_URL (e.g. https://download.pytorch.org/whl/cpu) where needed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
extras=${CYB_EXTRAS:-test}
stamp=.venv/.cyb-setup-$( (cat pyproject.toml scripts/setup.sh; echo "$extras") | sha1sum | cut -c1-12)
if [ -f "$stamp" ]; then
  exit 0
fi
# A full set-up (torch, the test extras, triton) takes about 3 GB in .venv; pip's own error on a full
# disk names neither.
free_mb=$(df -Pm . | awk 'NR==2 {print $4}')
if [ -n "$free_mb" ] && [ "$free_mb" -lt 4000 ]; then
  echo "setup: warning: only ${free_mb} MB free on this disk; .venv with torch and the test extras takes about 3,000 MB" >&2
fi
"$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  if [ -n "${CYB_TORCH:-}" ]; then
    spec=$CYB_TORCH
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    spec="torch>=2.4"
  else
    spec="torch==2.13.0"
  fi
  echo "setup: installing $spec into .venv"
  "$VPY" -m pip install -q "$spec"
fi
echo "setup: installing cyb (editable) with extras [$extras] into .venv"
"$VPY" -m pip install -q -e ".[$extras]"
# Triton runs the fused-readout kernels on CPU tensors under TRITON_INTERPRET=1 (tests); CUDA
# builds of torch bring their own matching triton.
if ! "$VPY" -c "import triton" >/dev/null 2>&1; then
  "$VPY" -m pip install -q "triton==3.9.0" || echo "setup: triton not installed; its CPU-interpreter tests will be skipped"
fi
rm -f .venv/.cyb-setup-*
touch "$stamp"

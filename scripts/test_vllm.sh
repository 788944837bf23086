#!/usr/bin/env bash
# Sets up .venv-vllm if needed (scripts/setup_vllm.sh), then runs the vLLM plugin's tests in it
# (tests/test_integrations_vllm*.py: about 5 minutes on a 2-core CPU, the venv's set-up 3 more).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_vllm.sh
VENV=${CYB_VLLM_VENV:-.venv-vllm}
exec "$VENV/bin/python" -m pytest -q tests/test_integrations_vllm.py tests/test_integrations_vllm_engine.py "$@"

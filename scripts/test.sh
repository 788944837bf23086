#!/usr/bin/env bash
# Sets up .venv if needed (with lm-evaluation-harness and peft for their tests), then runs the
# CPU test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
CYB_EXTRAS=test,eval,lora bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"

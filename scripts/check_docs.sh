#!/usr/bin/env bash
# Runs the examples of README.md and the docs pages and compares what they print with what the pages
# show (scripts/check_docs.py says what is checked and how; --help for the options). Run it before
# changing an output on a page, and with --write --pages PAGE to put what ran into the page. Not
# part of the test suite: a full check trains a dozen small models (about an hour on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
# (the pages' examples use the extras the test suite installs: the serve example needs starlette and
# uvicorn, the evaluation page lm-eval, and so on)
CYB_EXTRAS=test,eval,lora,gguf,trl,wandb,reasoning,serve bash scripts/setup.sh
exec .venv/bin/python scripts/check_docs.py "$@"

#!/usr/bin/env bash
# Sets up .venv if needed, then runs `cyb demo` (extra arguments go to it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/cyb demo "$@"

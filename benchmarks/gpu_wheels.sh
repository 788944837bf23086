#!/usr/bin/env bash
# Fills .whl/ with the wheels the GPU scripts install on a device machine that cannot reach the
# network (benchmarks/gpu_env.sh installs whatever .whl/ holds): the server's stack and the OpenAI
# client, which the serve tests need, and pytest-xdist, which runs the GPU suite in four processes
# (benchmarks/gpu_tests.sh -n 4 --dist loadfile).  For the device's Python (default 3.12) on x86-64
# Linux; carry .whl with the call.
#
#   bash benchmarks/gpu_wheels.sh [PYTHON_VERSION]
set -euo pipefail
py=${1:-3.12}
pip=(${PIP:-python3 -m pip})
mkdir -p .whl
"${pip[@]}" download -q -d .whl --only-binary=:all: --python-version "$py" --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform any starlette uvicorn httpx openai 2>&1 | grep -v "is ignored" || true
"${pip[@]}" download -q -d .whl --no-deps --only-binary=:all: --python-version "$py" --platform any \
    pytest-xdist execnet 2>&1 | grep -v "is ignored" || true
for want in starlette uvicorn httpx openai pytest_xdist execnet; do
    ls .whl/"$want"-*.whl >/dev/null 2>&1 || { echo "gpu_wheels.sh: no $want wheel in .whl/" >&2; exit 1; }
done
echo "$(ls .whl/*.whl | wc -l) wheels in .whl/ ($(du -sh .whl | cut -f1))"

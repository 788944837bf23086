"""The GPU record (``results/benchmarks/gpu-tests.log``, written by ``benchmarks/gpu_tests.sh`` on a
machine with a GPU) is green, complete, and not older than the code it speaks for: no commit
after the one it ran at touches the paths whose behaviour only a GPU run checks.  CI has no GPU;
this is how a change to those paths without a GPU run stops the suite instead of landing."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "results" / "benchmarks" / "gpu-tests.log"
#: what the GPU tests check that the CPU suite cannot: a change here needs a new record
GPU_PATHS = ("src/cyb/engine", "src/cyb/generation", "src/cyb/serve", "src/cyb/model", "src/cyb/kernels",
             "src/cyb/layout.py", "src/cyb/visibility.py")


def _header() -> dict:
    head = {}
    for line in RECORD.read_text(encoding="utf-8").splitlines()[:6]:
        key, _, value = line.partition(" ")
        head[key] = value
    return head


def test_the_gpu_record_is_green_and_complete():
    text = RECORD.read_text(encoding="utf-8")
    head = _header()
    assert re.fullmatch(r"[0-9a-f]{7,40}", head.get("commit", "")), "the record's first line: commit <hash>"
    assert head.get("device"), "the record names its device"
    assert "pytest -m gpu tests/" in text.splitlines()[4], "the record is of the whole GPU suite"
    summary = [line for line in text.splitlines() if re.match(r"^=*\s*\d+ (passed|failed)", line)]
    assert summary, "the record has no pytest summary line: the run was cut short"
    last = summary[-1]
    assert " passed" in last and "failed" not in last and "error" not in last, last


def test_no_commit_after_the_record_changes_what_it_checks():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    commit = _header()["commit"]

    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)

    if git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        pytest.skip(f"commit {commit} is not in this checkout (a shallow clone)")
    if git("merge-base", "--is-ancestor", commit, "HEAD").returncode != 0:
        pytest.fail(f"the GPU record's commit {commit} is not an ancestor of HEAD")
    later = git("log", "--format=%h %s", f"{commit}..HEAD", "--", *GPU_PATHS).stdout.strip()
    assert not later, (f"commits after the GPU record ({commit}) change code only a GPU run checks; run "
                       f"benchmarks/gpu_tests.sh on a GPU and commit its log:\n{later}")

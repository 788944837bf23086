"""experiments/detached.sh: a command in a session of its own that later calls wait on and stop."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "detached.sh"


def detached(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_start_wait_and_copy(tmp_path):
    work, dest = tmp_path / "work", tmp_path / "dest"
    started = detached("start", str(work), "bash", "-c", f"echo hello; sleep 1; echo x > {work}/result.txt; exit 4")
    assert started.returncode == 0 and "started process group" in started.stdout
    early = detached("wait", str(work), "0", str(dest))
    assert early.returncode == 3 and "still running" in early.stdout  # the caller's next call waits again
    ended = detached("wait", str(work), "30", str(dest))
    assert ended.returncode == 0 and "ended with status 4" in ended.stdout
    assert (dest / "result.txt").read_text() == "x\n" and (dest / "log").read_text() == "hello\n"
    assert (dest / "exit_status").read_text().strip() == "4"


def test_the_command_leads_its_own_session(tmp_path):
    work = tmp_path / "work"
    assert detached("start", str(work), "sleep", "30").returncode == 0
    group = int((work / "pgid").read_text())
    try:
        assert os.getsid(group) == group != os.getsid(0)  # it outlives a call that kills its own group
        again = detached("start", str(work), "sleep", "30")
        assert again.returncode == 1 and "still runs" in again.stderr
    finally:
        stopped = detached("stop", str(work))
    assert stopped.returncode == 0 and f"stopped process group {group}" in stopped.stdout
    gone = detached("wait", str(work), "10")
    assert gone.returncode == 0 and "killed" in gone.stdout
    with pytest.raises(ProcessLookupError):
        os.killpg(group, 0)


def test_usage_and_nothing_started(tmp_path):
    assert detached("start").returncode == 2
    missing = detached("wait", str(tmp_path / "none"), "1")
    assert missing.returncode == 1 and "nothing was started" in missing.stderr

"""``benchmarks/engine_host.py``: the engine's host work on the jobs of issue 65 with the network
taken out (a smoke run: every request finishes, the runner's time is taken out, and the runner's
classes are as they were afterwards)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_engine_host_short_run(tmp_path):
    out = tmp_path / "host.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engine_host.py"), "--out", str(out), "--jobs",
                    "fewshot", "mixed", "--cases", "none", "shared-fixed", "--requests", "12", "--repeats", "2"],
                   check=True, timeout=240, capture_output=True)
    rows = json.loads(out.read_text())["results"]
    assert [(r["job"], r["case"]) for r in rows] == [("fewshot", "none"), ("fewshot", "shared-fixed"),
                                                    ("mixed", "none"), ("mixed", "shared-fixed")]
    for row in rows:
        assert len(row["runs"]) == 2 and row["requests"] == 12 and row["steps"] > 0
        for run in row["runs"]:
            assert run["finished"] == 12
            assert 0 < run["engine_ms"] < run["wall_ms"] and run["runner_ms"] > 0


def test_the_runner_is_restored():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import engine_host

    from cyb.engine.runner import Runner

    before = {name: Runner.__dict__[name] for name in ("_forward", *engine_host._Timed.CALLS)}
    with engine_host._Timed(8):
        assert Runner.__dict__["_forward"] is not before["_forward"]
    assert {name: Runner.__dict__[name] for name in before} == before

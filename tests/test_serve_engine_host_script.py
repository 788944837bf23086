"""``benchmarks/serve_engine_host.py``: the engine process's host work a step, with a stand-in
engine on the CPU (a smoke run: both runs make steps and every token of a step comes back)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_serve_engine_host_short_run(tmp_path):
    out = tmp_path / "host.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serve_engine_host.py"), "--out", str(out),
                    "--seconds", "0.3", "--slots", "8", "--links", "2", "--host-ms", "0.2"],
                   check=True, timeout=240, capture_output=True)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["run"], r["links"]) for r in rows] == [("alone", 0), ("served", 2)]
    for r in rows:
        assert r["steps"] > 0 and 0 < r["tokens_per_step"] <= 8

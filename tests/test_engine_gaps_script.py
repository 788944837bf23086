"""``benchmarks/engine_gaps.py --quick``: the step timeline of the traffic job on a tiny CPU model
(a smoke run of the script: it writes its JSON, and every token's gap is put down to a step)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_engine_gaps_quick_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engine_gaps.py"), "--quick", "--out",
                           str(tmp_path), "--requests", "6", "--concurrency", "3", "--cases", "none",
                           "--options", "prefill_rows=2"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    res = json.loads((tmp_path / "gaps-none-prefill_rows2.json").read_text())
    summary, steps = res["summary"], res["steps"]
    assert summary["steps"] == len(steps) > 0
    assert sum(s["tokens"] for s in steps) == sum(res["gap_histogram_ms"].values()) + 6  # a gap after each first token
    assert sum(s["prefill_forwards"] for s in steps) >= 1 and summary["itl_ms_p50"] > 0

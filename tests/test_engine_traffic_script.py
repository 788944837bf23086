"""``benchmarks/engine_traffic.py --quick``: the continuous engine against static batches on a
tiny model on the CPU (a smoke run), with further engine options for every engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "benchmarks" / "engine_traffic.py")


def test_engine_traffic_quick_run_with_options(tmp_path):
    subprocess.run([sys.executable, SCRIPT, "--quick", "--out", str(tmp_path), "--cases", "shared-fixed",
                    "--requests", "6", "--concurrency", "3", "--refill", "0",
                    "--options", "prefill_chunk=16", "prefill_rows=2"],
                   check=True, timeout=300, capture_output=True)
    result = json.loads((tmp_path / "traffic-prefill_chunk16-prefill_rows2.json").read_text())
    assert result["options"] == {"prefill_chunk": 16, "prefill_rows": 2}
    row = result["cases"]["shared-fixed"]
    cont, static = row["continuous_refill0"], row["static"]
    assert cont["real_tokens"] == static["real_tokens"] > 0
    assert cont["stats"]["prefill_positions"] <= 2 * 16 * cont["stats"]["prefill_forwards"]  # 2 rows of 16 a forward
    assert row["continuous_vs_static"] > 0


def test_engine_traffic_refuses_options_that_are_not_pairs(tmp_path):
    run = subprocess.run([sys.executable, SCRIPT, "--quick", "--out", str(tmp_path), "--options", "prefill_chunk"],
                         timeout=120, capture_output=True, text=True)
    assert run.returncode == 2 and "--options takes name=int pairs" in run.stderr

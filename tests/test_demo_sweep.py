"""experiments/demo_sweep.py: one job of the smoke grid end to end, and the summary table."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "demo_sweep.py"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("demo_sweep", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grids_are_valid_demo_settings(sweep):
    from cyb.demo import DemoSettings

    for grid, rows in sweep.GRIDS.items():
        for name, row in rows.items():
            DemoSettings.from_dict({**sweep.GRID_DEFAULTS[grid], **row}).validate()


def test_smoke_job_and_summary(sweep, tmp_path):
    (name, row), = sweep.GRIDS["smoke"].items()
    job = {"name": name, "seed": 3, "device": "cpu", "out": str(tmp_path / "runs" / f"{name}-s3"),
           "settings": {**sweep.GRID_DEFAULTS["smoke"], **row}}
    line = sweep.run_job(job)
    assert "error" not in line, line
    assert set(line["methods"]) == {"baseline", "tbys", "cyb"}
    assert not list((tmp_path / "runs").glob("*/runs/*/final"))  # weights are not kept
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps(line) + "\n" + json.dumps({"name": name, "seed": 4, "error": "x"}) + "\n")
    table = sweep.summary_table([results])
    assert f"| {name} | 3 |" in table and "mean" in table

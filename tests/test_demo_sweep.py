"""experiments/demo_sweep.py: one job of the smoke grid end to end, and the summary table."""

import json

import pytest

from experiments import demo_sweep


@pytest.fixture(scope="module")
def sweep():
    return demo_sweep


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
    assert not list((tmp_path / "runs").glob("*/runs/*/ckpt-*"))
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps(line) + "\n" + json.dumps({"name": name, "seed": 4, "error": "x"}) + "\n")
    table = sweep.summary_table([results])
    assert f"| {name} | 3 |" in table and "mean" in table


def test_jobs_are_one_method_each_seed_by_seed_longest_first(sweep, tmp_path):
    jobs = sweep.make_jobs("demo14", [0, 1], tmp_path, ["add3-M4-h32", "add3-M2-h32-psi0.5"])
    methods = sweep.GRID_DEFAULTS["demo14"]["methods"]
    assert len(jobs) == 2 * 2 * len(methods)
    assert [j["seed"] for j in jobs] == [0] * (2 * len(methods)) + [1] * (2 * len(methods))
    first = jobs[: 2 * len(methods)]
    assert [j["estimate"] for j in first] == sorted((j["estimate"] for j in first), reverse=True)
    for job in jobs:
        (method,) = job["settings"]["methods"]
        assert set(job["settings"]["method_options"]) <= {method}
    ponder = next(j for j in jobs if j["settings"]["methods"] == ["cyb_ponder"])
    assert ponder["settings"]["method_options"]["cyb_ponder"]["ponder_cost"] < 0


def test_jobs_can_be_limited_to_some_methods(sweep, tmp_path):
    jobs = sweep.make_jobs("visibility", [0, 1], tmp_path, ["add3-gated-frozen"], ["cyb_decoupled"])
    assert [(j["seed"], j["settings"]["methods"]) for j in jobs] == [(0, ["cyb_decoupled"]), (1, ["cyb_decoupled"])]
    assert jobs[0]["settings"]["method_options"] == {"cyb_decoupled": {"pause_gate_lr": 0.0}}


def test_job_past_its_deadline_is_skipped(sweep, tmp_path):
    line = sweep.run_job({"name": "x", "seed": 0, "deadline": 0.0, "out": str(tmp_path), "settings": {}})
    assert line == {"name": "x", "seed": 0, "skipped": "budget"}


def _line(name, seed, method, exact, acc, steps):
    return {"name": name, "seed": seed, "seconds": 1.0, "methods": {method: {
        "exact_match": exact, "mean_steps": sum(steps) / len(steps), "per_position_accuracy": acc,
        "per_position_steps": steps}}}


def test_summary_merges_methods_and_counts_the_criterion(sweep, tmp_path):
    # answer positions 0, 1 and <eos>; position 0 is the hard one
    lines = [_line("r", 0, "baseline", 0.10, [0.2, 0.9, 1.0], [1, 1, 1]),
             _line("r", 0, "tbys", 0.50, [0.6, 0.9, 1.0], [4, 4, 4]),
             _line("r", 0, "cyb", 0.60, [0.7, 0.95, 1.0], [2.5, 1.2, 1.0]),
             _line("r", 1, "baseline", 0.10, [0.2, 0.9, 1.0], [1, 1, 1]),
             _line("r", 1, "tbys", 0.50, [0.6, 0.9, 1.0], [4, 4, 4]),
             _line("r", 1, "cyb", 0.60, [0.7, 0.95, 1.0], [1.0, 1.0, 1.0])]  # no more steps where hard
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    runs = sweep.merged_runs([path])
    assert set(runs["r"][0]["methods"]) == {"baseline", "tbys", "cyb"}
    assert sweep.hard_easy_steps(runs["r"][0], "cyb") == (2.5, 1.2)
    assert sweep.meets_criterion(runs["r"][0], "cyb") and not sweep.meets_criterion(runs["r"][1], "cyb")
    assert "| r | cyb | 1 of 2 (0) |" in sweep.summary_table([path])

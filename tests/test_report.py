"""``cyb report``: runs side by side in the layout of the paper's appendix F tables."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from cyb.cli import main
from cyb.eval import evaluate
from cyb.report import build_report, load_run
from cyb.report.tables import pause_table, results_rows, results_table
from test_evaluate import make_tiny_runs

NAMES = {"baseline": "Baseline", "tbys": "TBYS 2 pauses", "cyb": "CYB 2 pauses"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return make_tiny_runs(tmp_path_factory.getbasetemp() / "cyb-tiny-runs")


@pytest.fixture(scope="module")
def copies(runs, tmp_path_factory):
    """Copies of the runs, the CYB and TBYS ones with cyb eval output (RUN/eval)."""
    root = tmp_path_factory.mktemp("report-runs")
    out = {}
    for method, path in runs.items():
        out[method] = root / method
        shutil.copytree(path, out[method], ignore=shutil.ignore_patterns("ckpt-*", "eval"))
    for method in ("tbys", "cyb"):
        evaluate(out[method], max_tokens=None, progress=False)
    return out


def _table_rows(markdown: str) -> dict[str, list[str]]:
    """Rows of the first Markdown table, by method name."""
    rows, started = {}, False
    for line in markdown.splitlines():
        if not line.startswith("|"):
            if started:
                break
            continue
        started = True
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] not in ("Method", "---"):
            rows[cells[0]] = cells[1:]
    return rows


def _number(cell: str) -> float:
    return float(cell.strip("*").rstrip("%"))


def test_report_table_follows_formula(runs, tmp_path):
    result = build_report(list(runs.values()), tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    rows = _table_rows(md)
    assert set(rows) == set(NAMES.values())
    assert result["reference"] == "TBYS 2 pauses"  # the TBYS run with the most pauses
    assert rows["TBYS 2 pauses"][1] == "---"
    ref = json.loads((runs["tbys"] / "final_metrics.json").read_text())["ppl"]
    for method in ("baseline", "cyb"):
        ppl = json.loads((runs[method] / "final_metrics.json").read_text())["ppl"]
        cells = rows[NAMES[method]]
        assert _number(cells[0]) == pytest.approx(ppl, abs=6e-4)
        assert _number(cells[1]) == pytest.approx((ref - ppl) / ref * 100, abs=6e-3)
    assert rows["CYB 2 pauses"][2] != "" and rows["Baseline"][2] == ""  # mean steps only with dk
    assert md.index("| Baseline |") < md.index("| TBYS 2 pauses |") < md.index("| CYB 2 pauses |")
    page = (tmp_path / "rep" / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 2 and "<table>" in page
    assert (tmp_path / "rep" / "training_curves.png").stat().st_size > 0
    saved = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert {e["name"] for e in saved["entries"]} == set(NAMES.values())


def test_report_uses_eval_output_and_latency(copies, tmp_path):
    result = build_report([copies[m] for m in ("cyb", "tbys", "baseline")], tmp_path / "rep", reference="Baseline")
    by_name = {e["name"]: e for e in result["entries"]}
    cyb_eval = json.loads((copies["cyb"] / "eval" / "metrics.json").read_text())
    assert by_name["CYB 2 pauses"]["source"] == "eval"
    assert by_name["CYB 2 pauses"]["ppl"] == pytest.approx(cyb_eval["perplexity"]["ppl"])
    assert by_name["Baseline"]["source"] == "training"
    assert by_name["Baseline"]["relative_improvement_pct"] is None
    assert any("different evaluations" in n for n in result["notes"])
    assert "latency" in result["files"] and (tmp_path / "rep" / "latency.png").is_file()
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Calibration" in md and "Pause statistics: CYB 2 pauses" in md
    assert _table_rows(md)["Baseline"][1] == "---"


def test_cli_report_and_errors(runs, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["report", *map(str, runs.values()), "--out", str(out), "--reference", "cyb"]) == 0
    text = capsys.readouterr().out
    assert "| CYB 2 pauses |" in text and "---" in text
    assert json.loads((out / "report.json").read_text())["command"].startswith("cyb report")
    assert main(["report", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "notarun").mkdir()
    assert main(["report", str(tmp_path / "notarun"), "--out", str(out)]) == 2
    assert "is not a run folder" in capsys.readouterr().err
    assert main(["report", str(runs["cyb"]), "--reference", "nope", "--out", str(out)]) == 2
    assert "matches no run" in capsys.readouterr().err


def test_an_unfinished_run_is_said_so_and_the_page_shows_code_not_backticks(copies, tmp_path):
    unfinished = tmp_path / "unfinished"
    shutil.copytree(copies["cyb"], unfinished, ignore=shutil.ignore_patterns("eval", "final", "final_metrics.json"))
    result = build_report([unfinished, copies["tbys"]], tmp_path / "rep")
    notes = " ".join(result["notes"])
    assert "compare with care" not in notes and ": none" not in notes
    assert f"CYB 2 pauses has no perplexity yet: its training has not finished (no final_metrics.json in {unfinished})" in notes
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "<code>cyb eval</code>" in page and "`" not in page


def test_load_run_name_and_curves(runs):
    r = load_run(runs["cyb"])
    assert r.name == "CYB 2 pauses" and r.num_steps == 3 and r.ppl_source == "training"
    assert r.curves["train"] and r.curves["valid"]


def test_results_table_reproduces_paper_columns():
    # appendix F, fine-tuned Gemma3-4B (rows whose printed improvement follows from the printed,
    # rounded perplexities)
    entries = [{"name": n, "ppl": p} for n, p in (
        ("Baseline", 10.670), ("TBYS 1 pause", 10.512), ("TBYS 3 pauses", 10.359),
        ("CYB 1 pause", 10.351), ("CYB 2 pauses", 10.210), ("CYB 3 pauses", 10.131))]
    _, rows = results_rows(entries, "TBYS 3 pauses")
    got = {r[0]: r[2] for r in rows}
    assert got == {"Baseline": "-3.00%", "TBYS 1 pause": "-1.48%", "TBYS 3 pauses": "---",
                   "CYB 1 pause": "+0.08%", "CYB 2 pauses": "+1.44%", "CYB 3 pauses": "**+2.20%**"}
    assert [r[1] for r in rows if r[0] == "CYB 3 pauses"] == ["**10.131**"]
    assert re.search(r"\| TBYS 3 pauses \| 10\.359 \| --- \|", results_table(entries, "TBYS 3 pauses"))
    with pytest.raises(ValueError, match="not among"):
        results_rows(entries, "TBYS 9 pauses")


def test_pause_table_layout():
    cell = lambda *toks: [{"token": t, "count": 9, "median": 0.0, "variance": 0.0, "mean": 0.0} for t in toks]
    stats = {"cells": {"low_median_low_variance": cell("isn", " wasn"), "high_median_low_variance": cell("devices"),
                       "low_median_high_variance": cell("g"), "high_median_high_variance": []},
             "split": {"median": 1.0, "variance": 0.1}, "tokens": 4, "min_count": 5, "attribution": "input"}
    md = pause_table(stats)
    assert "| **Low variance** | isn, \u2423wasn | devices |" in md
    assert "| **High variance** | g | (none) |" in md


def test_report_shows_steps_and_skips_a_stale_eval(copies, tmp_path):
    """An eval of an earlier step of the model is not used; the note says so and what to do."""
    run = tmp_path / "cyb"
    shutil.copytree(copies["cyb"], run)
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    final = json.loads((run / "final_metrics.json").read_text())
    assert metrics["target"]["step"] == final["step"]
    fresh = load_run(run)
    assert fresh.ppl_source == "eval" and fresh.step == final["step"] and fresh.warning is None
    metrics["target"]["step"] = final["step"] - 4  # as after resuming the run past cyb eval
    (run / "eval" / "metrics.json").write_text(json.dumps(metrics))
    stale = load_run(run)
    assert stale.ppl_source == "training" and stale.ppl == pytest.approx(final["ppl"])
    assert f"step {final['step'] - 4}" in stale.warning and "rerun `cyb eval" in stale.warning
    result = build_report([run, copies["baseline"]], tmp_path / "rep")
    assert any("rerun `cyb eval" in n for n in result["notes"])
    assert all(e["step"] == final["step"] for e in result["entries"])
    only_training = build_report([copies["baseline"]], tmp_path / "rep2")
    assert any("end of training" in n for n in only_training["notes"])
    assert not any("different evaluations" in n for n in only_training["notes"])

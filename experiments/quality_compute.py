"""Held-out perplexity against network forwards per real token for the fine-tuning rows
(results/experiments/text and the recipes of results/experiments/recipes that move CYB along
the compute axis, three seeds; results/experiments/smollm2, 500 steps, three
seeds, full fine-tuning; results/experiments/smollm2-epoch, one epoch, three seeds)::

    python experiments/quality_compute.py [OUT.png]      # default results/experiments/quality_compute.png

A baseline runs 1 forward per real token, TBYS and fixed-mode decoding ``M``, CYB decoded
adaptively ``E[S]`` (hollow where adaptive decoding does not reproduce training's contexts:
shared pauses).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from cyb.report.plots import quality_compute

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:  # run as a script: the repository root holds experiments/ and benchmarks/
    sys.path.insert(0, REPO_ROOT)

RESULTS = Path(__file__).resolve().parents[1] / "results" / "experiments"


def _job_labels(suite: str) -> dict[str, str]:
    """``{run name: row label}`` of a suite of experiments/run_suite.py, seeds 0-4."""
    from collections import defaultdict

    from experiments import run_suite

    scale = run_suite.SCALES["smollm2" if suite == "smollm2" else "gpu"]
    files = defaultdict(str)
    return {j.name: j.label for seed in range(5)
            for j in run_suite.suite_jobs(suite, seed, scale, files, Path("outputs"))}


def _rows(folder: Path) -> list[dict]:
    """The finished rows of ``summary.jsonl``, and any run folder whose training finished but
    whose row was not written (a job stopped during its whole-file evaluation)."""
    import yaml

    from experiments.make_results import load

    rows = {r["name"]: r for r in load(folder)}
    for final in folder.glob("*/final_metrics.json"):
        name = final.parent.name
        if "final" not in rows.get(name, {}):
            cfg = yaml.safe_load((final.parent / "config.yaml").read_text())
            suite = next((r["suite"] for r in rows.values()), "")
            label = _job_labels(suite).get(name, name)
            rows[name] = {"name": name, "suite": suite, "label": label, "method": cfg["method"],
                          "final": json.loads(final.read_text())}
    return [r for r in rows.values() if "final" in r]


def _point(label: str, runs: list[dict]) -> dict:
    m = runs[0]["method"]
    pauses = m["name"] not in ("baseline", "baseline_nx")
    ppl = [r["final"]["ppl"] for r in runs]
    steps = [r["final"]["mean_steps"] for r in runs if r["final"].get("mean_steps") is not None]
    private = m.get("pause_visibility") == "private"
    forwards = statistics.mean(steps) if steps else (m["num_steps"] if pauses else 1)
    return {"label": label, "forwards": forwards, "ppl": statistics.mean(ppl),
            "ppl_sd": statistics.stdev(ppl) if len(ppl) > 1 else None, "method": m["name"],
            "exact": not steps or private}


def points(folder: Path, suite: str) -> list[dict]:
    """One point per row of ``folder`` (full fine-tuning: LoRA rows and the base left out)."""
    groups: dict[str, list[dict]] = {}
    for r in _rows(folder):
        if r["suite"] == suite and not r["label"].startswith("Pretrained base") and "LoRA" not in r["label"]:
            groups.setdefault(r["label"], []).append(r)
    return [_point(label, runs) for label, runs in groups.items()]


#: the recipes (results/experiments/recipes, fine-tuned as the finetune suite, same bases and
#: seeds) that move CYB along the compute axis: a ponder reward pauses more, the others differ in
#: how the steps are trained
CURVE_RECIPES = ("CYB-ponder tau=-0.05", "CYB-ponder tau=-0.02", "CYB-anytime w=0.1", "CYB-decoupled")


def main(out: str = str(RESULTS / "quality_compute.png")) -> Path:
    recipes = [p for p in points(RESULTS / "recipes", "recipes") if p["label"] in CURVE_RECIPES]
    panels = {"fine-tuning a model pretrained here (techdocs, 3 seeds)": points(RESULTS / "text", "finetune") + recipes,
              "fine-tuning SmolLM2-135M, 500 steps (3 seeds)": points(RESULTS / "smollm2", "smollm2"),
              "fine-tuning SmolLM2-135M, one epoch (3 seeds)": points(RESULTS / "smollm2-epoch", "smollm2")}
    return quality_compute(out, panels)


if __name__ == "__main__":
    print(main(*sys.argv[1:]))

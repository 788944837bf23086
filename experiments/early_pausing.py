"""Where CYB's spread between pretraining seeds comes from, read from the runs' own logs: how fast
each seed stops pausing in the first steps, its largest gradient norm and its held-out perplexity
(docs/record/results/text.md, "Pretraining from scratch")::

    python experiments/early_pausing.py [results/experiments/text]

Prints a Markdown table of the CYB pretraining seeds, then the baselines' spread at the first
evaluation and the largest gradient norm of the TBYS seeds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[1] / "results" / "experiments" / "text"
#: the training steps whose logged E[S] the table shows (logged every 20 steps)
EARLY_STEPS = (40, 60, 100)


def read_run(folder: Path) -> dict:
    """``{"train": {step: row}, "valid": {step: row}}`` of a run's ``metrics.jsonl``."""
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {split: {r["step"]: r for r in rows if r.get("split") == split} for split in ("train", "valid")}


def largest_grad_norm(run: dict) -> tuple[float, int]:
    """``(norm, step)`` of the largest logged gradient norm."""
    step, row = max(run["train"].items(), key=lambda kv: kv[1].get("grad_norm") or 0.0)
    return row.get("grad_norm") or 0.0, step


def seeds(folder: Path, method: str) -> dict[int, dict]:
    """The pretraining runs ``pre-METHOD-sN`` of ``folder``, by seed."""
    out = {}
    for run in sorted(folder.glob(f"pre-{method}-s[0-9]*")):
        out[int(run.name.rsplit("-s", 1)[1])] = read_run(run)
    return out


def table(folder: Path) -> str:
    """The CYB seeds, best final perplexity first."""
    cyb = seeds(folder, "cyb")
    lines = ["| seed | E[S] at step " + " / ".join(map(str, EARLY_STEPS)) +
             " | largest gradient norm (step) | held-out ppl at the first / last evaluation |",
             "|---|---|---|---|"]
    for seed, run in sorted(cyb.items(), key=lambda kv: kv[1]["valid"][max(kv[1]["valid"])]["ppl"]):
        early = " / ".join(f"{run['train'][s]['mean_steps']:.2f}" for s in EARLY_STEPS if s in run["train"])
        norm, at = largest_grad_norm(run)
        evals = sorted(s for s in run["valid"] if s > 0)
        lines.append(f"| {seed} | {early} | {norm:.2f} ({at}) | {run['valid'][evals[0]]['ppl']:.1f} / "
                     f"{run['valid'][evals[-1]]['ppl']:.1f} |")
    return "\n".join(lines)


def others(folder: Path) -> str:
    """The baselines' perplexity at the first evaluation, and the TBYS seeds' largest gradient norms."""
    base = seeds(folder, "baseline")
    first = min(s for s in next(iter(base.values()))["valid"] if s > 0) if base else None
    ppl = ", ".join(f"{run['valid'][first]['ppl']:.1f}" for _, run in sorted(base.items())) if base else "-"
    norms = [largest_grad_norm(run) for _, run in sorted(seeds(folder, "tbys").items())]
    tbys = ", ".join(f"{norm:.2f} ({step})" for norm, step in norms)
    return f"baseline seeds at step {first}: {ppl}\nTBYS seeds' largest gradient norm (step): {tbys or '-'}"


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    print(table(folder))
    print()
    print(others(folder))


if __name__ == "__main__":
    main()

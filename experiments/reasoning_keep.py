"""Fold what a GPU call of the reasoning suite returned into the results kept in the repository.

    python experiments/reasoning_keep.py PACK.tar.gz [...] [--into results/experiments/reasoning]

Each pack (``reasoning.tar.gz`` of ``experiments/reasoning_gpu.sh``, or an unpacked suite
folder) adds its runs to ``--into``: the rows of ``summary.jsonl`` (per run the newest finished
row wins; a failed row is kept only while the run has none), the pilot's choice, and of each run
the small files that say what it did (its configuration, training curve, final metrics, the
eval's summary, the decode time measured alone, and the generated answers, gzipped); then the
tables and the figure are made again (``experiments/reasoning_report.py``).  The next GPU call
starts from this summary (``experiments/reasoning_gpu.sh`` copies it when its machine has none),
so finished runs are not run twice across sessions.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:  # run as a script: the repository root holds experiments/
    sys.path.insert(0, REPO_ROOT)

from experiments.suite_runner import finished  # noqa: E402

#: Files of a run kept in the repository (beside the gzipped answers).
KEEP = ("config.yaml", "metrics.jsonl", "final_metrics.json", "run.json", "eval/summary.txt",
        "eval/pause_stats.md", "eval/timing.json", "eval/ablations.json")
ANSWERS = "eval/reasoning_gym.jsonl"


#: Machine paths in what a run wrote, and what the repository keeps instead: the staged model is
#: SmolLM2-135M by its short name, run folders relative to the repository.
_PORTABLE = ((re.compile(r"/tmp/cyb/smollm2"), "smollm2-135m"),
             (re.compile(r"(?<![\w.])/[^\s\"']*?/(outputs/reasoning/)"), r"\1"))


def portable(text: str) -> str:
    """``text`` without the paths of the machine it ran on."""
    for pattern, repl in _PORTABLE:
        text = pattern.sub(repl, text)
    return text


def merge_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """One row per run name, in first-seen order: the newest finished row, else the newest (a run
    trained again whose scoring was cut keeps the scored row of an earlier machine)."""
    rows: dict[str, dict] = {}
    for r in old + new:
        have = rows.get(r["name"])
        if have is None or finished(r) or not finished(have):
            rows[r["name"]] = r
    return list(rows.values())


def _read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def keep(folder: Path, into: Path) -> int:
    """Fold the suite folder ``folder`` into ``into``; returns the number of runs copied."""
    into.mkdir(parents=True, exist_ok=True)
    rows = merge_rows(_read_rows(into / "summary.jsonl"), _read_rows(folder / "summary.jsonl"))
    (into / "summary.jsonl").write_text(portable("".join(json.dumps(r) + "\n" for r in rows)))
    for name in ("reasoning-choice.json", "scale.json"):
        if (folder / name).is_file():
            shutil.copy2(folder / name, into / name)
    newest = {r["name"]: r for r in _read_rows(folder / "summary.jsonl")}
    copied = 0
    for run in sorted(folder.glob("rg-*")):
        if not finished(newest.get(run.name, {})):
            continue  # cut by a deadline (in training or in its scoring): it runs again
        for rel in KEEP:
            if (run / rel).is_file():
                (into / run.name / rel).parent.mkdir(parents=True, exist_ok=True)
                (into / run.name / rel).write_text(portable((run / rel).read_text()))
        if (run / ANSWERS).is_file():
            (into / run.name / ANSWERS).parent.mkdir(parents=True, exist_ok=True)
            with open(run / ANSWERS, "rb") as src, gzip.open(into / run.name / (ANSWERS + ".gz"), "wb") as dst:
                shutil.copyfileobj(src, dst)
        copied += 1
    return copied


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("packs", nargs="+", type=Path, help="reasoning.tar.gz files or unpacked suite folders")
    p.add_argument("--into", type=Path, default=Path("results/experiments/reasoning"))
    args = p.parse_args(argv)
    for pack in args.packs:
        if pack.is_dir():
            n = keep(pack, args.into)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                with tarfile.open(pack) as tar:
                    tar.extractall(tmp, filter="data")
                [folder] = [d for d in Path(tmp).iterdir() if d.is_dir()]
                n = keep(folder, args.into)
        print(f"{pack}: {n} finished runs kept in {args.into}")
    from experiments import reasoning_report

    return reasoning_report.main([str(args.into)])


if __name__ == "__main__":
    sys.exit(main())

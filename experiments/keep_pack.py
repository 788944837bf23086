"""Fold what a GPU call returned into the results kept in the repository.

    python experiments/keep_pack.py PACK.tar.gz [...] --into results/experiments/smollm2-arith

A pack is the ``.tar.gz`` that ``experiments/run_suite.py --pack`` writes after every finished
run (``experiments/suite_runner.pack``: no weights), or an unpacked suite folder.  Each adds its
runs to ``--into``: the rows of ``summary.jsonl`` (per run the newest finished row wins; a failed
row is kept only while the run has none), ``scale.json``, the drivers' per-run logs, the configs
the runs were started from, and the files of every run whose newest row is finished, without its
saved model (``final/``) and lock; machine paths are written as ``smollm2-135m`` (the staged
model), ``../shared/data/techdocs`` (the staged corpus) and run folders relative to the
repository.  Then the suite's tables are made again (``experiments/make_results.py``).  The
reasoning suite keeps less of each run and has its own report: ``experiments/reasoning_keep.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:  # run as a script: the repository root holds experiments/
    sys.path.insert(0, REPO_ROOT)

from experiments.suite_runner import finished  # noqa: E402

#: Machine paths in what a run wrote, and what the repository keeps instead.
_PORTABLE = ((re.compile(r"/tmp/cyb/smollm2"), "smollm2-135m"),
             (re.compile(r"/tmp/cyb/techdocs"), "../shared/data/techdocs"),
             (re.compile(r"(?<![\w.])/[^\s\"']*?/(outputs/)"), r"\1"))

#: What a run folder holds that the repository does not keep.
_SKIP_DIRS, _SKIP_FILES = ("final",), ("train.lock",)


def portable(text: str) -> str:
    """``text`` without the paths of the machine it ran on."""
    for pattern, repl in _PORTABLE:
        text = pattern.sub(repl, text)
    return text


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def merge_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """One row per run name, in first-seen order: the newest finished row, else the newest (a run
    trained again whose scoring was cut keeps the scored row of an earlier machine)."""
    rows: dict[str, dict] = {}
    for r in old + new:
        have = rows.get(r["name"])
        if have is None or finished(r) or not finished(have):
            rows[r["name"]] = r
    return list(rows.values())


def _copy(src: Path, dst: Path, gzipped: bool = False) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if gzipped:
        # no time stamp in the header: the same answers give the same bytes (no churn in git)
        with open(src, "rb") as f, gzip.GzipFile(dst.with_name(dst.name + ".gz"), "wb", mtime=0) as out:
            shutil.copyfileobj(f, out)
    else:
        try:
            dst.write_text(portable(src.read_text()))
        except UnicodeDecodeError:  # a figure
            shutil.copy2(src, dst)


def fold(folder: Path, into: Path, *, runs: str = "*", files: tuple[str, ...] | None = None,
         gzipped: tuple[str, ...] = (), logs: bool = True) -> int:
    """Fold the suite folder ``folder`` into ``into``; returns the number of finished runs copied.
    ``runs``: the glob of run folders; ``files``: the files of a run to keep (default all but its
    model and lock); ``gzipped``: of those, the ones kept gzipped; ``logs``: keep the drivers'
    per-run logs and the runs' configs too."""
    into.mkdir(parents=True, exist_ok=True)
    newest = {r["name"]: r for r in read_rows(folder / "summary.jsonl")}
    rows = merge_rows(read_rows(into / "summary.jsonl"), read_rows(folder / "summary.jsonl"))
    (into / "summary.jsonl").write_text(portable("".join(json.dumps(r) + "\n" for r in rows)))
    kept = [folder / "scale.json", folder / "reasoning-choice.json", folder / "timing.json"]
    if logs:
        kept += [*sorted((folder / "logs").glob("*.log")), *sorted(folder.glob("*/configs/*.yaml"))]
    for extra in kept:
        if extra.is_file():
            _copy(extra, into / extra.relative_to(folder))
    copied = 0
    for run in sorted(p for p in folder.glob(runs) if p.is_dir() and p.name in newest):
        if not finished(newest[run.name]):
            continue  # cut by a deadline (in training or in its scoring): it runs again
        names = files if files is not None else [
            str(p.relative_to(run)) for p in sorted(run.rglob("*")) if p.is_file() and p.name not in _SKIP_FILES
            and p.relative_to(run).parts[0] not in _SKIP_DIRS]
        for rel in names:
            if (run / rel).is_file():
                _copy(run / rel, into / run.name / rel, gzipped=rel in gzipped)
        copied += 1
    return copied


@contextlib.contextmanager
def unpacked(pack: Path) -> Iterator[Path]:
    """The suite folder of ``pack`` (a ``.tar.gz`` unpacked into a temporary folder, or a folder)."""
    if pack.is_dir():
        yield pack
        return
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(pack) as tar:
            tar.extractall(tmp, filter="data")
        [folder] = [d for d in Path(tmp).iterdir() if d.is_dir()]
        yield folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("packs", nargs="+", type=Path, help="the .tar.gz files a GPU call returned, or unpacked suite folders")
    p.add_argument("--into", type=Path, required=True, help="the suite's results folder, e.g. results/experiments/smollm2-arith")
    args = p.parse_args(argv)
    for pack in args.packs:
        with unpacked(pack) as folder:
            n = fold(folder, args.into)
        print(f"{pack}: {n} finished runs kept in {args.into}")
    from experiments import make_results

    make_results.main([str(args.into)])
    return 0


if __name__ == "__main__":
    sys.exit(main())

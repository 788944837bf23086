"""``cyb report RUN [RUN ...] [--out DIR] [--reference NAME]``."""

from __future__ import annotations

import argparse
import shlex
import sys

HELP = "compare runs side by side: perplexity table (paper appendix F), training curves, latency"
#: output paths checked before the command runs (:func:`cyb.files.unwritable`)
OUTPUTS = {"out": ("--out", "folder")}


# Help texts that explain their own default end with this: it renders as nothing, and its
# presence stops the "(default: None)" suffix of ArgumentDefaultsHelpFormatter.
_OWN_DEFAULT = "%(default).0s"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders written by cyb train (and cyb eval)")
    p.add_argument("--out", default="runs/report", metavar="DIR", help="output folder")
    p.add_argument("--reference", default=None, metavar="NAME",
                   help="reference run for the relative improvement, by display name (e.g. 'TBYS 3 pauses') "
                        "or folder name; default: the TBYS run with the most pauses, else the first run" + _OWN_DEFAULT)
    p.add_argument("--eval-dir", default="eval", metavar="NAME",
                   help="sub-folder of each run holding cyb eval's metrics.json")


def run(args) -> int:
    from ..report import build_report
    from ..report.tables import results_table

    command = _command(args)
    result = build_report(args.runs, args.out, reference=args.reference, command=command, eval_dir=args.eval_dir)
    print(results_table(result["entries"], result["reference"]))
    for note in result["notes"]:
        print(f"- {note}")
    print(f"written to {args.out}: " + ", ".join(result["files"].values()))
    return 0


def _command(args) -> str:
    """The command line that made the results (from sys.argv when run from a shell)."""
    if sys.argv[1:2] == ["report"]:
        return "cyb " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    opts = [f"--{k.replace('_', '-')} {shlex.quote(str(v))}" if v is not True else f"--{k.replace('_', '-')}"
            for k, v in sorted(vars(args).items()) if k not in ("command", "runs") and v not in (None, False)]
    return " ".join(["cyb report", " ".join(shlex.quote(r) for r in args.runs), *opts])

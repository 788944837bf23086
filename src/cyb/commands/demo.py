"""``cyb demo [--task NAME] [--steps N] [--seed S] [--quick] [--out DIR] [--methods ...] [--fresh]``."""

from __future__ import annotations

import argparse

HELP = ("train a no-pause baseline, TBYS, CYB and CYB-decoupled on a synthetic reasoning task and "
        "compare them (CPU, minutes, no data needed)")
#: output paths checked before the command runs (:func:`cyb.files.unwritable`)
OUTPUTS = {"out_dir": ("--out", "folder")}

_UNSET = argparse.SUPPRESS  # absent options stay absent, so the demo's presets apply


def _methods(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give a comma-separated list, e.g. baseline,tbys,cyb")
    return names


def _task_arg(text: str) -> tuple[str, int]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=INT, e.g. digits=4, got {text!r}")
    try:
        return key.strip(), int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{key.strip()}: expected an integer, got {value!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", default=_UNSET,
                   help="synthetic task: addition (default: 3 digits), multiplication (3-digit by "
                        "1-digit), 3sum, parity or lookup, each at its preset size")
    p.add_argument("--task-arg", dest="task_args", action="append", type=_task_arg, default=_UNSET,
                   metavar="KEY=INT", help="task size, e.g. --task-arg digits=4 (repeatable)")
    p.add_argument("--steps", dest="train_steps", type=int, default=_UNSET, metavar="N",
                   help="optimiser steps per method (default: 3000; 30 with --quick)")
    p.add_argument("--M", dest="num_steps", type=int, default=_UNSET, metavar="M",
                   help="steps per token for TBYS and CYB, the token and M-1 pauses (default: 4)")
    p.add_argument("--seed", type=int, default=_UNSET, help="seed of the initial weights, data and order "
                   "(default: 0)")
    p.add_argument("--quick", action="store_true",
                   help="a tiny run of seconds that exercises every piece (for tests; not a result)")
    p.add_argument("--out", dest="out_dir", default=_UNSET, metavar="DIR", help="report folder (default: runs/demo)")
    p.add_argument("--methods", type=_methods, default=_UNSET,
                   help="comma-separated methods (default: baseline, tbys, cyb, cyb_decoupled); any method "
                        "with blocks of steps, such as cyb_ponder (their fields: method_options in --config)")
    p.add_argument("--visibility", dest="pause_visibility", choices=("shared", "private", "gated"),
                   default=_UNSET, help="what later tokens see of a token's pauses: shared (default, the "
                   "paper's layout), private or gated (docs/concepts/layouts.md)")
    p.add_argument("--config", default=None,
                   help="YAML of demo settings, e.g. configs/demo/gpu.yaml; the options above override it")
    p.add_argument("--device", default=_UNSET, help="auto, cpu or cuda (default: auto)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--fresh", action="store_true",
                   help="train every method afresh, in place of the runs an earlier demo left in the report "
                        "folder (by default a finished run is reused and an interrupted one resumes)")


def run(args) -> int:
    from ..demo import demo_settings, run_demo

    given = {k: getattr(args, k) for k in ("train_steps", "num_steps", "seed", "out_dir", "methods",
                                           "device", "pause_visibility") if hasattr(args, k)}
    if args.no_progress:
        given["progress"] = False
    settings = demo_settings(getattr(args, "task", None), quick=args.quick, config=args.config, **given)
    if hasattr(args, "task_args"):
        settings.task_kwargs.update(dict(args.task_args))
        settings.validate()
    run_demo(settings, fresh=args.fresh)
    return 0

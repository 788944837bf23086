"""``cyb demo [--task NAME] [--steps N] [--seed S] [--quick] [--out DIR] [--methods ...]``."""

from __future__ import annotations

import argparse

HELP = ("train a no-pause baseline, TBYS and CYB on a synthetic reasoning task and compare them "
        "(CPU, minutes, no data needed)")


def _methods(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give a comma-separated list, e.g. baseline,tbys,cyb")
    return names


def _task_arg(text: str) -> tuple[str, int]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=INT, e.g. digits=5, got {text!r}")
    try:
        return key.strip(), int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{key.strip()}: expected an integer, got {value!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", default=None,
                   help="synthetic task: addition, multiplication, 3sum, parity or lookup "
                        "(default: addition, sized where pauses help)")
    p.add_argument("--task-arg", dest="task_args", action="append", default=[], type=_task_arg,
                   metavar="KEY=INT", help="task size, e.g. --task-arg digits=5 (repeatable)")
    p.add_argument("--steps", type=int, default=None, help="optimiser steps per method")
    p.add_argument("--seed", type=int, default=None, help="seed of init, data and order")
    p.add_argument("--quick", action="store_true",
                   help="a tiny run of seconds that exercises every piece (for tests)")
    p.add_argument("--out", default=None, help="report folder (default runs/demo)")
    p.add_argument("--methods", type=_methods, default=None,
                   help="comma-separated subset of baseline,tbys,cyb")
    p.add_argument("--config", default=None,
                   help="YAML of demo settings, e.g. configs/demo-gpu.yaml (flags override it)")
    p.add_argument("--device", default=None, help="auto, cpu or cuda")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args) -> int:
    from ..demo import demo_settings, run_demo

    settings = demo_settings(args.task, quick=args.quick, config=args.config,
                             train_steps=args.steps, seed=args.seed, out_dir=args.out,
                             methods=args.methods, device=args.device,
                             progress=False if args.no_progress else None)
    if args.task_args:
        settings.task_kwargs.update(dict(args.task_args))
        settings.validate()
    run_demo(settings)
    return 0

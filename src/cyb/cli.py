"""``cyb`` command line: train | eval | generate | merge | demo | bench | report.

Each subcommand lives in :mod:`cyb.commands` (arguments and a ``run`` function); the work
happens in the library modules, imported only when a command runs, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .commands import NAMES, HelpFormatter
from .extras import MissingPackage
from .pipes import pipe_safe


def _modules() -> dict:
    mods = {}
    for name in NAMES:
        try:
            mods[name] = importlib.import_module(f"cyb.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"cyb.commands.{name}":
                raise
    return mods


def build_parser(mods: dict | None = None) -> argparse.ArgumentParser:
    from . import __version__

    mods = mods if mods is not None else _modules()
    parser = argparse.ArgumentParser(
        prog="cyb",
        description="Train, run and analyse language models that pause for breath "
                    "(Catch Your Breath: <don't know> outputs and <pause> steps).")
    parser.add_argument("--version", action="version", version=f"cyb {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in mods.items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP,
                           formatter_class=HelpFormatter)
        mod.add_arguments(p)
    return parser


def _named_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the command that ``args`` names, to the deepest level (``cyb bench serve``'s)."""
    while True:
        subs = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if subs is None or getattr(args, subs.dest, None) not in subs.choices:
            return parser
        parser = subs.choices[getattr(args, subs.dest)]


def _quiet_weight_loading() -> None:
    """No per-file weight-loading bars from transformers under the commands' own output."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is a dependency
        return
    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    """Run the command that ``argv`` (default: the program's arguments) names; returns the exit
    status (141 where the reader of its output stopped early: :func:`cyb.pipes.pipe_safe`)."""
    return pipe_safe(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    mods = _modules()
    parser = build_parser(mods)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the command's own parser, with its usage (argparse would show cyb's)
        _named_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not args.command:
        parser.print_help()
        return 2
    try:
        if argv is None:  # the program itself: the CPU's numerics, pinned before torch computes anything
            from .cpu_numerics import pin

            pin()
    except ValueError as e:
        print(f"cyb {args.command}: error: {e}", file=sys.stderr)
        return 2
    problem = _unwritable_output(mods[args.command], args)
    if problem:  # said before the work, not after it
        print(f"cyb {args.command}: error: {problem}", file=sys.stderr)
        return 2
    _quiet_weight_loading()
    try:
        if argv is None:  # the program itself (not a caller passing arguments): its CPU threads
            from .cpu_numerics import check
            from .threads import configure

            configure()
            problem = check()
            if problem:
                print(f"warning: {problem}", file=sys.stderr)
        return int(mods[args.command].run(args) or 0)
    except KeyboardInterrupt as e:  # training says what is lost and how to resume
        print(str(e) or "interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away: pipe_safe ends quietly
        raise
    except (OSError, ValueError, MissingPackage) as e:  # OSError: a path that cannot be read or written
        print(f"cyb {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2


def _unwritable_output(mod, args: argparse.Namespace) -> str | None:
    """Why an output path of the command's (its module's ``OUTPUTS``: argument name -> ``(flag,
    "file" or "folder")``) could not be written, else None."""
    from .files import unwritable

    for dest, (flag, kind) in getattr(mod, "OUTPUTS", {}).items():
        value = getattr(args, dest, None)
        if isinstance(value, str) and value:
            reason = unwritable(value, folder=kind == "folder")
            if reason:
                return f"{flag} {value}: {reason}"
    return None


def _one_line(error: Exception) -> str:
    """``error`` as said after ``error:``; an OS error as its path(s) and reason, without the errno
    (``runs/x: File exists``)."""
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        paths = f"{error.filename} -> {error.filename2}" if error.filename2 is not None else f"{error.filename}"
        return f"{paths}: {error.strerror}"
    return str(error)


if __name__ == "__main__":
    sys.exit(main())

"""Subcommands of the ``cyb`` command line, one module each.

A module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.  It
imports nothing heavy at module level, so that ``cyb --help`` stays fast; the work is done by
the library modules it imports inside ``run``.
"""

NAMES = ("train", "eval", "generate", "merge", "fetch", "demo", "bench", "report")

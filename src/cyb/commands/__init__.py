"""Subcommands of the ``cyb`` command line, one module each.

A module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.  It
imports nothing heavy at module level, so that ``cyb --help`` stays fast; the work is done by
the library modules it imports inside ``run``.
"""

import argparse

NAMES = ("train", "eval", "generate", "serve", "merge", "fetch", "demo", "bench", "report")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds ``(default: X)`` to an option's help only where it tells something: not for
    positional arguments, a default of None or False, or a help text that already says its
    default."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (not action.option_strings or action.default in (None, False, argparse.SUPPRESS)
                or "(default" in text or "default:" in text or "%(default)" in text):
            return text
        return super()._get_help_string(action)

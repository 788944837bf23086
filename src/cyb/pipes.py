"""The process's standard output when its reader goes away: a command piped into ``head`` ends
quietly, with the status the shell gives ``cat`` or ``grep`` there."""

from __future__ import annotations

import os
import sys
from typing import Callable


def pipe_safe(run: Callable[[], int]) -> int:
    """``run()``'s exit status; where the reader of stdout stops early (``cyb train --help-config |
    head``), 141 instead, quietly, not a traceback."""
    try:
        try:
            return run()
        finally:  # what is still buffered meets the closed pipe here (after --help's SystemExit too)
            sys.stdout.flush()
    except BrokenPipeError:
        # Later writes, the interpreter's own flush at exit included, go nowhere instead of failing again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        # 128 + SIGPIPE: the status the shell reports for cat, grep or yes in the same place (the
        # signal ends them), so a script under `set -o pipefail` sees cyb as it sees them.
        return 128 + 13


__all__ = ["pipe_safe"]

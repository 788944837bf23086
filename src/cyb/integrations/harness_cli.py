"""``python -m cyb.integrations.lm_eval``: the ``lm_eval`` command line with the ``cyb`` model.

Kept apart from :mod:`cyb.integrations.lm_eval` (which needs the harness to import) so that
``--help`` says how to use the model and the tasks, and a missing harness, a missing data folder,
a model folder that does not exist or a task name the harness does not know are said in one line,
not a traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Sequence

PROG = "python -m cyb.integrations.lm_eval"


def usage() -> str:
    """What ``--help`` prints before the harness's own options."""
    from .tasks import DATA_ENV, tasks_dir

    return f"""usage: {PROG} --model cyb --model_args pretrained=MODEL[,OPTION=VALUE...]
           --tasks TASKS --include_path TASKS_DIR [lm_eval options]

lm-evaluation-harness with the cyb model registered: the lm_eval command line, same options.

  --model cyb               score with a pause model: Recipe 1 pauses after every token,
                            the CYB readout (TBYS, baseline: their own)
  --model_args pretrained=MODEL,...
                            MODEL: a folder written by cyb (a run's final/, a LoRA run's too);
                            options: device, batch_size, dtype, mode (fixed or adaptive),
                            decoder, max_length, max_gen_toks, add_bos_token, seed
  --include_path TASKS_DIR  cyb's task folder, here {tasks_dir()}
                            (print it with: python -c "from cyb.integrations.tasks import tasks_dir; print(tasks_dir())")
  --tasks                   hellaswag_local (10-shot), mmlu_local (5-shot), gsm8k_cot_local
                            (8-shot chain of thought): they read the benchmark files from the
                            folder ${DATA_ENV} (or --metadata '{{"data_dir": "/path"}}'):
                              hellaswag/train.jsonl, hellaswag/validation.jsonl,
                              mmlu/dev.jsonl, mmlu/test.jsonl, gsm8k/test.jsonl
                            These files are not shipped with cyb; docs/how-to/downstream.md says how to
                            write them from the hub data sets.  Shipped (a few examples, for
                            smoke tests): cyb_tiny_mc, cyb_tiny_gen, cyb_tiny_ppl.

example:
  export {DATA_ENV}=/data/eval
  {PROG} --model cyb --model_args pretrained=runs/cyb/final,device=cuda,batch_size=8 \\
      --tasks hellaswag_local --include_path "$(python -c 'from cyb.integrations.tasks import tasks_dir; print(tasks_dir())')"

The options of lm_eval follow."""


def _ours(error: BaseException) -> bool:
    """Whether ``error`` was raised by cyb's own code (bad input it names), not the harness's."""
    tb = error.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    package = str(Path(__file__).resolve().parents[1])
    return last is not None and os.path.abspath(last).startswith(package)


#: the tasks of cyb's task folder that a user names (the ``mmlu_local_*`` subjects are the group's)
CYB_TASKS = ("hellaswag_local", "mmlu_local", "gsm8k_cot_local", "cyb_tiny_mc", "cyb_tiny_gen", "cyb_tiny_ppl")


def _unknown_tasks(error: BaseException, args: Sequence[str]) -> str | None:
    """The harness's refusal of a task name it does not know, in one line that says where cyb's
    tasks are found; None for any other error."""
    text = " ".join(str(error).split())
    if not isinstance(error, ValueError) or not text.startswith("Tasks not found"):
        return None
    from .tasks import tasks_dir

    ours = ", ".join(CYB_TASKS)
    if any(a == "--include_path" or a.startswith("--include_path=") for a in args):
        return f"{text}: neither the harness nor --include_path has a task of that name (cyb's: {ours})"
    return f"{text}: cyb's tasks ({ours}) are read with --include_path {tasks_dir()}"


def main(argv: Sequence[str] | None = None, *, model_module: str | None = None) -> int:
    """Run the harness's command line on ``argv`` (default ``sys.argv[1:]``); returns the exit
    status (141 where the reader of its output stopped early: :func:`cyb.pipes.pipe_safe`).
    ``model_module``: the module whose import registers the ``cyb`` model with the harness
    (:mod:`cyb.integrations.lm_eval`, which names itself), imported once the harness is found."""
    from ..pipes import pipe_safe

    return pipe_safe(lambda: _main(argv, model_module))


def _main(argv: Sequence[str] | None, model_module: str | None) -> int:
    import importlib

    from ..extras import MissingPackage, require

    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None:  # the program itself: the CPU's numerics, pinned before torch computes anything
        from ..cpu_numerics import pin

        try:
            pin()
        except ValueError as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return 2
    wants_help = not args or "-h" in args or "--help" in args
    if wants_help:
        print(usage())
    try:
        require("lm_eval", f"{PROG}")
    except MissingPackage as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    from lm_eval.__main__ import cli_evaluate

    if model_module:
        importlib.import_module(model_module)

    if wants_help:
        print()
    saved = sys.argv
    sys.argv = [PROG, *(args or ["--help"])]
    try:
        if argv is None:  # the program itself: CPU threads as the cyb command sets them
            from ..cpu_numerics import check
            from ..threads import configure

            configure()
            problem = check()
            if problem:
                print(f"warning: {problem}", file=sys.stderr)
        cli_evaluate()
    except (ValueError, OSError, MissingPackage) as e:
        message = _unknown_tasks(e, args)
        if message is None and not _ours(e) and not isinstance(e, MissingPackage):
            raise
        print(f"{PROG}: error: {message or e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # argparse: --help, or a bad option (its message already printed)
        return e.code if isinstance(e.code, int) else 0
    finally:
        sys.argv = saved
    return 0


__all__ = ["PROG", "main", "usage"]

"""Evaluation of a trained pause model the way the paper does (``cyb eval``).

* :mod:`cyb.eval.evaluate`: :func:`evaluate` a run or saved model, its outputs and summary.
* :mod:`cyb.eval.data`: which held-out rows are scored (the run's own, a synthetic test set or
  any text source).
* :mod:`cyb.eval.collect`: running the model over those rows into per-token records, which the
  pure statistics of :mod:`cyb.analysis` turn into numbers.
* :mod:`cyb.eval.task_scores`, :mod:`cyb.eval.reasoning_scores`, :mod:`cyb.eval.text_generation`:
  what the model writes, free-running (a task's answers, a reasoning-gym task's verified answers,
  continuations of held-out text and the positions they cost).
"""

from .data import EvalData, resolve_data
from .evaluate import (DEFAULT_TOKENS, RUN_ROWS, EvalTarget, analyse, evaluate, format_summary, load_model,
                       method_of, resolve_target, training_state, write_outputs)

__all__ = ["DEFAULT_TOKENS", "EvalData", "EvalTarget", "RUN_ROWS", "analyse", "evaluate", "format_summary",
           "load_model", "method_of", "resolve_data", "resolve_target", "training_state", "write_outputs"]

"""The embedded demo: no-pause baseline, TBYS, CYB and CYB-decoupled trained alike on a synthetic task.

* :mod:`cyb.demo.settings`: what a demo run is (:class:`DemoSettings`, the task presets, the
  run configuration of each method).
* :mod:`cyb.demo.run`: the recipe: shared initial weights, training, scoring
  (:func:`score_model`, :func:`decoding_cost`) and :func:`run_demo`.
* :mod:`cyb.demo.present`: its presentation: the table, the lines that say what a run shows,
  the report folder.

:func:`run_demo` trains each method with :func:`cyb.train.train` on the same data, the same
number of optimiser steps and the same ``M``, scores greedy answers on held-out test examples
(:func:`score_model`), prints a comparison table and writes a report folder::

    out_dir/
      metrics.json     per method: accuracy, perplexity, steps per answer token, timings
      settings.json    the demo settings and the exact RunConfig of every run
      table.md         the comparison table (Markdown)
      latency.png      mean E[S] per answer position: CYB against TBYS's fixed M and baseline
      examples.html    test answers shaded by the expected pauses of the method with dk that pauses most
      runs/<method>/   each training run (metrics.jsonl, config.yaml, final/ PauseModel, ...)

Accuracy is measured under teacher forcing with the greedy sequential readout of each answer
token's block of ``M`` steps (:func:`cyb.decision.greedy_decision`: dk included for CYB, step
``M`` for TBYS, ``M = 1`` for the baseline).  While the prefix is correct this is exactly what
greedy generation emits, so an answer is exact under teacher forcing if and only if free greedy
decoding produces it.
"""

from .criterion import hard_easy_steps, meets_criterion, verdict
from .present import decoding_note, format_decoding, format_reading, format_table, write_report
from .run import clear_runs, decoding_cost, run_demo, score_model, write_initial_models
from .settings import (DEFAULT_METHODS, DEFAULT_TASK, DEMO_METHODS, METHOD_OPTIONS, QUICK, TASK_PRESETS,
                       DemoSettings, demo_method, demo_settings, run_config)

__all__ = [
    "DEFAULT_METHODS",
    "DEFAULT_TASK",
    "DEMO_METHODS",
    "METHOD_OPTIONS",
    "QUICK",
    "TASK_PRESETS",
    "DemoSettings",
    "clear_runs",
    "decoding_cost",
    "demo_method",
    "demo_settings",
    "decoding_note",
    "format_decoding",
    "format_reading",
    "format_table",
    "hard_easy_steps",
    "meets_criterion",
    "run_config",
    "run_demo",
    "score_model",
    "verdict",
    "write_initial_models",
    "write_report",
]

"""Analyses of a trained pause model's per-token readout (the paper's Results section).

Every analysis is a pure function of per-real-token arrays collected on held-out data
(:class:`~cyb.analysis.records.TokenRecords`): no model, no logits, no plotting.

* :mod:`cyb.analysis.records`: per-token ``(log_t, log_d, log_not_d)`` ``[N, M]`` and ids,
  collected batch by batch; a few passages for shaded text.
* :mod:`cyb.analysis.perplexity`: perplexity of every method, per-step readouts, relative
  improvement (appendix F).
* :mod:`cyb.analysis.latency`: per-token ``E[S]`` histogram and the mean stop distribution
  (Fig. 6).
* :mod:`cyb.analysis.calibration`: Spearman correlation of ``d_i`` with ``t_{i+1} - t_i`` and
  2-D densities (appendix E).
* :mod:`cyb.analysis.pause_stats`: median and variance of expected pauses per token string and
  the low/high median x variance table (Table 2).
* display names of methods and runs ("CYB 3 pauses") come from :func:`cyb.methods.label`.
"""

from .calibration import calibration, spearman
from .latency import expected_pauses, latency_summary
from ..methods import label as method_label
from .pause_stats import pause_statistics, quadrant_table, token_pause_stats
from .perplexity import perplexity_summary, relative_improvement
from .records import Passage, RecordCollector, TokenRecords

__all__ = [
    "Passage",
    "RecordCollector",
    "TokenRecords",
    "calibration",
    "expected_pauses",
    "latency_summary",
    "method_label",
    "pause_statistics",
    "perplexity_summary",
    "quadrant_table",
    "relative_improvement",
    "spearman",
    "token_pause_stats",
]

"""Pause statistics per token string (paper Table 2).

For every token string: how many times it occurs, the median and the variance of the expected
number of pauses (``E[S] - 1``) over its occurrences.  Tokens seen at least ``min_count`` times
are split at the median (over those tokens) of their medians and of their variances into a
2 x 2 table: low/high median x low/high variance.  A value equal to the split counts as low.

Which token a block's pauses belong to (``attribution``):

* ``"input"`` (default, Table 2): the real token *after which* the pauses come, i.e. the token
  fed at the block's first step.  The paper describes Table 2 as tokens "followed by few or
  many pauses", and its low-median cell ("isn", "wasn", "didn", "according") holds tokens
  whose continuation is predictable: the pauses are counted after them.
* ``"target"``: the token the block predicts (the next real token), the attribution of the
  shaded text in Fig. 1b ("the expected number of pause steps requested by the model in order
  to predict that token").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

ATTRIBUTIONS = ("input", "target")
CELLS = ("low_median_low_variance", "high_median_low_variance",
         "low_median_high_variance", "high_median_high_variance")


@dataclass
class TokenStat:
    """Expected-pause statistics of one token string (variance: population, ``ddof = 0``)."""

    token: str
    count: int
    median: float
    variance: float
    mean: float


def token_pause_stats(keys: Sequence[str], pauses, *, min_count: int = 1) -> list[TokenStat]:
    """Statistics per distinct key, most frequent first (ties: by key).

    Args:
        keys: the token string of each occurrence (length ``N``).
        pauses: ``[N]`` expected pauses of each occurrence.
        min_count: keep only strings seen at least this often (>= 1).
    """
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    values = np.asarray(pauses, dtype=np.float64).reshape(-1)
    if len(keys) != values.size:
        raise ValueError(f"keys ({len(keys)}) and pauses ({values.size}) must have one length")
    if values.size == 0:
        return []
    uniq, inverse = np.unique(np.asarray(keys, dtype=object).astype(str), return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=len(uniq)))[:-1]
    stats = []
    for key, group in zip(uniq, np.split(values[order], bounds)):
        if group.size >= min_count:
            stats.append(TokenStat(str(key), int(group.size), float(np.median(group)),
                                   float(group.var()), float(group.mean())))
    stats.sort(key=lambda s: (-s.count, s.token))
    return stats


def quadrant_table(stats: Sequence[TokenStat], *, top_k: int = 15) -> dict:
    """The 2 x 2 table of Table 2 from per-token statistics.

    Returns:
        ``{"split": {"median", "variance"}, "cells": {cell: [top_k TokenStat dicts, most
        frequent first]}, "cell_sizes": {cell: tokens in the cell}, "tokens": len(stats)}``
        with cells named as in :data:`CELLS`.  Empty cells when ``stats`` is empty.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if not stats:
        return {"split": {"median": None, "variance": None}, "cells": {c: [] for c in CELLS},
                "cell_sizes": {c: 0 for c in CELLS}, "tokens": 0}
    med_split = float(np.median([s.median for s in stats]))
    var_split = float(np.median([s.variance for s in stats]))
    cells: dict[str, list[TokenStat]] = {c: [] for c in CELLS}
    for s in stats:  # already most frequent first
        m = "low_median" if s.median <= med_split else "high_median"
        v = "low_variance" if s.variance <= var_split else "high_variance"
        cells[f"{m}_{v}"].append(s)
    return {
        "split": {"median": med_split, "variance": var_split},
        "cells": {c: [asdict(s) for s in cells[c][:top_k]] for c in CELLS},
        "cell_sizes": {c: len(cells[c]) for c in CELLS},
        "tokens": len(stats),
    }


def pause_statistics(keys: Sequence[str], pauses, *, min_count: int = 5, top_k: int = 15,
                     attribution: str = "input") -> dict:
    """Table 2: :func:`quadrant_table` of the tokens seen at least ``min_count`` times.

    ``keys`` must already follow ``attribution`` (recorded in the result).  Also returns the
    ``top_k`` tokens with the highest and the lowest median.
    """
    if attribution not in ATTRIBUTIONS:
        raise ValueError(f"attribution must be one of {ATTRIBUTIONS}, got {attribution!r}")
    stats = token_pause_stats(keys, pauses, min_count=min_count)
    table = quadrant_table(stats, top_k=top_k)
    lowest = sorted(stats, key=lambda s: (s.median, -s.count, s.token))
    highest = sorted(stats, key=lambda s: (-s.median, -s.count, s.token))
    return {
        "attribution": attribution,
        "min_count": min_count,
        **table,
        "highest_median": [asdict(s) for s in highest[:top_k]],
        "lowest_median": [asdict(s) for s in lowest[:top_k]],
    }

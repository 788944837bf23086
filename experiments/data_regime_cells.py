"""The cells of the data-regime study (``experiments/data_regime.py``): its regimes, its rows and
the name of each cell (row, regime, seed).

A regime ``PxS`` is ``P`` passes over ``S`` thirds of techdocs' training documents (a seeded
share, ``data.fraction``; at one seed a third lies inside two thirds): ``1x1`` one pass over a
third, ``2x1`` two passes over it, ``1x2`` one over two thirds, ``1x3`` one over all of it, and
past it the convergence regimes ``2x3``, ``3x3``, ...  Each cell is a run of its own with its own
schedule (``train.epochs``: warmup, then cosine decay to the cell's own end).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The regimes of the paper's data-regime figure, in its order.
FIGURE = ("1x1", "2x1", "1x2", "1x3")
#: Passes over the whole set tried at most in the convergence regimes (``2x3`` ... ``8x3``).
MAX_PASSES = 8
#: Optimiser steps of one pass over all of techdocs in blocks of 256 at batch 32 (51,825 blocks).
FULL_PASS_STEPS = 1619


def regime(name: str) -> tuple[int, int]:
    """``(passes, thirds)`` of a regime name ``PxS`` (S in 1..3, P >= 1)."""
    m = re.fullmatch(r"(\d+)x([123])", name)
    if not m or int(m.group(1)) < 1:
        raise ValueError(f"a regime is PxS: P >= 1 passes over S (1, 2 or 3) thirds of the data, got {name!r}")
    return int(m.group(1)), int(m.group(2))


def share(name: str) -> float:
    """The share of the training documents a regime reads (by characters)."""
    return regime(name)[1] / 3


def convergence(passes: int) -> str:
    """The regime of ``passes`` passes over the whole set."""
    return f"{passes}x3"


@dataclass(frozen=True)
class Row:
    key: str  # in cell names
    label: str
    method: dict
    regimes: tuple[str, ...]  # its cells of the figure
    pass_times: int = 1  # passes per regime pass: 4 for the 4x context (the regime's steps)
    # a step's time against the baseline's until `data_regime.py time` measures it: from the
    # one-epoch SmolLM2 runs' logs (results/experiments/smollm2-epoch, median seconds between the
    # logged steps, one run per GPU): baseline 0.095 s, private CYB 0.330 s (3.5x) on an H200,
    # with pause-step adapters of rank 16 0.498 s (5.3x, on an H100)
    step_cost: float = 1.0
    cyb: bool = False  # a CYB row (a candidate for the convergence runs)


_PRIVATE = {"num_steps": 4, "pause_visibility": "private"}
ROWS = (
    Row("base", "Baseline", {"name": "baseline", "num_steps": 4}, FIGURE),
    Row("tbys", "TBYS 3 pauses, private", {"name": "tbys", **_PRIVATE}, FIGURE, step_cost=3.5),
    Row("cyb", "CYB 3 pauses, private", {"name": "cyb", **_PRIVATE}, FIGURE, step_cost=3.5, cyb=True),
    Row("cyb-ad16", "CYB 3 pauses, private, pause adapters r16",
        {"name": "cyb", **_PRIVATE, "pause_adapter_rank": 16, "pause_adapter_alpha": 32.0}, FIGURE,
        step_cost=5.3, cyb=True),
    # compute-matched: the regime's steps with four times the real tokens in each row, so four
    # times the passes over the regime's documents
    Row("base4x", "Baseline 4xseq", {"name": "baseline_nx", "num_steps": 4, "seq_multiplier": 4}, ("1x1", "1x3"),
        pass_times=4, step_cost=3.0),
)
BY_KEY = {r.key: r for r in ROWS}
BASELINE, TBYS = "base", "tbys"


@dataclass(frozen=True)
class Cell:
    row: Row
    regime: str
    seed: int

    @property
    def name(self) -> str:
        return cell_name(self.row.key, self.regime, self.seed)

    @property
    def epochs(self) -> int:
        """Passes over the cell's documents (``train.epochs``)."""
        return regime(self.regime)[0] * self.row.pass_times

    @property
    def nominal_steps(self) -> int:
        """Its optimiser steps before the data are counted (the run counts them exactly)."""
        passes, thirds = regime(self.regime)
        return passes * thirds * FULL_PASS_STEPS // 3


def cell_name(row: str, regime_name: str, seed: int) -> str:
    """``dr-cyb-ad16-1x3-s0``."""
    return f"dr-{row}-{regime_name}-s{seed}"


_NAME = re.compile(r"dr-(?P<row>[a-z0-9-]+?)-(?P<regime>\d+x[123])-s(?P<seed>\d+)")


def parse(name: str) -> tuple[str, str, int] | None:
    """``(row key, regime, seed)`` of a cell name, or None for another run's name."""
    m = _NAME.fullmatch(name)
    if not m or m.group("row") not in BY_KEY:
        return None
    return m.group("row"), m.group("regime"), int(m.group("seed"))


__all__ = ["BASELINE", "BY_KEY", "Cell", "FIGURE", "FULL_PASS_STEPS", "MAX_PASSES", "ROWS", "Row", "TBYS", "cell_name",
           "convergence", "parse", "regime", "share"]

"""Checks of the per-step vectors of the method: distributions over steps ``1..M`` (omega,
rho; normalised by their users) and discounts (gamma). One home for the rules, used by the
configuration (which names the field), the losses and the Recipe 2 sampler."""

from __future__ import annotations

import math
from typing import Iterable


def step_vector_problem(values: Iterable[float], num_steps: int, *, discount: bool = False) -> str | None:
    """What is wrong with a per-step vector, as the predicate of a sentence about it, or None.

    A distribution needs ``M = num_steps`` finite entries >= 0, not all zero; a discount
    (``discount=True``) needs ``M`` entries in ``[0, 1]``, not all zero.
    """
    values = [float(v) for v in values]
    if len(values) != num_steps:
        return f"must have length M = {num_steps}, got {len(values)}: {values}"
    if not all(math.isfinite(v) for v in values):
        return f"must be finite, got {values}"
    if discount and not all(0.0 <= v <= 1.0 for v in values):
        return f"must lie in [0, 1], got {values}"
    if not all(v >= 0 for v in values):
        return f"must be non-negative, got {values}"
    if not sum(values) > 0:
        return f"must have a positive entry (it is all zero): {values}"
    return None


def check_step_vector(name: str, values: Iterable[float], num_steps: int, *, discount: bool = False) -> list[float]:
    """``values`` as a list of floats; ValueError ``"{name} {problem}"`` if it is not valid."""
    values = [float(v) for v in values]
    problem = step_vector_problem(values, num_steps, discount=discount)
    if problem is not None:
        raise ValueError(f"{name} {problem}")
    return values


__all__ = ["check_step_vector", "step_vector_problem"]

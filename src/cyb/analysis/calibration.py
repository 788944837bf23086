"""Calibration (paper appendix E): does ``<don't know>`` predict a gain from waiting?

For each step ``i < M`` and every token: ``d_i`` (the dk probability) against
``t_{i+1} - t_i`` (how much the target's renormalised probability rises with one more step).
A positive Spearman correlation means the model asks for a pause when a pause helps.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def spearman(x, y) -> tuple[float, float]:
    """Spearman rank correlation of two equal-length 1-D arrays and its two-sided p-value.

    Returns ``(nan, nan)`` when it is undefined (fewer than 3 points, or a constant input).
    """
    from scipy import stats

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"x and y must be 1-D arrays of one length, got {x.shape} and {y.shape}")
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan, math.nan
    res = stats.spearmanr(x, y)
    return float(res[0]), float(res[1])


def step_probabilities(log_t: torch.Tensor, log_d: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``(t, d)`` as float64 arrays ``[N, M]`` with ``d_M = 0`` (the losses' convention)."""
    t = log_t.double().exp().numpy()
    d = log_d.double().exp().numpy().copy()
    d[:, -1] = 0.0
    return t, d


def calibration(log_t: torch.Tensor, log_d: torch.Tensor, *, bins: int = 40) -> list[dict]:
    """Per step ``i = 1..M-1``: Spearman correlation of ``d_i`` with ``t_{i+1} - t_i``.

    Args:
        log_t, log_d: ``[N, M]`` per-step readouts.
        bins: bins per axis of the 2-D density (``t_{i+1} - t_i`` over ``[-1, 1]``, ``d_i`` over
            ``[0, 1]``).

    Returns:
        one dict per step: ``{"step": i (1-based), "spearman", "p_value", "n",
        "density": {"x_edges", "y_edges", "counts" [bins][bins] (x-major)}}``.
    """
    if log_t.dim() != 2 or log_t.shape != log_d.shape:
        raise ValueError(f"log_t and log_d must be [N, M] of one shape, got {tuple(log_t.shape)} "
                         f"and {tuple(log_d.shape)}")
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    t, d = step_probabilities(log_t, log_d)
    x_edges = np.linspace(-1.0, 1.0, bins + 1)
    y_edges = np.linspace(0.0, 1.0, bins + 1)
    out = []
    for i in range(t.shape[1] - 1):
        gain, dk = t[:, i + 1] - t[:, i], d[:, i]
        rho, p = spearman(dk, gain)
        counts, _, _ = np.histogram2d(gain, dk, bins=[x_edges, y_edges])
        out.append({
            "step": i + 1,
            "spearman": rho,
            "p_value": p,
            "n": int(gain.size),
            "mean_d": float(dk.mean()) if dk.size else math.nan,
            "mean_gain": float(gain.mean()) if gain.size else math.nan,
            "density": {"x_edges": x_edges.tolist(), "y_edges": y_edges.tolist(),
                        "counts": counts.astype(int).tolist()},
        })
    return out

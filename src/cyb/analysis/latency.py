"""Latency (paper Fig. 6): how many steps the model takes before it reads out.

For each token the stop distribution ``Pr(S = i)`` (eq. 2, the model's own stopping: ``omega``
one-hot on ``M``) gives ``E[S]`` in ``[1, M]``; ``E[S] - 1`` is the expected number of pauses.
Fig. 6 shows the histogram of per-token expected pauses (blue) and ``Pr(S = i)`` averaged over
tokens (purple).
"""

from __future__ import annotations

import torch

from ..losses import stop_distribution


def expected_pauses(log_d: torch.Tensor, log_not_d: torch.Tensor) -> torch.Tensor:
    """``E[S] - 1`` per token, float64 ``[...]`` in ``[0, M-1]``, from ``[..., M]`` readouts."""
    s = stop_distribution(log_d.double(), log_not_d.double())
    steps = torch.arange(s.shape[-1], dtype=s.dtype)
    return (s * steps).sum(-1)


def latency_summary(log_d: torch.Tensor, log_not_d: torch.Tensor, *, bins: int | None = None) -> dict:
    """Latency statistics of ``N`` tokens from ``log_d``, ``log_not_d`` ``[N, M]``.

    Args:
        bins: histogram bins over ``[0, M-1]`` expected pauses (default ``10 * (M-1)``).

    Returns:
        ``{"mean_steps": E[S] averaged, "mean_pauses", "std_steps" (of E[S] over tokens),
        "median_pauses",
        "stop_dist": [mean Pr(S=i), i=1..M], "pauses_hist": {"edges": [bins+1], "counts": [bins]},
        "tokens"}``.
    """
    if log_d.dim() != 2 or log_d.shape[0] == 0:
        raise ValueError(f"log_d must be [N, M] with N >= 1, got {tuple(log_d.shape)}")
    m = log_d.shape[-1]
    s = stop_distribution(log_d.double(), log_not_d.double())
    pauses = (s * torch.arange(m, dtype=s.dtype)).sum(-1)
    nbins = bins if bins is not None else max(1, 10 * (m - 1))
    if nbins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    hi = float(max(m - 1, 1))
    counts = torch.histc(pauses.clamp(0.0, hi), bins=nbins, min=0.0, max=hi)
    edges = torch.linspace(0.0, hi, nbins + 1, dtype=torch.float64)
    return {
        "mean_steps": float(pauses.mean()) + 1.0,
        "mean_pauses": float(pauses.mean()),
        "std_steps": float(pauses.std(unbiased=False)),
        "median_pauses": float(pauses.median()),
        "stop_dist": s.mean(0).tolist(),
        "pauses_hist": {"edges": edges.tolist(), "counts": [int(c) for c in counts.round().tolist()]},
        "tokens": int(log_d.shape[0]),
    }

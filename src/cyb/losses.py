"""The paper's losses as pure tensor functions.

Every loss takes per-step log-probabilities over the last axis (length ``M``) and returns the
per-real-token loss (the input shape without the last axis):

* ``log_t[..., i]``: log of the target's probability at step ``i`` (renormalised without dk),
* ``log_d[..., i]``: log of the ``<don't know>`` probability ``d_i``,
* ``log_not_d[..., i]``: ``log(1 - d_i)``.

``d_M`` is treated as 0 whatever is passed.  ``omega`` (world stop distribution), ``rho``
(desired stop distribution) and ``gamma`` (discount per step) are 1-D sequences of length ``M``
or tensors broadcastable to ``[..., M]`` (Recipe 2 passes a per-token one-hot ``omega``);
``omega`` and ``rho`` are normalised along the last axis and may contain zeros.

Equations (paper, Section 3 and appendix D):

* hazard ``omega~_i = omega_i / sum_{j>=i} omega_j``,
* ``Pr(S=i) = (omega_i + (1-d_i) sum_{j>i} omega_j) prod_{j<i} d_j``                 (eq. 2)
* ``l_CYB = -log sum_i Pr(S=i) gamma_i t_i``                                        (eq. 3)
* ``l_TBYS = -log sum_i omega_i t_i`` (CYB with ``d_i = 1`` before the world's stop, ``gamma=1``)
* ``l_CYB-VA = -sum_i s_i log(gamma_i t_i) + KL(s || rho)``, ``s = Pr(S | d)`` without world stops
* ``l_CYB-DP = l_CYB + alpha KL(rho || s)``, ``s = Pr(S | d, omega)``
"""

from __future__ import annotations

import functools
import math
from typing import Sequence, Union

import torch

from .vectors import check_step_vector

Dist = Union[Sequence[float], torch.Tensor, None]

__all__ = [
    "stop_log_probs",
    "stop_distribution",
    "expected_stop_step",
    "cyb_loss",
    "tbys_loss",
    "cyb_va_loss",
    "cyb_dp_loss",
    "cross_entropy_loss",
    "mean_step_cross_entropy",
    "cyb_anytime_loss",
    "cyb_decoupled_loss",
    "cyb_ponder_loss",
    "discount",
]


# ----------------------------------------------------------------------------- validation


def _float_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _check_steps(log_t: torch.Tensor | None, log_d: torch.Tensor, log_not_d: torch.Tensor) -> int:
    if log_d.shape != log_not_d.shape:
        raise ValueError(
            f"log_d and log_not_d must have the same shape [..., M], got {tuple(log_d.shape)} "
            f"and {tuple(log_not_d.shape)}"
        )
    if log_t is not None and log_t.shape != log_d.shape:
        raise ValueError(
            f"log_t must have the shape of log_d [..., M], got {tuple(log_t.shape)} and "
            f"{tuple(log_d.shape)}"
        )
    if log_d.dim() < 1 or log_d.shape[-1] < 1:
        raise ValueError(f"per-step inputs need a last axis of length M >= 1, got {tuple(log_d.shape)}")
    return log_d.shape[-1]


def _as_float(values, like: torch.Tensor) -> torch.Tensor:
    """``values`` as a tensor of ``like``'s dtype and device, without a float32 detour."""
    if isinstance(values, torch.Tensor):
        return values.to(device=like.device, dtype=like.dtype)
    return torch.tensor(values, dtype=like.dtype, device=like.device)


def _check_dist(name: str, t: torch.Tensor, m: int) -> torch.Tensor:
    """Normalise a distribution over the last axis; one vector is checked by
    :func:`~cyb.vectors.check_step_vector`, a batch of them (per-token world stops) here."""
    if t.dim() <= 1:
        check_step_vector(name, t.reshape(-1).tolist(), m)
        return t / t.sum(-1, keepdim=True)
    if t.shape[-1] != m:
        raise ValueError(f"{name} must have length M = {m} on its last axis, got shape {tuple(t.shape)}")
    total = t.sum(-1, keepdim=True)
    if not bool((torch.isfinite(t).all() & (t >= 0).all() & (total > 0).all())):
        raise ValueError(f"{name} must be finite and non-negative with a positive entry in every row")
    return t / total


def _check_gamma(g: torch.Tensor, m: int) -> torch.Tensor:
    if g.dim() <= 1:
        check_step_vector("gamma", g.reshape(-1).tolist(), m, discount=True)
    elif g.shape[-1] != m or not bool(((g >= 0) & (g <= 1)).all() & (g.amax(-1) > 0).all()):
        raise ValueError(f"gamma must have length M = {m} with entries in [0, 1], not all zero, in every row")
    return torch.log(g)


@functools.lru_cache(maxsize=256)
def _host_prepared(kind: str, name: str, values: tuple, m: int, dtype: torch.dtype,
                   device: torch.device) -> torch.Tensor:
    """Validate a host-side vector once and keep its device copy (no host sync per call)."""
    t = torch.tensor(values, dtype=torch.float64)
    out = _check_dist(name, t, m) if kind == "dist" else _check_gamma(t, m)
    return out.to(device=device, dtype=dtype)


def _host_key(values) -> tuple | None:
    """A hashable key for host-side values (lists, tuples, CPU tensors), else None."""
    if isinstance(values, torch.Tensor):
        if values.device.type != "cpu" or values.dim() != 1:
            return None
        return tuple(values.double().tolist())
    try:
        return tuple(float(v) for v in values)
    except TypeError:
        return None


def _as_dist(name: str, values: Dist, m: int, like: torch.Tensor) -> torch.Tensor:
    """Validate and normalise a distribution over steps: tensor broadcastable to ``[..., M]``."""
    key = _host_key(values)
    if key is not None:
        return _host_prepared("dist", name, key, m, like.dtype, like.device)
    return _check_dist(name, _as_float(values, like), m)


def _log_gamma(gamma: Dist, m: int, like: torch.Tensor) -> torch.Tensor:
    if gamma is None:
        return torch.zeros(m, dtype=like.dtype, device=like.device)
    key = _host_key(gamma)
    if key is not None:
        return _host_prepared("gamma", "gamma", key, m, like.dtype, like.device)
    return _check_gamma(_as_float(gamma, like), m)


def discount(gamma0: float, num_steps: int) -> torch.Tensor:
    """``[gamma0**0, gamma0**1, ..., gamma0**(M-1)]`` as a float64 tensor (paper: ``gamma_i = gamma0^(i-1)``)."""
    if not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"M (num_steps) must be an integer >= 1, got {num_steps!r}")
    if not 0.0 <= float(gamma0) <= 1.0:
        raise ValueError(f"gamma0 must lie in [0, 1], got {gamma0!r}")
    return torch.tensor([float(gamma0) ** i for i in range(num_steps)], dtype=torch.float64)


# --------------------------------------------------------------------- stop distribution


def _prepare(log_d: torch.Tensor, log_not_d: torch.Tensor):
    dt = _float_dtype(log_d, log_not_d)
    return log_d.to(dt), log_not_d.to(dt)


def stop_log_probs(log_d: torch.Tensor, log_not_d: torch.Tensor, omega: Dist = None) -> torch.Tensor:
    """``log Pr(S = i | d, omega)`` for ``i = 1..M`` (eq. 2), shape ``[..., M]``.

    ``omega`` defaults to one-hot on ``M`` (the model may use every step).  ``d_M`` is taken as
    0.  Zeros in ``omega`` are handled without NaN in values or gradients.
    """
    m = _check_steps(None, log_d, log_not_d)
    log_d, log_not_d = _prepare(log_d, log_not_d)
    # prod_{j<i} d_j in log space: exclusive cumulative sum; d_M never enters it.
    prefix = torch.cumsum(log_d[..., :-1], dim=-1)
    prefix = torch.cat([torch.zeros_like(log_d[..., :1]), prefix], dim=-1)
    if omega is None:
        # omega one-hot on M: first factor is (1 - d_i) for i < M and 1 at M.
        first = torch.cat([log_not_d[..., :-1], torch.zeros_like(log_not_d[..., -1:])], dim=-1)
        return prefix + first
    w = _as_dist("omega", omega, m, log_d)
    tail_after = torch.flip(torch.cumsum(torch.flip(w, [-1]), -1), [-1]) - w  # sum_{j>i} omega_j
    tail_after = tail_after.clamp(min=0)
    tail_after[..., -1] = 0  # exact zero at M whatever the rounding
    has_w, has_tail = w > 0, tail_after > 0
    log_w = torch.where(has_w, w, torch.ones_like(w)).log()  # finite stand-ins where unused
    log_tail = torch.where(has_tail, tail_after, torch.ones_like(w)).log()
    # Where the tail is zero (i = M, or beyond omega's support) the factor is omega_i alone, so
    # (1 - d_i) and with it d_M never matter.
    with_tail = log_not_d + log_tail
    both = torch.logaddexp(log_w.expand_as(with_tail), with_tail)
    neg_inf = torch.full_like(with_tail, -math.inf)
    first = torch.where(has_w & has_tail, both,
                        torch.where(has_w, log_w.expand_as(with_tail),
                                    torch.where(has_tail, with_tail, neg_inf)))
    return prefix + first


def stop_distribution(log_d: torch.Tensor, log_not_d: torch.Tensor, omega: Dist = None) -> torch.Tensor:
    """``Pr(S = i)``, shape ``[..., M]``; sums to 1 over the last axis."""
    return stop_log_probs(log_d, log_not_d, omega).exp()


def expected_stop_step(log_d: torch.Tensor, log_not_d: torch.Tensor, omega: Dist = None) -> torch.Tensor:
    """``E[S] = sum_i i Pr(S=i)`` with steps counted from 1 (so ``E[S] - 1`` expected pauses)."""
    s = stop_distribution(log_d, log_not_d, omega)
    steps = torch.arange(1, s.shape[-1] + 1, dtype=s.dtype, device=s.device)
    return (s * steps).sum(-1)


# ------------------------------------------------------------------------------- losses


def _neg_logsumexp(x: torch.Tensor) -> torch.Tensor:
    return -torch.logsumexp(x, dim=-1)


def cyb_loss(
    log_t: torch.Tensor,
    log_d: torch.Tensor,
    log_not_d: torch.Tensor,
    *,
    omega: Dist = None,
    gamma: Dist = None,
) -> torch.Tensor:
    """``-log sum_i Pr(S=i | d, omega) gamma_i t_i`` per real token (eq. 3), shape ``[...]``."""
    m = _check_steps(log_t, log_d, log_not_d)
    log_s = stop_log_probs(log_d, log_not_d, omega)
    log_t = log_t.to(log_s.dtype)
    return _neg_logsumexp(log_s + _log_gamma(gamma, m, log_s) + log_t)


def tbys_loss(log_t: torch.Tensor, *, omega: Dist = None) -> torch.Tensor:
    """Think-Before-You-Speak: ``-log sum_i omega_i t_i``; with ``omega`` one-hot on ``M`` (the
    default) plain cross-entropy at the last step."""
    if log_t.dim() < 1 or log_t.shape[-1] < 1:
        raise ValueError(f"log_t needs a last axis of length M >= 1, got {tuple(log_t.shape)}")
    dt = _float_dtype(log_t)
    log_t = log_t.to(dt)
    if omega is None:
        return -log_t[..., -1]
    w = _as_dist("omega", omega, log_t.shape[-1], log_t)
    has_w = w > 0
    log_w = torch.where(has_w, w, torch.ones_like(w)).log()
    terms = torch.where(has_w, log_w + log_t, torch.full_like(log_t + log_w, -math.inf))
    return _neg_logsumexp(terms)


def cross_entropy_loss(log_t: torch.Tensor) -> torch.Tensor:
    """Plain next-token cross-entropy ``-log t`` for baselines (``log_t`` of shape ``[...]``)."""
    return -log_t.to(_float_dtype(log_t))


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """``KL(p || q) = sum_i p_i (log p_i - log q_i)`` with ``0 log 0 = 0``, NaN-free gradients."""
    present = log_p > -math.inf
    safe_p = torch.where(present, log_p, torch.zeros_like(log_p))
    terms = torch.where(present, safe_p.exp() * (safe_p - log_q), torch.zeros_like(log_p))
    return terms.sum(-1)


def _log_dist(name: str, values: Dist, m: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    p = _as_dist(name, values, m, like)
    present = p > 0
    return torch.where(present, p, torch.ones_like(p)).log().masked_fill(~present, -math.inf), present


def cyb_va_loss(
    log_t: torch.Tensor,
    log_d: torch.Tensor,
    log_not_d: torch.Tensor,
    *,
    rho: Dist,
    gamma: Dist = None,
) -> torch.Tensor:
    """CYB-VA (appendix D.1): ``-sum_i s_i log(gamma_i t_i) + KL(s || rho)``, ``s = Pr(S | d)``.

    ``rho`` must be strictly positive: ``KL(s || rho)`` is infinite wherever ``rho_i = 0`` and
    ``s_i > 0``.
    """
    m = _check_steps(log_t, log_d, log_not_d)
    if rho is None:
        raise ValueError("cyb_va_loss needs rho, the desired stop distribution over M steps")
    log_s = stop_log_probs(log_d, log_not_d, None)
    log_rho, present = _log_dist("rho", rho, m, log_s)
    if not bool(present.all()):
        raise ValueError(
            "rho must be strictly positive for CYB-VA (KL(s || rho) is infinite where rho_i = 0); "
            "use CYB-DP, whose KL(rho || s) allows zeros"
        )
    log_g = _log_gamma(gamma, m, log_s)
    log_t = log_t.to(log_s.dtype)
    s = log_s.exp()
    # gamma_i = 0 makes log(gamma_i t_i) = -inf; s_i * (-inf) is +inf unless s_i = 0.
    used = s > 0
    log_gt = torch.where(used, log_g + log_t, torch.zeros_like(s))
    expected_ll = torch.where(used, s * log_gt, torch.zeros_like(s)).sum(-1)
    return -expected_ll + _kl(log_s, log_rho)


def cyb_dp_loss(
    log_t: torch.Tensor,
    log_d: torch.Tensor,
    log_not_d: torch.Tensor,
    *,
    rho: Dist,
    alpha: float,
    omega: Dist = None,
    gamma: Dist = None,
) -> torch.Tensor:
    """CYB-DP (appendix D.2): ``l_CYB + alpha KL(rho || s)`` with ``s = Pr(S | d, omega)``.

    Zeros in ``rho`` contribute nothing to the KL (the reversed KL allows them).
    """
    m = _check_steps(log_t, log_d, log_not_d)
    if rho is None:
        raise ValueError("cyb_dp_loss needs rho, the desired stop distribution over M steps")
    if not math.isfinite(float(alpha)) or float(alpha) < 0:
        raise ValueError(f"alpha (the CYB-DP penalty weight) must be >= 0, got {alpha!r}")
    log_s = stop_log_probs(log_d, log_not_d, omega)
    log_t = log_t.to(log_s.dtype)
    base = _neg_logsumexp(log_s + _log_gamma(gamma, m, log_s) + log_t)
    log_rho, present = _log_dist("rho", rho, m, log_s)
    rho_p = log_rho.exp()
    safe_log_s = torch.where(present, log_s, torch.zeros_like(log_s))
    safe_log_rho = torch.where(present, log_rho, torch.zeros_like(log_rho))
    kl = torch.where(present, rho_p * (safe_log_rho - safe_log_s), torch.zeros_like(log_s)).sum(-1)
    return base + float(alpha) * kl


# --------------------------------------------------------------------- beyond the paper


def mean_step_cross_entropy(log_t: torch.Tensor) -> torch.Tensor:
    """``(1/M) sum_i -log t_i``: the cross-entropy of every step's renormalised prediction,
    averaged over the ``M`` steps, shape ``[...]``."""
    if log_t.dim() < 1 or log_t.shape[-1] < 1:
        raise ValueError(f"log_t needs a last axis of length M >= 1, got {tuple(log_t.shape)}")
    return -log_t.to(_float_dtype(log_t)).mean(-1)


def cyb_anytime_loss(
    log_t: torch.Tensor,
    log_d: torch.Tensor,
    log_not_d: torch.Tensor,
    *,
    weight: float,
    omega: Dist = None,
    gamma: Dist = None,
) -> torch.Tensor:
    """CYB with an anytime auxiliary loss: ``l_CYB + weight (1/M) sum_i -log t_i``.

    Under CYB alone a step's prediction ``t_i`` gets gradient only in proportion to
    ``Pr(S = i)``: once ``d`` stops early, later steps stop learning. The auxiliary term trains
    every step's prediction whatever ``d`` does.
    """
    if not math.isfinite(float(weight)) or float(weight) < 0:
        raise ValueError(f"weight (method.aux_weight) must be finite and >= 0, got {weight!r}")
    base = cyb_loss(log_t, log_d, log_not_d, omega=omega, gamma=gamma)
    return base + float(weight) * mean_step_cross_entropy(log_t).to(base.dtype)


def cyb_decoupled_loss(
    log_t: torch.Tensor,
    log_d: torch.Tensor,
    log_not_d: torch.Tensor,
    *,
    omega: Dist = None,
    gamma: Dist = None,
) -> torch.Tensor:
    """Decoupled CYB: ``(1/M) sum_i -log t_i + l_CYB(t with no gradient, d)``.

    The predictions learn by cross-entropy at every step, and ``d`` learns only when to stop:
    the CYB likelihood of the current predictions, through which no gradient reaches ``t``.
    The value is the sum of both terms (not a likelihood); report perplexity with
    :func:`cyb_loss` and the model's own stopping.
    """
    base = cyb_loss(log_t.detach(), log_d, log_not_d, omega=omega, gamma=gamma)
    return mean_step_cross_entropy(log_t).to(base.dtype) + base


def cyb_ponder_loss(
    log_t: torch.Tensor,
    log_d: torch.Tensor,
    log_not_d: torch.Tensor,
    *,
    tau: float,
    omega: Dist = None,
    gamma: Dist = None,
) -> torch.Tensor:
    """CYB with a ponder cost (as in Adaptive Computation Time): ``l_CYB + tau E[S]``, the
    expected number of steps under ``Pr(S | d, omega)``; ``tau < 0`` rewards pondering."""
    if not math.isfinite(float(tau)):
        raise ValueError(f"tau (method.ponder_cost) must be finite, got {tau!r}")
    base = cyb_loss(log_t, log_d, log_not_d, omega=omega, gamma=gamma)
    return base + float(tau) * expected_stop_step(log_d, log_not_d, omega).to(base.dtype)


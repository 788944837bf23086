"""Float64 references written straight from the paper's printed equations.

Plain Python floats, loops and explicit products, one real token at a time; nothing here
imports ``cyb``.  Per-token arguments are lists of length ``M`` (step ``i`` of the paper is
index ``i - 1`` here):

* ``d``: don't-know probabilities ``d_1..d_M`` (``d_M`` is taken as 0 whatever is passed),
* ``t``: target probabilities ``t_1..t_M`` (renormalised without dk),
* ``omega``: world stop distribution, ``rho``: desired stop distribution, ``gamma``: discounts.

:func:`per_token` applies a per-token reference over the leading axes of tensors ``[..., M]``.
"""

from __future__ import annotations

import math

import torch


def _normalise(p):
    total = sum(p)
    return [x / total for x in p]


def _last_is_zero(d):
    """``d_M = 0`` (the paper: "d_M == 0 for the final step")."""
    return list(d[:-1]) + [0.0]


def one_hot_last(m):
    """The default world stop distribution ``omega = [0, ..., 0, 1]``."""
    return [0.0] * (m - 1) + [1.0]


def stop_probs_eq2(d, omega=None):
    """Eq. 2: ``Pr(S=i) = (omega_i + (1-d_i) sum_{j=i+1}^M omega_j) prod_{j=1}^{i-1} d_j``."""
    m = len(d)
    w = _normalise(omega if omega is not None else one_hot_last(m))
    d = _last_is_zero(d)
    return [
        (w[i] + (1 - d[i]) * sum(w[i + 1 :])) * math.prod(d[:i])
        for i in range(m)
    ]


def hazard(omega):
    """``omega~_i = omega_i / sum_{j=i}^M omega_j`` (eq. 1).

    Where the tail ``sum_{j>=i} omega_j`` is 0 the world has already stopped for sure, so the
    value is irrelevant (an earlier ``1 - omega~_j`` is 0); it is set to 1 ("stop now").
    """
    w = _normalise(omega)
    return [w[i] / sum(w[i:]) if sum(w[i:]) > 0 else 1.0 for i in range(len(w))]


def stop_probs_hazard(d, omega=None):
    """Appendix, first equation: ``Pr(S=i) = prod_{j<i} d_j prod_{j<i} (1 - omega~_j)
    (d_i omega~_i + (1 - d_i))``."""
    m = len(d)
    h = hazard(omega if omega is not None else one_hot_last(m))
    d = _last_is_zero(d)
    return [
        math.prod(d[:i]) * math.prod(1 - h[j] for j in range(i)) * (d[i] * h[i] + (1 - d[i]))
        for i in range(m)
    ]


def discount(gamma0, m):
    """``gamma_i = gamma0^(i-1)`` for ``i = 1..M``."""
    return [gamma0 ** (i - 1) for i in range(1, m + 1)]


def expected_stop_step(d, omega=None):
    """``E[S] = sum_i i Pr(S=i)`` with ``i = 1..M``."""
    s = stop_probs_eq2(d, omega)
    return sum((i + 1) * s[i] for i in range(len(s)))


def cyb_loss(t, d, omega=None, gamma=None):
    """Eq. 3: ``-log sum_i Pr(S=i | d, omega) gamma_i t_i``."""
    m = len(t)
    gamma = gamma if gamma is not None else [1.0] * m
    s = stop_probs_eq2(d, omega)
    return -math.log(sum(s[i] * gamma[i] * t[i] for i in range(m)))


def tbys_loss(t, omega=None):
    """TBYS: ``-log sum_i omega_i t_i`` (CYB with ``d_i = 1`` before the world's stop, ``gamma = 1``)."""
    m = len(t)
    w = _normalise(omega if omega is not None else one_hot_last(m))
    return -math.log(sum(w[i] * t[i] for i in range(m)))


def kl(p, q):
    """``D_KL(p || q) = sum_i p_i log(p_i / q_i)`` with ``0 log 0 = 0``."""
    total = 0.0
    for pi, qi in zip(p, q):
        if pi > 0:
            total += pi * math.log(pi / qi) if qi > 0 else math.inf
    return total


def cyb_va_loss(t, d, rho, gamma=None):
    """CYB-VA: ``-E_{i~s} log(gamma_i t_i) + KL(s || rho)``, ``s = Pr(S | d)`` (no world stops)."""
    m = len(t)
    gamma = gamma if gamma is not None else [1.0] * m
    s = stop_probs_eq2(d, None)
    expected = sum(s[i] * math.log(gamma[i] * t[i]) for i in range(m) if s[i] > 0)
    return -expected + kl(s, _normalise(rho))


def cyb_dp_loss(t, d, rho, alpha, omega=None, gamma=None):
    """CYB-DP: ``l_CYB + alpha KL(rho || s)``, ``s = Pr(S | d, omega)``."""
    s = stop_probs_eq2(d, omega)
    return cyb_loss(t, d, omega, gamma) + alpha * kl(_normalise(rho), s)


def mean_step_ce(t):
    """``(1/M) sum_i -log t_i``."""
    return -sum(math.log(x) for x in t) / len(t)


def cyb_anytime_loss(t, d, weight, omega=None, gamma=None):
    """``l_CYB + weight (1/M) sum_i -log t_i``."""
    return cyb_loss(t, d, omega, gamma) + weight * mean_step_ce(t)


def cyb_decoupled_loss(t, d, omega=None, gamma=None):
    """The value of decoupled CYB: ``(1/M) sum_i -log t_i + l_CYB`` (its gradient differs:
    no gradient of the CYB term reaches ``t``)."""
    return mean_step_ce(t) + cyb_loss(t, d, omega, gamma)


def cyb_ponder_loss(t, d, tau, omega=None, gamma=None):
    """``l_CYB + tau E[S]``."""
    return cyb_loss(t, d, omega, gamma) + tau * expected_stop_step(d, omega)


def per_token(fn, *tensors, **per_token_kwargs):
    """Apply ``fn(*lists, **kwargs)`` to every token: tensors ``[..., M]`` (broadcast together).

    Keyword values that are tensors of shape ``[..., M]`` are taken per token as well; other
    keyword values are passed unchanged.  Returns a float64 tensor of the broadcast leading
    shape (``[..., M]`` if ``fn`` returns a list).
    """
    token_kw = {k: v for k, v in per_token_kwargs.items() if isinstance(v, torch.Tensor) and v.dim() > 1}
    fixed_kw = {k: v for k, v in per_token_kwargs.items() if k not in token_kw}
    fixed_kw = {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in fixed_kw.items()}
    parts = torch.broadcast_tensors(*[x.double() for x in tensors], *[v.double() for v in token_kw.values()])
    lead = parts[0].shape[:-1]
    m = parts[0].shape[-1]
    flat = [p.reshape(-1, m).tolist() for p in parts]
    n_pos = len(tensors)
    names = list(token_kw)
    results = []
    for row in range(len(flat[0])):
        args = [f[row] for f in flat[:n_pos]]
        kw = {name: flat[n_pos + k][row] for k, name in enumerate(names)}
        results.append(fn(*args, **kw, **fixed_kw))
    out = torch.tensor(results, dtype=torch.float64)
    return out.reshape((*lead, *out.shape[1:]))


# ------------------------------------------------------------------------------- readout


def readout_explicit(logits, target, dk_id=None, log_prior_ratio=None):
    """``(log t, log d, log(1-d))`` for one row of logits by an explicit softmax (float64).

    ``y = softmax(z + log(psi'/psi))`` over the full vocabulary; ``d = y_dk``,
    ``t = y_target / (1 - y_dk)``.  Without dk: ``t = y_target``, ``d = 0``.
    """
    z = [float(x) for x in logits]
    if log_prior_ratio is not None:
        z = [zi + bi for zi, bi in zip(z, log_prior_ratio)]
    top = max(z)
    e = [math.exp(zi - top) for zi in z]
    y = [ei / sum(e) for ei in e]
    if dk_id is None:
        return math.log(y[target]), -math.inf, 0.0
    d = y[dk_id]
    return math.log(y[target] / (1 - d)), math.log(d), math.log(1 - d)


def dk_log_prior_ratio(vocab_size, dk_id, psi_dk):
    """``log(psi'/psi)`` with ``psi`` uniform, ``psi'_dk = psi_dk``, ``psi'_other = (1 - psi_dk)/(|V|-1)``."""
    psi = 1.0 / vocab_size
    psi_prime = [(1 - psi_dk) / (vocab_size - 1)] * vocab_size
    psi_prime[dk_id] = psi_dk
    return [math.log(p / psi) for p in psi_prime]

"""Per-step readout: ``(log_t, log_d, log_not_d)`` from logits.

With softmax ``y`` over the full vocabulary (after the dk prior offset) at a step:

* ``d = y_dk`` (the model's wish to abstain, ``<don't know>``),
* ``t = y_target / (1 - y_dk)`` (the target's probability renormalised without dk).

In log space, with ``z`` the logits, ``b`` the dk prior offset and ``r = LSE(z_{j != dk})``,
``a = LSE(r, z_dk + b)``::

    log_d     = z_dk + b - a
    log_not_d = r - a
    log_t     = z_target - r

The dk prior (paper appendix, "Initializing <don't know>") adds ``log(psi'/psi)`` to the logits
with ``psi`` uniform, ``psi'_dk`` (default 0.9) and ``psi'_other = (1 - psi'_dk)/(|V| - 1)``.
Adding the same constant to every non-dk logit changes nothing after normalisation, so the
prior is exactly a bias ``b = log(psi'_dk / psi'_other)`` on the dk logit alone.

Without a dk id (baseline, TBYS) ``log_t`` is plain log-softmax at the target,
``log_d = -inf`` and ``log_not_d = 0``.

:func:`readout` is an autograd function that works on row chunks and recomputes the softmax in
backward, so besides the caller's logits (and their gradient) it holds no logits-sized tensor.
"""

from __future__ import annotations

import math

import torch

from .layout import IGNORE_INDEX

DEFAULT_PSI_DK = 0.9
_CHUNK_ELEMENTS = 1 << 24  # rows per chunk are chosen so a chunk holds about this many logits


def dk_logit_bias(vocab_size: int, psi_dk: float | None = DEFAULT_PSI_DK) -> float:
    """The dk prior as a bias on the dk logit: ``log(psi_dk / ((1 - psi_dk) / (V - 1)))``.

    ``psi_dk=None`` means no prior (bias 0).  ``psi_dk = 1/V`` is the uniform prior (bias 0).
    """
    if psi_dk is None:
        return 0.0
    if not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an int >= 2 for a dk prior, got {vocab_size!r}")
    if not 0.0 < float(psi_dk) < 1.0:
        raise ValueError(f"psi_dk (the dk prior probability) must lie in (0, 1), got {psi_dk!r}")
    return math.log(psi_dk) - math.log1p(-psi_dk) + math.log(vocab_size - 1)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rows_per_chunk(vocab_size: int) -> int:
    return max(1, _CHUNK_ELEMENTS // max(vocab_size, 1))


def _chunk_stats(z: torch.Tensor, tgt: torch.Tensor, dk_id: int | None, bias: float):
    """``(log_t, log_d, log_not_d, norm)`` for a chunk of float rows ``z [n, V]``.

    ``norm`` is the log-normaliser of the target distribution: ``LSE(z)`` without dk,
    ``r = LSE(z_{j != dk})`` with it.  ``z`` is a private copy and may be modified.
    """
    valid = tgt != IGNORE_INDEX
    safe_tgt = torch.where(valid, tgt, torch.zeros_like(tgt))
    z_tgt = z.gather(1, safe_tgt.unsqueeze(1)).squeeze(1)
    if dk_id is None:
        norm = torch.logsumexp(z, dim=1)
        log_t = torch.where(valid, z_tgt - norm, torch.zeros_like(norm))
        return log_t, torch.full_like(norm, -math.inf), torch.zeros_like(norm), norm
    zb = z[:, dk_id] + bias
    z[:, dk_id] = -math.inf
    norm = torch.logsumexp(z, dim=1)
    a = torch.logaddexp(norm, zb)
    log_t = torch.where(valid, z_tgt - norm, torch.zeros_like(norm))
    return log_t, zb - a, norm - a, norm


class _Readout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, dk_id, bias):
        n, v = logits.shape
        cdt = _compute_dtype(logits.dtype)
        out = torch.empty(4, n, dtype=cdt, device=logits.device)
        step = _rows_per_chunk(v)
        for s in range(0, n, step):
            z = logits[s : s + step].to(cdt, copy=True)
            for k, val in enumerate(_chunk_stats(z, targets[s : s + step], dk_id, bias)):
                out[k, s : s + step] = val
        ctx.save_for_backward(logits, targets, out)
        ctx.dk_id = dk_id
        return out[0], out[1], out[2]

    @staticmethod
    def backward(ctx, g_t, g_d, g_nd):
        logits, targets, out = ctx.saved_tensors
        dk_id = ctx.dk_id
        n, v = logits.shape
        cdt = out.dtype
        zeros = torch.zeros(n, dtype=cdt, device=logits.device)
        g_t = zeros if g_t is None else g_t.to(cdt)
        g_d = zeros if g_d is None else g_d.to(cdt)
        g_nd = zeros if g_nd is None else g_nd.to(cdt)
        valid = targets != IGNORE_INDEX
        g_t = torch.where(valid, g_t, zeros)
        safe_tgt = torch.where(valid, targets, torch.zeros_like(targets))
        norm = out[3]
        if dk_id is None:
            coef = -g_t  # d log_t / dz = onehot(target) - softmax(z)
        else:
            # For j != dk: dz_j = q_j * (-g_d (1-d) + g_nd d - g_t) + g_t [j = target], with q the
            # softmax over non-dk logits; dz_dk = g_d (1-d) - g_nd d.
            d, not_d = out[1].exp(), out[2].exp()
            coef = -g_d * not_d + g_nd * d - g_t
            grad_dk = g_d * not_d - g_nd * d
        grad = torch.empty_like(logits)
        step = _rows_per_chunk(v)
        for s in range(0, n, step):
            sl = slice(s, s + step)
            z = logits[sl].to(cdt, copy=True)
            z.sub_(norm[sl].unsqueeze(1)).exp_().mul_(coef[sl].unsqueeze(1))
            if dk_id is not None:
                z[:, dk_id] = grad_dk[sl]
            z.scatter_add_(1, safe_tgt[sl].unsqueeze(1), g_t[sl].unsqueeze(1))
            grad[sl] = z.to(grad.dtype)
        return grad, None, None, None


def readout(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    dk_id: int | None = None,
    dk_bias: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log_t, log_d, log_not_d)`` at every position, in float32 (float64 for float64 input).

    Args:
        logits: ``[..., V]`` any float dtype (bf16 included).
        targets: ``[...]`` long target ids; ``IGNORE_INDEX`` (-100) marks positions without a
            target (their ``log_t`` is 0 and gets no gradient).
        dk_id: the ``<don't know>`` id, or None for a readout without dk.
        dk_bias: the dk prior offset (see :func:`dk_logit_bias`).

    Returns:
        three tensors of shape ``[...]``.  Gradients flow to ``logits``.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits [..., V] and targets [...] do not line up: {tuple(logits.shape)} vs "
            f"{tuple(targets.shape)}"
        )
    v = logits.shape[-1]
    if dk_id is not None and not 0 <= dk_id < v:
        raise ValueError(f"dk_id = {dk_id} is outside the vocabulary [0, {v})")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    flat_t = targets.reshape(-1).long()
    if flat_t.numel():
        real = flat_t[flat_t != IGNORE_INDEX]
        if real.numel() and (int(real.min()) < 0 or int(real.max()) >= v):
            raise ValueError(f"targets hold ids outside the vocabulary [0, {v})")
        if dk_id is not None and bool((real == dk_id).any()):
            raise ValueError(f"a target equals dk_id = {dk_id}; <don't know> is never a target")
    lt, ld, lnd = _Readout.apply(logits.reshape(-1, v), flat_t, dk_id, float(dk_bias))
    shape = targets.shape
    return lt.view(shape), ld.view(shape), lnd.view(shape)


def readout_reference(
    logits: torch.Tensor, targets: torch.Tensor, *, dk_id: int | None = None, dk_bias: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain autograd version of :func:`readout` (materialises float copies); for tests."""
    z = logits.to(_compute_dtype(logits.dtype))
    valid = targets != IGNORE_INDEX
    safe = torch.where(valid, targets, torch.zeros_like(targets)).long()
    z_tgt = z.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    if dk_id is None:
        lt = torch.where(valid, z_tgt - torch.logsumexp(z, -1), torch.zeros_like(z_tgt))
        return lt, torch.full_like(lt, -math.inf), torch.zeros_like(lt)
    is_dk = torch.arange(z.shape[-1], device=z.device) == dk_id
    r = torch.logsumexp(z.masked_fill(is_dk, -math.inf), -1)
    zb = z[..., dk_id] + dk_bias
    a = torch.logaddexp(r, zb)
    lt = torch.where(valid, z_tgt - r, torch.zeros_like(r))
    return lt, zb - a, r - a

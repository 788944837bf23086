"""The work on one chunk of logits, for :mod:`cyb.kernels.chunked`'s loops.

* Backends: what is done elementwise to a chunk of logits (softcap, the readout's log-sum-exp
  and gathered logits, the logits gradient), with plain tensor ops (:class:`_TorchOps`, any
  device) or the triton kernels of :mod:`cyb.kernels.triton_readout` (:class:`_TritonOps`), and
  which one a call gets (:func:`resolve_backend`).
* The per-row formulas of the readout and of its gradient (see :mod:`cyb.readout`).
* The gradient matmuls of a chunk, accumulated in float32.
"""

from __future__ import annotations

import importlib.util
import math
import os

import torch

from ..layout import IGNORE_INDEX

BACKENDS = ("auto", "torch", "triton")


def triton_available() -> bool:
    """True when the :mod:`triton` package is installed (needed for ``backend="triton"``).

    It does not import triton: ``TRITON_INTERPRET=1`` takes effect only if set before the first
    import, so a check must not import it early.
    """
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def interpreting() -> bool:
    """Whether ``TRITON_INTERPRET`` asks triton to run kernels on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


def resolve_backend(backend: str, device: torch.device, dtype: torch.dtype) -> str:
    """``"torch"`` or ``"triton"`` for ``backend`` in :data:`BACKENDS` and tensors on ``device``.

    ``"auto"`` picks triton on CUDA when it imports (and the dtype is not float64), else torch.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torch":
        return "torch"
    if backend == "auto":
        use = device.type == "cuda" and dtype != torch.float64 and triton_available()
        return "triton" if use else "torch"
    if not triton_available():
        raise RuntimeError("backend='triton' needs the triton package (pip install triton)")
    if dtype == torch.float64:
        raise TypeError("backend='triton' computes in float32; use backend='torch' for float64")
    if device.type != "cuda" and not interpreting():
        raise RuntimeError(
            f"backend='triton' runs on CUDA tensors, or on {device.type} tensors only with "
            "TRITON_INTERPRET=1 set before triton is first imported"
        )
    return "triton"


class _TorchOps:
    """Chunk work with plain tensor ops.  ``work`` is the capped logits in the compute dtype."""

    @staticmethod
    def prepare(u: torch.Tensor, softcap: float | None) -> torch.Tensor:
        z = u.to(compute_dtype(u.dtype))  # u is a private matmul output: in place is fine
        if softcap is not None:
            z.div_(softcap).tanh_().mul_(softcap)
        return z

    @staticmethod
    def stats(u, targets, dk_id, dk_bias, softcap, out):
        """Fill ``out = (log_t, log_d, log_not_d, norm)`` for the rows of ``u``; return ``work``."""
        valid = targets != IGNORE_INDEX
        z = _TorchOps.prepare(u, softcap)
        z_tgt = z.gather(1, torch.where(valid, targets, 0).unsqueeze(1)).squeeze(1)
        if dk_id is None:
            norm, z_dk = torch.logsumexp(z, dim=1), None
        else:
            z_dk = z[:, dk_id].clone()
            z[:, dk_id] = -math.inf
            norm = torch.logsumexp(z, dim=1)
            z[:, dk_id] = z_dk
        for buf, val in zip(out, (*_row_outputs(norm, z_tgt, z_dk, valid, dk_id, dk_bias), norm)):
            buf.copy_(val)
        return z

    @staticmethod
    def grad(work, targets, norm, log_d, log_not_d, g_t, g_d, g_nd, dk_id, softcap, out_dtype):
        """``d loss / d u`` of the chunk (``work`` is consumed), in ``out_dtype``."""
        valid = targets != IGNORE_INDEX
        coef, g_t, g_dk = _row_coefficients(g_t, g_d, g_nd, log_d, log_not_d, valid, dk_id)
        shifted = work.sub_(norm.unsqueeze(1)) if softcap is None else work - norm.unsqueeze(1)
        g = shifted.exp_().mul_(coef.unsqueeze(1))
        g.scatter_add_(1, torch.where(valid, targets, 0).unsqueeze(1), g_t.unsqueeze(1))
        if dk_id is not None:
            g[:, dk_id] = g_dk
        if softcap is not None:  # d softcap(u) / du = 1 - (z / c)^2
            g.mul_(work.div_(softcap).square_().neg_().add_(1.0))
        return g.to(out_dtype)


class _TritonOps:
    """Chunk work with the triton kernels.  ``work`` is the matmul output itself (pre-cap)."""

    @staticmethod
    def prepare(u, softcap):
        return u

    @staticmethod
    def stats(u, targets, dk_id, dk_bias, softcap, out):
        from . import triton_readout

        triton_readout.row_stats(u, targets, dk_id, dk_bias, softcap, out)
        return u

    @staticmethod
    def grad(work, targets, norm, log_d, log_not_d, g_t, g_d, g_nd, dk_id, softcap, out_dtype):
        from . import triton_readout

        g = triton_readout.logits_grad_(work, targets, norm, log_d, log_not_d, g_t, g_d, g_nd,
                                        dk_id, softcap)
        return g.to(out_dtype)


OPS = {"torch": _TorchOps, "triton": _TritonOps}


# ------------------------------------------------------------------------ per-row formulas


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _row_outputs(norm, z_tgt, z_dk, valid, dk_id, dk_bias):
    """``(log_t, log_d, log_not_d)`` from the target normaliser and the gathered logits."""
    log_t = torch.where(valid, z_tgt - norm, 0.0)
    if dk_id is None:
        return log_t, torch.full_like(norm, -math.inf), torch.zeros_like(norm)
    zb = z_dk + dk_bias
    a = torch.logaddexp(norm, zb)
    return log_t, zb - a, norm - a


def _row_coefficients(g_t, g_d, g_nd, log_d, log_not_d, valid, dk_id):
    """Per-row ``(coef, g_t, g_dk)`` of ``d loss / d z`` (see :mod:`cyb.readout`).

    For ``j != dk``: ``dz_j = q_j coef + g_t [j = target]`` with ``q`` the softmax without dk;
    ``dz_dk = g_dk``.
    """
    g_t = torch.where(valid, g_t, 0.0)
    if dk_id is None:
        return -g_t, g_t, None
    d, not_d = log_d.exp(), log_not_d.exp()
    return g_nd * d - g_d * not_d - g_t, g_t, g_d * not_d - g_nd * d


# --------------------------------------------------------------------------- matmul helpers

_ADDMM_OUT_DTYPE: bool | None = None  # whether addmm(..., out_dtype=float32) works on CUDA


def _addmm_out_dtype_works(device: torch.device) -> bool:
    global _ADDMM_OUT_DTYPE
    if _ADDMM_OUT_DTYPE is None:
        try:
            a = torch.ones(3, 2, dtype=torch.bfloat16, device=device)
            acc = torch.ones(3, 3, dtype=torch.float32, device=device)
            torch.addmm(acc, a, a.t(), out_dtype=torch.float32, out=acc)
            _ADDMM_OUT_DTYPE = bool((acc == 3).all())
        except Exception:
            _ADDMM_OUT_DTYPE = False
    return _ADDMM_OUT_DTYPE


def _accumulate_mm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` with ``acc`` float32/float64 and ``a``, ``b`` possibly lower precision."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif acc.is_cuda and _addmm_out_dtype_works(acc.device):
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)  # fp32 accumulation in the GEMM
    else:
        acc.add_(torch.mm(a, b))


def chunk_grads(g, hc, weight, grad_h_rows, grad_w, grad_b):
    """The three gradient matmuls of one chunk (``g = d loss / d u`` in the matmul dtype)."""
    if grad_h_rows is not None:
        torch.mm(g, weight, out=grad_h_rows)
    if grad_w is not None:
        _accumulate_mm(grad_w, g.t(), hc)
    if grad_b is not None:
        grad_b.add_(g.sum(0, dtype=grad_b.dtype))


def zeros_acc(like: torch.Tensor, needed: bool) -> torch.Tensor | None:
    if not needed:
        return None
    return torch.zeros(like.shape, dtype=compute_dtype(like.dtype), device=like.device)


def empty_rows(like: torch.Tensor, needed: bool) -> torch.Tensor | None:
    """A contiguous gradient for ``hidden`` (its row slices are matmul outputs)."""
    return torch.empty(like.shape, dtype=like.dtype, device=like.device) if needed else None

"""Triton kernels for the elementwise part of the fused readout.

Both kernels work on one chunk of pre-cap logits ``u [n, V]`` (the output of
``hidden @ weight.T + bias``, any float dtype, contiguous rows); the matmuls are left to
``torch.matmul``.  With ``z = softcap(u)``, a dk id and dk bias ``b``:

* :func:`row_stats` (one program per row, an online max / sum over tiles of ``BLOCK_V``
  columns) writes per row::

      norm      = LSE_{j != dk} z_j
      log_t     = z_target - norm         (0 where the target is -100)
      log_d     = z_dk + b - a,  log_not_d = norm - a,  a = logaddexp(norm, z_dk + b)

  (without dk: ``norm = LSE_j z_j``, ``log_d = -inf``, ``log_not_d = 0``).
* :func:`logits_grad_` (one program per row and tile) overwrites ``u`` in place with
  ``d loss / d u`` given the upstream gradients ``g_t, g_d, g_nd`` of the three outputs::

      coef  = -g_d (1 - d) + g_nd d - g_t,   g_dk = g_d (1 - d) - g_nd d,   d = exp(log_d)
      g_j   = exp(z_j - norm) coef + g_t [j = target]      (j != dk)
      g_dk  at the dk column
      d loss / d u_j = g_j (1 - tanh(u_j / cap)^2)          (with a softcap)

  ``g_t`` counts only where the target is not -100.

Softmax math is float32 whatever the dtype of ``u``.  The kernels run on CUDA tensors, and on
CPU tensors when ``TRITON_INTERPRET=1`` was set before triton was first imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 2048  # columns per tile
STATS_WARPS = 4  # fastest on an H200 for V = 32k and 256k (bf16)
GRAD_WARPS = 8


@triton.jit
def _tanh(x):
    # tanh from exp, stable for large |x| (tl has no tanh shared by CUDA and the interpreter)
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _row_stats_kernel(
    u_ptr, u_stride, tgt_ptr, norm_ptr, lt_ptr, ld_ptr, lnd_ptr, V, dk_id, dk_bias, cap,
    HAS_DK: tl.constexpr, HAS_CAP: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = u_ptr + row * u_stride
    m = float("-inf")
    s = 0.0
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        inside = cols < V
        z = tl.load(base + cols, mask=inside, other=0.0).to(tl.float32)
        if HAS_CAP:
            z = cap * _tanh(z / cap)
        keep = inside
        if HAS_DK:
            keep = keep & (cols != dk_id)
        z = tl.where(keep, z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, axis=0))
        # m_new stays -inf while every column seen is masked (a first tile holding only dk)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(tl.exp(z - shift), axis=0)
        m = m_new
    norm = m + tl.log(s)

    tgt = tl.load(tgt_ptr + row)
    valid = tgt >= 0  # -100 marks a row without a target
    z_t = tl.load(base + tl.where(valid, tgt, 0)).to(tl.float32)
    if HAS_CAP:
        z_t = cap * _tanh(z_t / cap)
    log_t = tl.where(valid, z_t - norm, 0.0)
    log_d = float("-inf")
    log_nd = 0.0
    if HAS_DK:
        z_dk = tl.load(base + dk_id).to(tl.float32)
        if HAS_CAP:
            z_dk = cap * _tanh(z_dk / cap)
        zb = z_dk + dk_bias
        top = tl.maximum(norm, zb)
        a = top + tl.log(tl.exp(norm - top) + tl.exp(zb - top))
        log_d = zb - a
        log_nd = norm - a
    tl.store(norm_ptr + row, norm)
    tl.store(lt_ptr + row, log_t)
    tl.store(ld_ptr + row, log_d)
    tl.store(lnd_ptr + row, log_nd)


@triton.jit
def _logits_grad_kernel(
    u_ptr, u_stride, tgt_ptr, norm_ptr, ld_ptr, lnd_ptr, gt_ptr, gd_ptr, gnd_ptr, V, dk_id, cap,
    HAS_DK: tl.constexpr, HAS_CAP: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    inside = cols < V
    base = u_ptr + row * u_stride

    tgt = tl.load(tgt_ptr + row)
    norm = tl.load(norm_ptr + row)
    g_t = tl.where(tgt >= 0, tl.load(gt_ptr + row), 0.0)
    coef = -g_t
    g_dk = 0.0
    if HAS_DK:
        d = tl.exp(tl.load(ld_ptr + row))
        not_d = tl.exp(tl.load(lnd_ptr + row))
        g_d = tl.load(gd_ptr + row)
        g_nd = tl.load(gnd_ptr + row)
        coef = g_nd * d - g_d * not_d - g_t
        g_dk = g_d * not_d - g_nd * d

    u = tl.load(base + cols, mask=inside, other=0.0).to(tl.float32)
    t = u
    z = u
    if HAS_CAP:
        t = _tanh(u / cap)
        z = cap * t
    g = tl.exp(z - norm) * coef
    g = tl.where(cols == tgt, g + g_t, g)
    if HAS_DK:
        g = tl.where(cols == dk_id, g_dk, g)
    if HAS_CAP:
        g = g * (1.0 - t * t)
    tl.store(base + cols, g.to(u_ptr.dtype.element_ty), mask=inside)


def _block(v: int) -> int:
    return min(BLOCK_V, max(16, triton.next_power_of_2(v)))


def _check_rows(u: torch.Tensor) -> None:
    if u.dim() != 2 or u.stride(1) != 1:
        raise ValueError(
            f"u must be a [n, V] tensor with contiguous rows, got shape {tuple(u.shape)}"
        )
    if u.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"the triton readout takes float32/bfloat16/float16 logits, got {u.dtype}")


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).contiguous()


def row_stats(
    u: torch.Tensor,
    targets: torch.Tensor,
    dk_id: int | None,
    dk_bias: float,
    softcap: float | None,
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    """Write ``(log_t, log_d, log_not_d, norm)`` of ``u [n, V]`` into ``out`` (four contiguous
    float32 ``[n]`` tensors); ``targets`` is a long ``[n]`` tensor (-100: no target)."""
    _check_rows(u)
    n, v = u.shape
    lt, ld, lnd, norm = out
    for name, t in zip(("log_t", "log_d", "log_not_d", "norm"), out):
        if t.shape != (n,) or t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"out {name} must be a contiguous float32 [{n}] tensor")
    if n:
        _row_stats_kernel[(n,)](
            u, u.stride(0), targets.contiguous(), norm, lt, ld, lnd, v,
            0 if dk_id is None else int(dk_id), float(dk_bias),
            1.0 if softcap is None else float(softcap),
            HAS_DK=dk_id is not None, HAS_CAP=softcap is not None, BLOCK_V=_block(v),
            num_warps=STATS_WARPS,
        )


def logits_grad_(
    u: torch.Tensor,
    targets: torch.Tensor,
    norm: torch.Tensor,
    log_d: torch.Tensor,
    log_not_d: torch.Tensor,
    g_t: torch.Tensor,
    g_d: torch.Tensor | None,
    g_nd: torch.Tensor | None,
    dk_id: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """Overwrite ``u [n, V]`` with ``d loss / d u`` (see the module docstring) and return it.

    ``norm``, ``log_d``, ``log_not_d`` as written by :func:`row_stats`; ``g_t``, ``g_d``,
    ``g_nd`` the upstream gradients (``[n]``; ``g_d``/``g_nd`` needed only with a dk id).
    """
    _check_rows(u)
    n, v = u.shape
    if dk_id is not None and (g_d is None or g_nd is None):
        raise ValueError("g_d and g_nd (gradients of log_d, log_not_d) are needed with a dk id")
    norm, log_d, log_not_d, g_t = (_f32(x) for x in (norm, log_d, log_not_d, g_t))
    g_d = g_t if g_d is None else _f32(g_d)
    g_nd = g_t if g_nd is None else _f32(g_nd)
    block = _block(v)
    if n:
        _logits_grad_kernel[(n, triton.cdiv(v, block))](
            u, u.stride(0), targets.contiguous(), norm, log_d, log_not_d, g_t, g_d, g_nd, v,
            0 if dk_id is None else int(dk_id), 1.0 if softcap is None else float(softcap),
            HAS_DK=dk_id is not None, HAS_CAP=softcap is not None, BLOCK_V=block,
            num_warps=GRAD_WARPS,
        )
    return u

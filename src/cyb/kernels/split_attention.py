"""Private and gated attention over Recipe 1's interleaved layout, without a mask.

A Recipe 1 row lays ``L`` real tokens out as blocks of ``M`` steps, ``x1 p p p x2 p p p ..``
(:func:`cyb.visibility.recipe1_steps`).  Under private pauses the query at (token ``i``, step
``j``) sees the real tokens ``1..i`` and the steps ``1..j`` of its own block; under gated pauses
it also sees the pauses of earlier tokens, with its head's gate added to their logits.  Each of
these key sets is a plain causal attention or a tiny dense one:

* **A, the real tokens**: every step's queries against the real keys, causal over tokens.  The
  ``M`` steps ride as extra query heads that share a key head (grouped-query attention), so A
  is one causal call of ``L`` queries over ``L`` keys with ``M x heads`` query heads.
* **B, the own block**: steps ``1..j`` of the query's own block, an ``(M-1) x (M-1)`` lower
  triangle per token, computed directly.
* **C, earlier tokens' pauses** (gated only): for each pause step ``j'``, the queries of tokens
  ``2..L`` against step ``j'`` of tokens ``1..L-1`` (strictly earlier tokens), a causal call
  of ``L-1`` over ``L-1``.  The gate is a constant on every logit of C, so it only shifts C's
  log-sum-exp.

The parts are merged by their log-sum-exps (the softmax over the union of the key sets).  The
backward pass runs each causal call's own backward with the *merged* output and log-sum-exp,
which gives exact gradients (each part's probabilities are then the merged softmax's), and the
gate's gradient is C's share of the attention times how far C's output is from the merged one.

Cost: private pauses about ``M L^2 / 2`` attention products in causal kernels (the
block-sparse bound), with no reordering and no mask; gated pauses about the shared layout's
``(M L)^2 / 2``, with no ``[T, T]`` bias.  Padding must come last in each row (the caller rolls
left-padded rows): causal calls then never let a real query see it.

Kernels (:func:`kernel_for`): FlashAttention through PyTorch's
``_scaled_dot_product_flash_attention`` ops on CUDA in bf16/fp16, the explicit softmax of
:class:`MathKernel` elsewhere (float64 on the CPU is the tests' reference).
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


class MathKernel:
    """Causal attention with its log-sum-exp, by an explicit softmax (any device and dtype;
    float32 arithmetic, float64 for float64 inputs).  Tensors are ``[B, heads, L, dim]``; keys
    may have fewer heads (each serves ``heads / kv_heads`` consecutive query heads)."""

    name = "math"

    @staticmethod
    def _scores(q, k, scale):
        ct = torch.float64 if q.dtype == torch.float64 else torch.float32
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        s = (q.to(ct) @ k.to(ct).transpose(-1, -2)) * scale
        n, m = s.shape[-2:]
        allowed = torch.ones(n, m, dtype=torch.bool, device=s.device).tril()
        return s.masked_fill(~allowed, NEG_INF), ct

    def forward(self, q, k, v, scale):
        """``(out [B, H, L, dim] in q's dtype, lse [B, H, L] float32 or float64)``."""
        s, ct = self._scores(q, k, scale)
        lse = s.logsumexp(-1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1).to(ct)
        return ((s - lse.unsqueeze(-1)).exp() @ v).to(q.dtype), lse

    def backward(self, do, q, k, v, out, lse, scale):
        """``(dq, dk, dv)`` given the merged ``out`` and ``lse`` of every part the queries
        attend to (the probabilities are ``exp(s - lse)``)."""
        s, ct = self._scores(q, k, scale)
        group = q.shape[1] // k.shape[1]
        p = (s - lse.to(ct).unsqueeze(-1)).exp()
        do, vv = do.to(ct), v.repeat_interleave(group, dim=1).to(ct)
        delta = (do * out.to(ct)).sum(-1, keepdim=True)
        ds = p * (do @ vv.transpose(-1, -2) - delta)
        dq = (ds @ k.repeat_interleave(group, dim=1).to(ct)) * scale
        dk = (ds.transpose(-1, -2) @ q.to(ct)) * scale
        dv = p.transpose(-1, -2) @ do
        b, h, n, d = dk.shape
        dk = dk.view(b, h // group, group, n, d).sum(2)
        dv = dv.view(b, h // group, group, n, d).sum(2)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class FlashKernel:
    """Causal FlashAttention (CUDA, bf16/fp16, head dim up to 256), grouped-query heads native."""

    name = "flash"

    def forward(self, q, k, v, scale):
        out, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, True, False, scale=scale)
        return out, lse

    def backward(self, do, q, k, v, out, lse, scale):
        n, m = q.shape[2], k.shape[2]
        # (no dropout: the random-state arguments are never read)
        seed = torch.empty(2, dtype=torch.uint64, device=q.device)
        offset = torch.empty((), dtype=torch.uint64, device=q.device)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            do, q, k, v, out, lse.contiguous(), None, None, n, m, 0.0, True, seed, offset, scale=scale)
        return dq, dk, dv


_KERNELS = {"math": MathKernel(), "flash": FlashKernel()}


def kernel_for(q: torch.Tensor, kernel: str = "auto") -> str:
    """The name of the causal kernel for queries like ``q``: ``"flash"`` (CUDA, bf16/fp16, head
    dim <= 256) or ``"math"``; ``kernel="auto"`` picks flash where it runs."""
    if kernel not in ("auto", "flash", "math"):
        raise ValueError(f"kernel must be auto, flash or math, got {kernel!r}")
    flash_ok = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256
    if kernel == "flash" and not flash_ok:
        raise ValueError("the flash kernel needs CUDA tensors in bf16 or fp16 with head dim <= 256")
    return "flash" if kernel == "flash" or (kernel == "auto" and flash_ok) else "math"


# ----------------------------------------------------------------------------- layouts
# A layer's tensors arrive as [B, heads, T, dim] views of [B, T, heads, dim], that is
# [B, L, M, heads, dim] (token, step).  The causal calls take [B, heads * M, L, dim] views of
# [B, L, heads, M, dim] ("step heads": the steps of each head adjacent, so that grouped-query
# attention maps query head (h, j) to key head h, or h // group); their log-sum-exps come as
# [B, heads * M, L].  Merging works on [B, L, heads, M] log-sum-exps (small: no dim).


def _blocks(x: torch.Tensor, m: int) -> torch.Tensor:
    """``[B, heads, T, dim]`` -> ``[B, L, M, heads, dim]`` (a view where the layout allows)."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t // m, m, h, d)


def _step_heads(x5: torch.Tensor) -> torch.Tensor:
    """``[B, L, M, H, dim]`` -> ``[B, H * M, L, dim]`` (a copy laid out ``[B, L, H, M, dim]``)."""
    b, n, m, h, d = x5.shape
    return x5.permute(0, 1, 3, 2, 4).reshape(b, n, h * m, d).transpose(1, 2)


def _per_step(y: torch.Tensor, m: int) -> torch.Tensor:
    """A causal call's ``[B, H * M, n, dim]`` as ``[B, n, H, M, dim]`` (a view)."""
    b, hm, n, d = y.shape
    return y.transpose(1, 2).reshape(b, n, hm // m, m, d)


def _lse_per_step(lse: torch.Tensor, m: int) -> torch.Tensor:
    """A causal call's ``[B, H * M, n]`` as ``[B, n, H, M]``."""
    b, hm, n = lse.shape
    return lse.view(b, hm // m, m, n).permute(0, 3, 1, 2)


def _lse_step_heads(lse: torch.Tensor) -> torch.Tensor:
    """``[B, n, H, M]`` -> ``[B, H * M, n]`` (contiguous, as the causal calls take it)."""
    b, n, h, m = lse.shape
    return lse.permute(0, 2, 3, 1).reshape(b, h * m, n).contiguous()


def _keys(x5: torch.Tensor, step: int, tokens: slice = slice(None)) -> torch.Tensor:
    """Step ``step`` of the blocks ``tokens`` as causal-call keys ``[B, kv_heads, n, dim]``."""
    return x5[:, tokens, step].transpose(1, 2)


def _dot(q: torch.Tensor, k: torch.Tensor, ct) -> torch.Tensor:
    """``[B, L, H]``: each query head's dot product with its key head (``q [B, L, H, dim]``,
    ``k [B, L, kv_heads, dim]``), in ``ct``."""
    kv = k.shape[2]
    return (q.unflatten(2, (kv, -1)).to(ct) * k.unsqueeze(3).to(ct)).sum(-1).flatten(2)


def _weigh(w: torch.Tensor, v: torch.Tensor, ct) -> torch.Tensor:
    """``[B, L, H, dim]``: each query head's weight ``w [B, L, H]`` times its key head's value
    ``v [B, L, kv_heads, dim]``."""
    kv = v.shape[2]
    return (w.unflatten(2, (kv, -1)).unsqueeze(-1) * v.unsqueeze(3).to(ct)).flatten(2, 3)


def _group_sum(x: torch.Tensor, kv: int) -> torch.Tensor:
    """``[B, L, H, dim]`` summed over the query heads that share each key head."""
    return x.unflatten(2, (kv, -1)).sum(3)


def _pad_first_token(x: torch.Tensor, fill: float) -> torch.Tensor:
    """``x`` over tokens ``2..L`` (dim 1) with token 1 added in front, filled with ``fill``."""
    return torch.cat([torch.full_like(x[:, :1], fill), x], dim=1)


def _own_block_scores(q5, k5, step: int, scale: float, ct) -> list[torch.Tensor]:
    """The logits ``[B, L, H]`` of step ``step``'s queries on steps ``1..step`` of their own
    block."""
    return [_dot(q5[:, :, step], k5[:, :, j], ct) * scale for j in range(1, step + 1)]


def _earlier_pauses(kernel, q_heads, k5, v5, m: int, scale: float, ct):
    """Part C: ``(out [B, L, H, M, dim] in q's dtype, lse [B, L, H, M])`` of every query on
    the pauses of earlier tokens, without the gate (token 1 has none: lse minus infinity)."""
    n = k5.shape[1]
    calls = [kernel.forward(q_heads[:, :, 1:], _keys(k5, j, slice(0, n - 1)), _keys(v5, j, slice(0, n - 1)),
                            scale) for j in range(1, m)]
    lses = torch.stack([_lse_per_step(lse, m).to(ct) for _, lse in calls])
    lse = lses.logsumexp(0)
    out = sum((part - lse).exp().unsqueeze(-1) * _per_step(o, m).to(ct) for part, (o, _) in zip(lses, calls))
    return _pad_first_token(out.to(q_heads.dtype), 0.0), _pad_first_token(lse, NEG_INF)


def _own_block_merge(q5, k5, v5, out_a, lse_a, out_c, lse_c, scale: float, ct):
    """``(out [B, L, M, H, dim], lse [B, L, H, M])``: part A (``out_a [B, L, H, M, dim]``,
    ``lse_a [B, L, H, M]``), part C when given (the gate already in ``lse_c``) and the own
    block's pauses merged, step by step with tensor ops (:mod:`cyb.kernels.triton_own_block`
    does it in one kernel)."""
    b, n, m, h, d = q5.shape
    out = torch.empty((b, n, m, h, d), dtype=q5.dtype, device=q5.device)
    lse = torch.empty((b, n, h, m), dtype=ct, device=q5.device)
    for i in range(m):
        parts = [lse_a[..., i]] + ([lse_c[..., i]] if out_c is not None else [])
        own = _own_block_scores(q5, k5, i, scale, ct)
        if len(parts) + len(own) == 1:  # a real token under private pauses: part A alone
            out[:, :, i] = out_a[:, :, :, i]
            lse[..., i] = lse_a[..., i]
            continue
        lse_i = torch.stack(parts + own).logsumexp(0)  # [B, L, H]
        o = (lse_a[..., i] - lse_i).exp().unsqueeze(-1) * out_a[:, :, :, i].to(ct)
        if out_c is not None:
            o = o + (lse_c[..., i] - lse_i).exp().unsqueeze(-1) * out_c[:, :, :, i].to(ct)
        for j, s in enumerate(own, start=1):
            o = o + _weigh((s - lse_i).exp(), v5[:, :, j], ct)
        out[:, :, i] = o.to(out.dtype)
        lse[..., i] = lse_i
    return out, lse


def _own_block_grads_(q5, k5, v5, do5, lse, delta, dq, dk, dv, scale: float, ct) -> None:
    """Add the own block's share of the gradients into ``dq [B, L, H, M, dim]``, ``dk`` and ``dv``
    (``[B, L, M, kv_heads, dim]``), given the merged ``lse [B, L, H, M]`` and ``delta [B, L, M,
    H]`` (the rows' sums of output times its gradient), with tensor ops."""
    m, kv = q5.shape[2], k5.shape[3]
    for i in range(1, m):
        own = _own_block_scores(q5, k5, i, scale, ct)
        do_i = do5[:, :, i].to(ct)
        for j, s in enumerate(own, start=1):
            p = (s - lse[..., i]).exp()
            ds = p * (_dot(do_i, v5[:, :, j], ct) - delta[:, :, i])
            dq[:, :, :, i] += _weigh(ds, k5[:, :, j], ct) * scale
            dk[:, :, j] += _group_sum(ds.unsqueeze(-1) * q5[:, :, i].to(ct), kv) * scale
            dv[:, :, j] += _group_sum(p.unsqueeze(-1) * do_i, kv)


class _SplitAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, gate, num_steps, scale, kernel_name, own_block):
        m, kernel = num_steps, _KERNELS[kernel_name]
        q5, k5, v5 = _blocks(query, m), _blocks(key, m), _blocks(value, m)
        b, n, _, h, d = q5.shape
        ct = torch.float64 if query.dtype == torch.float64 else torch.float32
        q_heads = _step_heads(q5)
        out_a, lse_a = kernel.forward(q_heads, _keys(k5, 0), _keys(v5, 0), scale)
        out_a, lse_a = _per_step(out_a, m), _lse_per_step(lse_a, m).to(ct)
        out_c = lse_c = None
        if gate is not None and m > 1 and n > 1:
            out_c, lse_c = _earlier_pauses(kernel, q_heads, k5, v5, m, scale, ct)
            lse_gated = lse_c + gate.to(ct).view(h, 1)
        if own_block == "triton":
            from .triton_own_block import own_block_forward

            out, lse = own_block_forward(q5, k5, v5, out_a, lse_a, out_c,
                                         lse_gated if out_c is not None else None, scale)
        else:
            out, lse = _own_block_merge(q5, k5, v5, out_a, lse_a, out_c,
                                        lse_gated if out_c is not None else None, scale, ct)
        ctx.num_steps, ctx.scale, ctx.kernel, ctx.own_block = m, scale, kernel_name, own_block
        ctx.save_for_backward(query, key, value, gate, out, lse, out_c, lse_c)
        return out.view(b, n * m, h, d)

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, gate, out, lse, out_c, lse_c = ctx.saved_tensors
        m, scale, kernel = ctx.num_steps, ctx.scale, _KERNELS[ctx.kernel]
        q5, k5, v5 = _blocks(query, m), _blocks(key, m), _blocks(value, m)
        b, n, _, h, d = q5.shape
        ct = lse.dtype
        do5 = grad_out.reshape(b, n, m, h, d)
        q_heads, do_heads, o_heads = _step_heads(q5), _step_heads(do5), _step_heads(out)
        lse_heads = _lse_step_heads(lse)
        wants_dgate = out_c is not None and ctx.needs_input_grad[3]
        # (the rows' sums of output times its gradient; the Triton kernel makes its own)
        delta = (do5.to(ct) * out.to(ct)).sum(-1) if ctx.own_block != "triton" or wants_dgate else None
        dk = torch.zeros(k5.shape, dtype=ct, device=query.device)
        dv = torch.zeros(v5.shape, dtype=ct, device=query.device)
        dq_a, dk_a, dv_a = kernel.backward(do_heads, q_heads, _keys(k5, 0), _keys(v5, 0), o_heads,
                                           lse_heads, scale)
        dq = _per_step(dq_a, m).to(ct)  # [B, L, H, M, dim]
        dk[:, :, 0] += dk_a.transpose(1, 2)
        dv[:, :, 0] += dv_a.transpose(1, 2)
        if ctx.own_block == "triton":  # part B: the own block's pauses
            from .triton_own_block import own_block_backward_

            own_block_backward_(q5, k5, v5, do5, out, lse, dq, dk, dv, scale)
        else:
            _own_block_grads_(q5, k5, v5, do5, lse, delta, dq, dk, dv, scale, ct)
        dgate = torch.zeros_like(gate) if gate is not None and ctx.needs_input_grad[3] else None
        if out_c is not None:
            gate_heads = gate.to(ct).repeat_interleave(m).view(1, -1, 1)
            lse_shifted = (lse_heads - gate_heads)[:, :, 1:].contiguous()
            for j in range(1, m):
                dq_c, dk_c, dv_c = kernel.backward(
                    do_heads[:, :, 1:], q_heads[:, :, 1:], _keys(k5, j, slice(0, n - 1)),
                    _keys(v5, j, slice(0, n - 1)), o_heads[:, :, 1:], lse_shifted, scale)
                dq[:, 1:] += _per_step(dq_c, m)
                dk[:, :n - 1, j] += dk_c.transpose(1, 2)
                dv[:, :n - 1, j] += dv_c.transpose(1, 2)
            if wants_dgate:  # C's share of the attention times how far its output pulls
                share = (lse_c + gate.to(ct).view(h, 1) - lse).exp()  # [B, L, H, M]
                pull = (_per_step(do_heads, m).to(ct) * out_c.to(ct)).sum(-1) - delta.transpose(2, 3)
                dgate = (share * pull).sum((0, 1, 3)).to(gate.dtype)
        dq = dq.permute(0, 1, 3, 2, 4)

        def back(g, like):
            return g.reshape(b, n * m, g.shape[3], d).transpose(1, 2).to(like.dtype)
        return back(dq, query), back(dk, key), back(dv, value), dgate, None, None, None, None


def split_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, num_steps: int, *,
                    scale: float | None = None, gate: torch.Tensor | None = None,
                    kernel: str = "auto", own_block: str = "torch") -> torch.Tensor:
    """Attention of a Recipe 1 layout under private pauses (``gate`` None) or gated pauses
    (``gate [heads]``, added to the logits of earlier tokens' pauses).

    Args:
        query: ``[B, heads, T, dim]`` with ``T = L * num_steps`` in the interleaved order.
        key, value: ``[B, kv_heads, T, dim]`` (``heads`` a multiple of ``kv_heads``).
        num_steps: ``M``, the steps of each block.
        scale: the logits' scale (default ``dim ** -0.5``).
        kernel: the causal calls' kernel (:func:`kernel_for`).
        own_block: how the own block's pauses and the merge run: ``"torch"`` (tensor ops) or
            ``"triton"`` (one kernel per pass, :mod:`cyb.kernels.triton_own_block`; CUDA, or
            the CPU under ``TRITON_INTERPRET=1``; not float64).  Its speed on a GPU is not
            measured yet.

    Returns:
        ``[B, T, heads, dim]`` in the query's dtype.  Rows must keep their padding last.
    """
    b, h, t, d = query.shape
    if t % num_steps:
        raise ValueError(f"the layout's length {t} is not a multiple of M = {num_steps}")
    if h % key.shape[1]:
        raise ValueError(f"{h} query heads cannot share {key.shape[1]} key heads")
    if gate is not None and gate.shape != (h,):
        raise ValueError(f"the gate must have one value per query head ({h}), got {tuple(gate.shape)}")
    if own_block not in ("torch", "triton"):
        raise ValueError(f"own_block must be torch or triton, got {own_block!r}")
    if own_block == "triton":
        from .chunk_ops import resolve_backend

        resolve_backend("triton", query.device, query.dtype)  # (raises where it cannot run)
    scale = d ** -0.5 if scale is None else float(scale)
    return _SplitAttention.apply(query, key, value, gate, int(num_steps), scale, kernel_for(query, kernel),
                                 own_block)


__all__ = ["FlashKernel", "MathKernel", "kernel_for", "split_attention"]

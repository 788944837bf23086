"""Fused linear readout: per-step log-probabilities and losses straight from hidden states.

The logits ``z = softcap(hidden @ weight.T + bias)`` (``softcap(x) = c tanh(x / c)`` when a cap
``c`` is given) are computed one chunk of rows at a time and never held whole.  Per row they give
the readout of :mod:`cyb.readout`: ``log_t``, ``log_d``, ``log_not_d`` with a dk id and dk bias
``b``, or plain log-softmax at the target without one.

* :func:`fused_readout` returns the three per-row quantities; its backward recomputes each
  chunk's logits (general purpose: any upstream gradient).
* :func:`fused_linear_loss` is the training path: chunks are whole blocks of ``M`` rows, the
  per-block loss and its gradient are evaluated inside the forward pass, each chunk's logits are
  turned in place into ``d loss / d logits`` and the gradients of hidden, weight and bias are
  accumulated at once (three matmuls per chunk, no recompute).  Backward only scales them.

The per-chunk elementwise work (softcap, log-sum-exp without dk, the logits gradient) runs on a
backend: ``"torch"`` (plain tensor ops, any device) or ``"triton"`` (two kernels, see
:mod:`cyb.kernels.triton_readout`); the matmuls always go through ``torch.matmul``.  What is done
to one chunk is :mod:`cyb.kernels.chunk_ops`; this module runs the chunks (autograd functions,
the side stream, the checks of the inputs) and is the public API.

Memory: besides the gradients themselves, about two chunks of logits (on CUDA the next chunk's
logits are computed while the current chunk's loss runs on a side stream) and, for
:func:`fused_linear_loss`, a float32 ``[V, H]`` weight-gradient accumulator.  Host work per
chunk (the loss and its tiny backward) is fixed, so chunks are large by default.

No host synchronisation: on CUDA the checks of the target values (range, dk, equal within a
block) are computed on the device while the chunks are queued, and read once the whole
forward is queued, so the host issues the loss while the GPU still runs the decoder before it
(targets that fail a check are treated as ignored by the kernels, then the error is raised).
Under autocast, :func:`fused_linear_loss` runs all three matmuls in the autocast dtype.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F

from ..layout import IGNORE_INDEX
from .chunk_ops import OPS, chunk_grads, compute_dtype, empty_rows, resolve_backend, zeros_acc

# Default chunk sizes, in logits per chunk.  The torch backend holds about 16 bytes per logit of
# a chunk (a float32 copy, a log-sum-exp temporary, the gradient and its cast); the triton one
# holds only the matmul output.  Chunks of many rows keep the weight-gradient matmul efficient
# (it re-reads and re-writes the float32 [V, H] accumulator once per chunk) and the per-chunk
# host work small next to the device work.
TORCH_CHUNK_ELEMENTS = {"cpu": 1 << 24, "cuda": 1 << 26}
TRITON_CHUNK_ELEMENTS = 1 << 28
# fused_linear_loss pays a fixed host time per chunk (the loss call and its tiny backward, about
# 2-3 ms with cyb_loss on CUDA): with triton it grows chunks up to this many logits to keep
# to at most LOSS_MAX_CHUNKS chunks.
TRITON_LOSS_MAX_CHUNK_ELEMENTS = 1 << 29
LOSS_MAX_CHUNKS = 16

LossFn = Callable[..., torch.Tensor]


class FusedLossStats(NamedTuple):
    """Detached by-products of :func:`fused_linear_loss` (for logging: perplexity, ``E[S]``).

    Attributes:
        log_t, log_d, log_not_d: ``[N]`` per-row readout (float32; float64 for float64 input).
        block_loss: ``[N / M]`` per-block loss, 0 for ignored blocks.
        block_valid: ``[N / M]`` bool, False where the block's target is ignored.
    """

    log_t: torch.Tensor
    log_d: torch.Tensor
    log_not_d: torch.Tensor
    block_loss: torch.Tensor
    block_valid: torch.Tensor


# ----------------------------------------------------------------------- autograd functions


class _FusedReadout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, dk_id, dk_bias, softcap, backend, chunk_rows):
        ops = OPS[backend]
        n = hidden.shape[0]
        out = torch.empty(4, n, dtype=compute_dtype(hidden.dtype), device=hidden.device)
        for s in range(0, n, chunk_rows):
            sl = slice(s, s + chunk_rows)
            u = F.linear(hidden[sl], weight, bias)
            ops.stats(u, targets[sl], dk_id, dk_bias, softcap, tuple(out[:, sl]))
            del u
        ctx.save_for_backward(hidden, weight, bias, targets, out)
        ctx.args = (dk_id, softcap, backend, chunk_rows)
        return out[0], out[1], out[2]

    @staticmethod
    def backward(ctx, g_t, g_d, g_nd):
        hidden, weight, bias, targets, out = ctx.saved_tensors
        dk_id, softcap, backend, chunk_rows = ctx.args
        ops = OPS[backend]
        n = hidden.shape[0]
        g_t, g_d, g_nd = (torch.zeros_like(out[0]) if g is None else g.to(out.dtype)
                          for g in (g_t, g_d, g_nd))
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = empty_rows(hidden, need_h)
        grad_w = zeros_acc(weight, need_w)
        grad_b = zeros_acc(bias, need_b and bias is not None)
        for s in range(0, n, chunk_rows):
            sl = slice(s, s + chunk_rows)
            hc = hidden[sl]
            work = ops.prepare(F.linear(hc, weight, bias), softcap)
            g = ops.grad(work, targets[sl], out[3, sl], out[1, sl], out[2, sl], g_t[sl], g_d[sl],
                         g_nd[sl], dk_id, softcap, hidden.dtype)
            chunk_grads(g, hc, weight, None if grad_h is None else grad_h[sl], grad_w, grad_b)
            del work, g
        grad_w = None if grad_w is None else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


def _block_loss_grads(loss_fn, lt, ld, lnd, m, block_valid, has_dk, need_grad, extra):
    """Per-block loss of one chunk and its gradient w.r.t. the three per-row quantities."""
    nb = lt.shape[0] // m
    with torch.enable_grad():
        inputs = [lt.detach().requires_grad_(need_grad)]
        # without dk, log_d = -inf and log_not_d = 0 are constants of the logits
        inputs += [x.detach().requires_grad_(need_grad and has_dk) for x in (ld, lnd)]
        loss = loss_fn(*(x.view(nb, m) for x in inputs), *extra)
        if not isinstance(loss, torch.Tensor) or loss.shape != (nb,):
            got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise ValueError(
                f"loss_fn must return the per-block loss of shape [n_blocks] = [{nb}], got {got}"
            )
        loss = torch.where(block_valid, loss, 0.0)
        grads = [None, None, None]
        if need_grad and loss.requires_grad:
            wanted = [x for x in inputs if x.requires_grad]
            found = iter(torch.autograd.grad(loss.sum(), wanted, allow_unused=True))
            grads = [next(found) if x.requires_grad else None for x in inputs]
    g_t, g_d, g_nd = (torch.zeros_like(lt) if g is None else g.to(lt.dtype) for g in grads)
    if has_dk:  # ignored blocks get exactly zero even where a loss_fn is not finite on them
        keep = block_valid.unsqueeze(1)  # (g_t is masked by the ignored targets later)
        g_d, g_nd = (torch.where(keep, g.view(nb, m), 0.0).view(-1) for g in (g_d, g_nd))
    return loss.detach(), (g_t, g_d, g_nd)


class _SideStream:
    """Runs each chunk's loss on a second CUDA stream, one chunk behind the logits.

    Loss functions may synchronise with the host (``bool(tensor)`` in argument checks, a copy
    from host memory).  On one stream such a sync drains the queue and the GPU idles while the
    host issues the next chunk; on a side stream it waits only for that chunk's statistics while
    the next chunk's matmul, queued before, keeps the GPU busy.  On CPU it does nothing and chunks
    run one after another.
    """

    def __init__(self, device: torch.device):
        cuda = device.type == "cuda"
        self.main = torch.cuda.current_stream(device) if cuda else None
        self.side = torch.cuda.Stream(device) if cuda else None
        self.lookahead = 1 if cuda else 0

    def mark(self):
        """An event after the work queued so far on the main stream (None on CPU)."""
        if self.side is None:
            return None
        event = torch.cuda.Event()
        event.record(self.main)
        return event

    @contextlib.contextmanager
    def after(self, event):
        """Run the body on the side stream once ``event`` has passed."""
        if self.side is None:
            yield
            return
        self.side.wait_event(event)
        with torch.cuda.stream(self.side):
            yield

    def join(self, *made_on_side):
        """The main stream waits for the side; tensors made there are then used on main."""
        if self.side is None:
            return
        self.main.wait_stream(self.side)
        for t in made_on_side:
            if t is not None:
                t.record_stream(self.main)  # keep the allocator from reusing them too early


class _FusedLinearLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, block_valid, loss_fn, m, dk_id, dk_bias,
                softcap, backend, chunk_rows, block_args, amp_dtype):
        grad_dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        if amp_dtype is not None:
            # Under autocast the logits matmul would run in amp_dtype but the gradient matmuls
            # (out= / in place, which autocast leaves alone) in float32: cast once instead.
            hidden, weight = hidden.to(amp_dtype), weight.to(amp_dtype)
            bias = None if bias is None else bias.to(amp_dtype)
        ops = OPS[backend]
        n = hidden.shape[0]
        cdt = compute_dtype(hidden.dtype)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        need_b = need_b and bias is not None
        need_grad = need_h or need_w or need_b
        rows = torch.empty(4, n, dtype=cdt, device=hidden.device)  # log_t, log_d, log_not_d, norm
        block_loss = torch.zeros(n // m, dtype=cdt, device=hidden.device)
        grad_h = empty_rows(hidden, need_h)
        grad_w = zeros_acc(weight, need_w)
        grad_b = zeros_acc(bias, need_b)
        pipe = _SideStream(hidden.device)

        def logits_part(s):
            """Logits of rows ``s : s + chunk_rows`` and their readout."""
            sl = slice(s, s + chunk_rows)
            u = F.linear(hidden[sl], weight, bias)
            work = ops.stats(u, targets[sl], dk_id, dk_bias, softcap, tuple(rows[:, sl]))
            return dict(start=s, work=work, ready=pipe.mark())

        def loss_part(chunk):
            """The chunk's loss, then ``d loss / d logits`` in place and the gradient matmuls."""
            s = chunk["start"]
            sl, bsl = slice(s, s + chunk_rows), slice(s // m, (s + chunk_rows) // m)
            lt, ld, lnd, norm = rows[:, sl]
            with pipe.after(chunk["ready"]):
                extra = tuple(a[bsl] for a in block_args)
                bl, (g_t, g_d, g_nd) = _block_loss_grads(
                    loss_fn, lt, ld, lnd, m, block_valid[bsl], dk_id is not None, need_grad, extra
                )
            pipe.join(bl, g_t, g_d, g_nd)
            block_loss[bsl] = bl
            if need_grad:
                g = ops.grad(chunk["work"], targets[sl], norm, ld, lnd, g_t, g_d, g_nd, dk_id,
                             softcap, hidden.dtype)
                chunk_grads(g, hidden[sl], weight, None if grad_h is None else grad_h[sl],
                             grad_w, grad_b)

        queue = []
        for s in range(0, n, chunk_rows):
            queue.append(logits_part(s))
            if len(queue) > pipe.lookahead:
                loss_part(queue.pop(0))
        while queue:
            loss_part(queue.pop(0))
        # Gradients are kept as attributes, not saved tensors: they are this function's own
        # results, and backward scales them in place.
        ctx.grads = (  # float32 accumulators go straight to float32 parameters
            None if grad_h is None else grad_h.to(grad_dtypes[0]),
            None if grad_w is None else grad_w.to(grad_dtypes[1]),
            None if grad_b is None else grad_b.to(grad_dtypes[2]),
        )
        stats = (rows[0], rows[1], rows[2], block_loss)
        ctx.mark_non_differentiable(*stats)
        return (block_loss.sum(), *stats)

    @staticmethod
    def backward(ctx, g_loss, *_ignored):
        if ctx.grads is None:
            raise RuntimeError("fused_linear_loss supports a single backward pass per forward")
        grads, ctx.grads = ctx.grads, None
        scaled = [None if g is None else g.mul_(g_loss.to(g.dtype)) for g in grads]
        return (*scaled, None, None, None, None, None, None, None, None, None, None, None)


# ------------------------------------------------------------------------------ public API


def _check_inputs(hidden, weight, targets, bias, dk_id, dk_bias, softcap):
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden [N, H] and weight [V, H] do not line up: {tuple(hidden.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if not hidden.is_floating_point() or hidden.dtype != weight.dtype:
        raise TypeError(
            f"hidden and weight must share one float dtype, got {hidden.dtype} and {weight.dtype}"
        )
    n, v = hidden.shape[0], weight.shape[0]
    if targets.shape != (n,):
        raise ValueError(f"targets must have shape [N] = [{n}], got {tuple(targets.shape)}")
    if targets.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"targets must hold integer ids (int64), got {targets.dtype}")
    if bias is not None and (bias.shape != (v,) or bias.dtype != weight.dtype):
        raise ValueError(
            f"bias must be a [V] = [{v}] tensor of dtype {weight.dtype}, got "
            f"{tuple(bias.shape)} {bias.dtype}"
        )
    if dk_id is not None and (not isinstance(dk_id, int) or not 0 <= dk_id < v):
        raise ValueError(f"dk_id = {dk_id!r} is outside the vocabulary [0, {v})")
    if not math.isfinite(float(dk_bias)):
        raise ValueError(f"dk_bias must be finite, got {dk_bias!r}")
    if softcap is not None and not (math.isfinite(float(softcap)) and float(softcap) > 0):
        raise ValueError(f"softcap must be a finite number > 0 or None, got {softcap!r}")


def _defer_checks(device: torch.device) -> bool:
    """Whether target checks are read after the work is queued (CUDA) instead of before."""
    return device.type == "cuda"


class _TargetCheck:
    """Checks of the target values computed on their device without a host synchronisation.

    ``flags`` holds three booleans: a target (other than -100) outside ``[0, V)``, a target
    equal to ``dk_id``, targets that differ within a block of ``m`` rows.  :attr:`safe` are the
    targets with the out-of-range ones replaced by -100 (so kernels never index outside a row).
    :meth:`raise_if_bad` reads the flags (one synchronisation) and raises the first problem.
    """

    def __init__(self, targets: torch.Tensor, v: int, dk_id: int | None, m: int = 1):
        self.targets, self.v, self.dk_id, self.m = targets, v, dk_id, m
        valid = targets != IGNORE_INDEX
        inside = (targets >= 0) & (targets < v)
        zero = torch.zeros((), dtype=torch.bool, device=targets.device)
        bad_range = (valid & ~inside).any() if targets.numel() else zero
        is_dk = (valid & (targets == dk_id)).any() if dk_id is not None and targets.numel() else zero
        mixed = zero
        if m > 1 and targets.numel():
            blocks = targets.view(-1, m)
            mixed = (blocks != blocks[:, :1]).any()
        self.flags = torch.stack([bad_range, is_dk, mixed])
        self.safe = torch.where(inside | ~valid, targets, IGNORE_INDEX)

    def raise_if_bad(self) -> None:
        bad_range, is_dk, mixed = self.flags.tolist()
        if bad_range:
            real = self.targets[self.targets != IGNORE_INDEX]
            lo, hi = int(real.min()), int(real.max())
            raise ValueError(f"targets hold ids outside the vocabulary [0, {self.v}): [{lo}, {hi}]")
        if is_dk:
            raise ValueError(f"a target equals dk_id = {self.dk_id}; <don't know> is never a target")
        if mixed:
            raise ValueError(f"targets must be equal within each block of num_steps = {self.m} rows")


def _autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast dtype active for ``device``'s type, or None."""
    try:
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
    except (AttributeError, TypeError, RuntimeError):  # older torch: no per-device query
        pass
    return None


def _default_rows(backend: str, vocab_size: int, device: torch.device) -> int:
    if backend == "triton":
        elements = TRITON_CHUNK_ELEMENTS
    else:
        elements = TORCH_CHUNK_ELEMENTS["cuda" if device.type == "cuda" else "cpu"]
    return max(1, elements // max(vocab_size, 1))


def fused_readout(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    dk_id: int | None = None,
    dk_bias: float = 0.0,
    bias: torch.Tensor | None = None,
    softcap: float | None = None,
    backend: str = "auto",
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log_t, log_d, log_not_d)`` of ``logits = softcap(hidden @ weight.T + bias)`` per row.

    Equal to :func:`cyb.readout.readout` on those logits, without ever holding them: forward and
    backward work on ``chunk_rows`` rows at a time (backward recomputes each chunk's logits).

    Args:
        hidden: ``[N, H]`` float (bf16, fp16, fp32 or fp64).
        weight: ``[V, H]`` the output embedding, same dtype as ``hidden``.
        targets: ``[N]`` long ids in ``[0, V)``; ``-100`` marks rows without a target (their
            ``log_t`` is 0 and gets no gradient; ``log_d``/``log_not_d`` are still computed).
        dk_id: the ``<don't know>`` id (never a target), or None for a readout without dk
            (then ``log_d = -inf`` and ``log_not_d = 0``).
        dk_bias: the dk prior offset on the dk logit (:func:`cyb.readout.dk_logit_bias`).
        bias: optional ``[V]`` output bias, same dtype as ``weight``.
        softcap: optional cap ``c > 0``: logits become ``c * tanh(logits / c)``.
        backend: ``"auto"`` (triton on CUDA if available, else torch), ``"torch"`` or ``"triton"``.
        chunk_rows: rows per chunk (default: about 2^28 logits per chunk with triton, 2^26 with
            torch on CUDA, 2^24 on CPU).

    Returns:
        three ``[N]`` tensors, float32 (float64 for float64 input).  Gradients flow to
        ``hidden``, ``weight`` and ``bias``.
    """
    _check_inputs(hidden, weight, targets, bias, dk_id, dk_bias, softcap)
    which = resolve_backend(backend, hidden.device, hidden.dtype)
    if chunk_rows is None:
        rows = _default_rows(which, weight.shape[0], hidden.device)
    else:
        rows = int(chunk_rows)
    if rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows!r}")
    check = _TargetCheck(targets.long().contiguous(), weight.shape[0], dk_id)
    defer = _defer_checks(targets.device)
    if not defer:
        check.raise_if_bad()
    out = _FusedReadout.apply(
        hidden, weight, bias, check.safe, dk_id, float(dk_bias),
        None if softcap is None else float(softcap), which, rows,
    )
    if defer:
        check.raise_if_bad()
    return out


def fused_linear_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    loss_fn: LossFn,
    num_steps: int,
    *,
    dk_id: int | None = None,
    dk_bias: float = 0.0,
    bias: torch.Tensor | None = None,
    softcap: float | None = None,
    backend: str = "auto",
    chunk_blocks: int | None = None,
    block_args: Sequence[torch.Tensor] = (),
) -> tuple[torch.Tensor, FusedLossStats]:
    """Summed per-block loss over ``logits = softcap(hidden @ weight.T + bias)``, fused.

    Rows come in blocks of ``num_steps`` (``M``) consecutive rows, one block per real token (the
    layout of :func:`cyb.layout.expand`, flattened); all rows of a block share one target.  Per
    chunk of whole blocks the logits are computed once, the loss and its gradient evaluated, and
    the gradients of ``hidden``, ``weight`` and ``bias`` accumulated (float32 accumulation);
    backward only scales them by the incoming gradient, so a single backward pass is supported.
    Under autocast, float32 ``hidden``/``weight``/``bias`` are cast once to the autocast dtype
    for the matmuls (the weight and bias gradients are still accumulated in float32).

    Args:
        hidden, weight, targets, dk_id, dk_bias, bias, softcap, backend: as in
            :func:`fused_readout`; ``N`` must be a multiple of ``num_steps``.
        loss_fn: ``loss_fn(log_t, log_d, log_not_d, *block_args) -> [n_blocks]`` per-block loss
            from ``[n_blocks, M]`` inputs, e.g. ``lambda lt, ld, lnd: cyb_loss(lt, ld, lnd,
            omega=..., gamma=...)``.  Blocks whose target is -100 contribute 0.  Gradients flow
            only to its three inputs (tensors it closes over get none).
        num_steps: ``M >= 1``.
        chunk_blocks: blocks per chunk (default as ``chunk_rows`` of :func:`fused_readout`;
            with triton grown to at most 16 chunks while a chunk stays under 2^29 logits).
            Each chunk costs a fixed host time (the loss call), so fewer, larger chunks run
            faster; smaller ones use less memory.
        block_args: optional per-block tensors ``[N / M, ...]`` (e.g. a per-token ``omega``),
            sliced with the chunk and passed to ``loss_fn`` after the three readouts.

    Returns:
        ``(loss_sum, stats)``: a scalar float32 (float64 for float64 input) tensor with a
        gradient, and :class:`FusedLossStats` (detached).
    """
    _check_inputs(hidden, weight, targets, bias, dk_id, dk_bias, softcap)
    m = num_steps
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ValueError(f"num_steps (M) must be an integer >= 1, got {m!r}")
    n = hidden.shape[0]
    if n % m:
        raise ValueError(f"N = {n} rows do not split into blocks of num_steps = {m}")
    nb = n // m
    for i, a in enumerate(block_args):
        if not isinstance(a, torch.Tensor) or a.dim() < 1 or a.shape[0] != nb:
            raise ValueError(f"block_args[{i}] must be a tensor [N / M = {nb}, ...]")
    check = _TargetCheck(targets.long().contiguous(), weight.shape[0], dk_id, m)
    defer = _defer_checks(targets.device)
    if not defer:
        check.raise_if_bad()
    targets = check.safe
    block_valid = targets.view(nb, m)[:, 0] != IGNORE_INDEX
    which = resolve_backend(backend, hidden.device, hidden.dtype)
    if chunk_blocks is None:
        rows = _default_rows(which, weight.shape[0], hidden.device)
        if which == "triton":
            cap = max(rows, TRITON_LOSS_MAX_CHUNK_ELEMENTS // weight.shape[0])
            rows = min(max(rows, -(-n // LOSS_MAX_CHUNKS)), cap)
        cb = max(1, rows // m)
    elif not isinstance(chunk_blocks, int) or chunk_blocks < 1:
        raise ValueError(f"chunk_blocks must be an integer >= 1, got {chunk_blocks!r}")
    else:
        cb = chunk_blocks
    amp = _autocast_dtype(hidden.device)
    if amp is None or amp == hidden.dtype or hidden.dtype != torch.float32:
        amp = None  # autocast casts only float32
    loss, lt, ld, lnd, block_loss = _FusedLinearLoss.apply(
        hidden, weight, bias, targets, block_valid, loss_fn, m, dk_id, float(dk_bias),
        None if softcap is None else float(softcap), which, cb * m, tuple(block_args), amp,
    )
    if defer:
        check.raise_if_bad()
    return loss, FusedLossStats(lt, ld, lnd, block_loss, block_valid)

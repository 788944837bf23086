"""Fused readout (cyb.kernels) against the naive path: logits, cyb.readout.readout_reference, loss.

Values and gradients (hidden, weight, bias) on odd shapes, with and without dk, dk bias, softcap,
bias, ignored rows, tied weights, M = 1 and M = 4, and chunk sizes that do not divide N.  The
triton backend is checked on CPU tensors under ``TRITON_INTERPRET=1`` (skipped without triton).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from cyb.kernels import (
    FusedLossStats,
    fused_linear_loss,
    fused_readout,
    resolve_backend,
    triton_available,
)
from cyb.layout import IGNORE_INDEX
from cyb.losses import cyb_loss, discount, tbys_loss
from cyb.readout import readout_reference

H, V = 5, 13
RTOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 2e-2}

# (dk_id, dk_bias, softcap, with bias, with ignored rows)
CONFIGS = [
    (None, 0.0, None, False, False),
    (None, 0.0, 3.0, True, True),
    (V - 1, 2.0, None, True, True),
    (0, -1.5, 4.0, False, True),
    (6, 0.0, 2.0, True, False),
]
CONFIG_IDS = ["plain", "nodk-cap-bias-ign", "dk-bias-ign", "dk0-cap-ign", "dkmid-cap-bias"]


# ------------------------------------------------------------------------------- helpers


def make_inputs(n_blocks, m, dtype, *, dk_id, with_bias, ignored, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    n = n_blocks * m
    hidden = (torch.randn(n, H, generator=g, dtype=torch.float64) * scale).to(dtype)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype)
    bias = torch.randn(V, generator=g, dtype=torch.float64).to(dtype) if with_bias else None
    choices = torch.tensor([i for i in range(V) if i != dk_id])
    block_t = choices[torch.randint(len(choices), (n_blocks,), generator=g)]
    if ignored:
        block_t[1::3] = IGNORE_INDEX
    targets = block_t.repeat_interleave(m)
    leaves = [t.requires_grad_() for t in (hidden, weight, bias) if t is not None]
    return hidden, weight, bias, targets, leaves


def naive(hidden, weight, targets, *, bias=None, softcap=None, dk_id=None, dk_bias=0.0):
    logits = F.linear(hidden, weight, bias)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return readout_reference(logits, targets, dk_id=dk_id, dk_bias=dk_bias)


def assert_close(got, want, rtol, what=""):
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape, what
    inf = torch.isinf(want)
    assert torch.equal(torch.isinf(got), inf), f"{what}: infinities differ"
    assert torch.isfinite(got[~inf]).all(), f"{what}: non-finite values"
    err = (got - want)[~inf].abs().max().item() if (~inf).any() else 0.0
    scale = max(1.0, want[~inf].abs().max().item() if (~inf).any() else 0.0)
    assert err <= rtol * scale, f"{what}: max error {err:.3g} > {rtol:g} x {scale:.3g}"


def grads(out, leaves):
    return torch.autograd.grad(out, leaves, allow_unused=True)


def cyb_fn(m):
    omega = [0.1] * (m - 1) + [1.0] if m > 1 else [1.0]
    gamma = discount(0.9, m)
    return lambda lt, ld, lnd: cyb_loss(lt, ld, lnd, omega=omega, gamma=gamma)


def reference_loss(loss_fn, m, rows, targets):
    lt, ld, lnd = (x.reshape(-1, m) for x in rows)
    valid = targets.view(-1, m)[:, 0] != IGNORE_INDEX
    per_block = loss_fn(lt, ld, lnd)
    return torch.where(valid, per_block, torch.zeros_like(per_block)).sum(), per_block


def check_readout(dtype, config, backend, chunk_rows, n=7):
    dk_id, dk_bias, cap, with_bias, ignored = config
    hidden, weight, bias, targets, leaves = make_inputs(
        n, 1, dtype, dk_id=dk_id, with_bias=with_bias, ignored=ignored
    )
    kw = dict(bias=bias, softcap=cap, dk_id=dk_id, dk_bias=dk_bias)
    got = fused_readout(hidden, weight, targets, backend=backend, chunk_rows=chunk_rows, **kw)
    want = naive(hidden, weight, targets, **kw)
    rtol = RTOL[dtype]
    for name, a, b in zip(("log_t", "log_d", "log_not_d"), got, want):
        assert a.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        assert_close(a, b, rtol, name)
    if ignored:
        assert (got[0][targets == IGNORE_INDEX] == 0).all()
    up = torch.randn(3, n, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def weigh(lt, ld, lnd):
        total = (up[0] * lt).sum() + (up[2] * lnd).sum()
        return total + (up[1] * ld).sum() if dk_id is not None else total

    for name, a, b in zip(("hidden", "weight", "bias"), grads(weigh(*got), leaves),
                          grads(weigh(*want), leaves)):
        assert a.dtype == b.dtype
        assert_close(a, b, rtol, f"grad {name}")


def check_loss(dtype, config, backend, m, chunk_blocks, n_blocks=7, scale=2.5):
    dk_id, dk_bias, cap, with_bias, ignored = config
    hidden, weight, bias, targets, leaves = make_inputs(
        n_blocks, m, dtype, dk_id=dk_id, with_bias=with_bias, ignored=ignored
    )
    loss_fn = cyb_fn(m) if dk_id is not None else (lambda lt, ld, lnd: tbys_loss(lt))
    kw = dict(bias=bias, softcap=cap, dk_id=dk_id, dk_bias=dk_bias)
    loss, stats = fused_linear_loss(
        hidden, weight, targets, loss_fn, m, backend=backend, chunk_blocks=chunk_blocks, **kw
    )
    rows = naive(hidden, weight, targets, **kw)
    want, per_block = reference_loss(loss_fn, m, rows, targets)
    rtol = RTOL[dtype]
    assert loss.dim() == 0
    assert_close(loss, want, rtol, "loss")
    assert isinstance(stats, FusedLossStats)
    for name, a, b in zip(("log_t", "log_d", "log_not_d"), stats[:3], rows):
        assert not a.requires_grad
        assert_close(a, b, rtol, f"stats.{name}")
    valid = targets.view(-1, m)[:, 0] != IGNORE_INDEX
    assert torch.equal(stats.block_valid, valid)
    assert_close(stats.block_loss, torch.where(valid, per_block, 0.0), rtol, "block_loss")
    for name, a, b in zip(("hidden", "weight", "bias"), grads(loss * scale, leaves),
                          grads(want * scale, leaves)):
        assert a.dtype == b.dtype
        assert_close(a, b, rtol, f"grad {name}")


# --------------------------------------------------------------------------- torch backend


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("chunk_rows", [3, None])
def test_readout_matches_naive(dtype, config, chunk_rows):
    check_readout(dtype, config, "torch", chunk_rows)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("m,chunk_blocks", [(1, 3), (4, 3), (4, None), (4, 1)])
def test_loss_matches_naive(dtype, config, m, chunk_blocks):
    check_loss(dtype, config, "torch", m, chunk_blocks)


@pytest.mark.parametrize("config", [CONFIGS[0], CONFIGS[3], CONFIGS[4]],
                         ids=["plain", "dk0-cap", "dkmid-cap-bias"])
def test_bf16_matches_naive(config):
    check_readout(torch.bfloat16, config, "torch", 3, n=9)
    check_loss(torch.bfloat16, config, "torch", 4, 2)


def test_tied_weights_accumulate():
    """The output embedding also embeds the inputs: both uses add into one gradient."""
    g = torch.Generator().manual_seed(3)
    emb = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    proj = torch.randn(H, H, generator=g, dtype=torch.float64, requires_grad=True)
    m, nb = 4, 5
    ids = torch.randint(0, V - 1, (nb * m,), generator=g)
    targets = torch.randint(0, V - 1, (nb,), generator=g).repeat_interleave(m)
    loss_fn = cyb_fn(m)

    def run(fused):
        hidden = torch.tanh(emb[ids] @ proj)
        if fused:
            loss, _ = fused_linear_loss(hidden, emb, targets, loss_fn, m, dk_id=V - 1, dk_bias=1.0,
                                        backend="torch", chunk_blocks=2)
            rows = fused_readout(hidden, emb, targets, dk_id=V - 1, dk_bias=1.0, backend="torch",
                                 chunk_rows=3)
            loss = loss + reference_loss(loss_fn, m, rows, targets)[0]
        else:
            rows = naive(hidden, emb, targets, dk_id=V - 1, dk_bias=1.0)
            loss = 2 * reference_loss(loss_fn, m, rows, targets)[0]
        return grads(loss, [emb, proj])

    for a, b in zip(run(True), run(False)):
        assert_close(a, b, 1e-10, "tied grad")


def test_no_vocab_sized_tensor_is_saved():
    n, v = 16, 64
    hidden = torch.randn(n, H, requires_grad=True)
    weight = torch.randn(v, H, requires_grad=True)
    targets = torch.randint(0, v - 1, (n // 4,)).repeat_interleave(4)
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        rows = fused_readout(hidden, weight, targets, dk_id=v - 1, backend="torch", chunk_rows=4)
        loss, _ = fused_linear_loss(hidden, weight, targets, cyb_fn(4), 4, dk_id=v - 1,
                                    backend="torch", chunk_blocks=1)
    assert sizes and max(sizes) < n * v
    (sum(r.sum() for r in rows) + loss).backward()
    assert torch.isfinite(hidden.grad).all() and torch.isfinite(weight.grad).all()


def test_no_grad_and_frozen_inputs():
    hidden, weight, bias, targets, _ = make_inputs(6, 4, torch.float32, dk_id=V - 1, with_bias=True,
                                                   ignored=True)
    args = (hidden, weight, targets, cyb_fn(4), 4)
    kw = dict(dk_id=V - 1, bias=bias, backend="torch", chunk_blocks=4)
    loss, stats = fused_linear_loss(*args, **kw)
    with torch.no_grad():
        loss2, stats2 = fused_linear_loss(*args, **kw)
    assert not loss2.requires_grad
    assert torch.equal(loss.detach(), loss2) and torch.equal(stats.log_d, stats2.log_d)
    # only the weight trains: hidden and bias get no gradient, weight's matches
    w2 = weight.detach().requires_grad_()
    loss3, _ = fused_linear_loss(hidden.detach(), w2, targets, cyb_fn(4), 4, dk_id=V - 1,
                                 bias=bias.detach(), backend="torch", chunk_blocks=4)
    (gw,) = torch.autograd.grad(loss3, [w2])
    (gw_ref,) = torch.autograd.grad(loss, [weight])
    assert_close(gw, gw_ref, 1e-6, "weight grad alone")


def test_single_backward_only():
    hidden, weight, _, targets, _ = make_inputs(3, 2, torch.float32, dk_id=None, with_bias=False,
                                                ignored=False)
    loss, _ = fused_linear_loss(hidden, weight, targets, lambda lt, ld, lnd: tbys_loss(lt), 2,
                                backend="torch")
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="single backward"):
        loss.backward()


def test_all_ignored_gives_zero():
    hidden, weight, _, targets, leaves = make_inputs(3, 4, torch.float32, dk_id=V - 1,
                                                     with_bias=False, ignored=False)
    targets = torch.full_like(targets, IGNORE_INDEX)
    loss, stats = fused_linear_loss(hidden, weight, targets, cyb_fn(4), 4, dk_id=V - 1,
                                    backend="torch")
    assert loss.item() == 0.0 and not stats.block_valid.any()
    assert (stats.log_t == 0).all() and torch.isfinite(stats.log_d).all()
    for gr in grads(loss, leaves):
        assert (gr == 0).all()


def test_block_args_per_token_omega():
    """Recipe 2 style: a per-block one-hot omega passed through ``block_args``."""
    m, nb = 4, 7
    hidden, weight, _, targets, leaves = make_inputs(nb, m, torch.float64, dk_id=V - 1,
                                                     with_bias=False, ignored=True)
    world = torch.randint(0, m, (nb,), generator=torch.Generator().manual_seed(5))
    omega = F.one_hot(world, m).double()

    def loss_fn(lt, ld, lnd, om):
        return cyb_loss(lt, ld, lnd, omega=om)

    loss, _ = fused_linear_loss(hidden, weight, targets, loss_fn, m, dk_id=V - 1,
                                backend="torch", chunk_blocks=3, block_args=(omega,))
    rows = naive(hidden, weight, targets, dk_id=V - 1)
    lt, ld, lnd = (x.view(nb, m) for x in rows)
    valid = targets.view(nb, m)[:, 0] != IGNORE_INDEX
    want = torch.where(valid, loss_fn(lt, ld, lnd, omega), 0.0).sum()
    assert_close(loss, want, 1e-10, "loss")
    for a, b in zip(grads(loss, leaves), grads(want, leaves)):
        assert_close(a, b, 1e-10, "grad")


def test_bf16_large_logits_stay_finite():
    hidden, weight, bias, targets, leaves = make_inputs(8, 4, torch.bfloat16, dk_id=V - 1,
                                                        with_bias=True, ignored=True, scale=60.0)
    loss, stats = fused_linear_loss(hidden, weight, targets, cyb_fn(4), 4, dk_id=V - 1,
                                    dk_bias=5.0, bias=bias, backend="torch", chunk_blocks=3)
    assert torch.isfinite(loss) and torch.isfinite(stats.log_t).all()
    for gr in grads(loss, leaves):
        assert torch.isfinite(gr.float()).all()


# ------------------------------------------------------------------------- argument checks


def test_bad_arguments_raise():
    hidden, weight, _, targets, _ = make_inputs(3, 2, torch.float32, dk_id=V - 1,
                                                with_bias=False, ignored=False)
    fn = cyb_fn(2)
    with pytest.raises(ValueError, match="dk_id"):
        fused_readout(hidden, weight, targets, dk_id=V)
    with pytest.raises(ValueError, match="dk_id"):
        fused_readout(hidden, weight, targets.masked_fill(targets == targets[0], V - 1),
                      dk_id=V - 1)
    with pytest.raises(ValueError, match="vocabulary"):
        fused_readout(hidden, weight, targets.masked_fill(targets == targets[0], V))
    with pytest.raises(ValueError, match="line up"):
        fused_readout(hidden[:, :2], weight, targets)
    with pytest.raises(TypeError, match="dtype"):
        fused_readout(hidden.double(), weight, targets)
    with pytest.raises(ValueError, match="softcap"):
        fused_readout(hidden, weight, targets, softcap=0.0)
    with pytest.raises(ValueError, match="bias"):
        fused_readout(hidden, weight, targets, bias=torch.zeros(V + 1))
    with pytest.raises(ValueError, match="backend"):
        fused_readout(hidden, weight, targets, backend="cuda")
    with pytest.raises(ValueError, match="chunk_rows"):
        fused_readout(hidden, weight, targets, chunk_rows=0)
    with pytest.raises(ValueError, match="num_steps"):
        fused_linear_loss(hidden, weight, targets, fn, 4)
    with pytest.raises(ValueError, match="num_steps"):
        fused_linear_loss(hidden, weight, targets, fn, 0)
    with pytest.raises(ValueError, match="equal within each block"):
        fused_linear_loss(hidden, weight, targets.roll(1), fn, 2, dk_id=V - 1)
    with pytest.raises(ValueError, match="chunk_blocks"):
        fused_linear_loss(hidden, weight, targets, fn, 2, dk_id=V - 1, chunk_blocks=0)
    with pytest.raises(ValueError, match="per-block loss"):
        fused_linear_loss(hidden, weight, targets, lambda lt, ld, lnd: lt, 2, dk_id=V - 1)
    with pytest.raises(ValueError, match="block_args"):
        fused_linear_loss(hidden, weight, targets, fn, 2, dk_id=V - 1, block_args=(torch.ones(2),))


def test_resolve_backend():
    cpu = torch.device("cpu")
    assert resolve_backend("auto", cpu, torch.float32) == "torch"
    assert resolve_backend("torch", cpu, torch.bfloat16) == "torch"
    with pytest.raises(ValueError, match="backend"):
        resolve_backend("numpy", cpu, torch.float32)
    if triton_available():
        with pytest.raises(TypeError, match="float64"):
            resolve_backend("triton", cpu, torch.float64)


# -------------------------------------------------------------- triton under the interpreter


@pytest.fixture
def triton_cpu(monkeypatch):
    """The triton backend on CPU tensors; tiny tiles so V = 13 spans several tiles."""
    if not triton_available():
        pytest.skip("triton is not installed")
    # TRITON_INTERPRET counts only if set before triton (and its own library) is first imported;
    # resolve_backend also reads it for CPU tensors
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import triton.language as tl

    from cyb.kernels import triton_readout

    if type(tl.max).__name__ != "InterpretedFunction":
        pytest.skip("triton was imported without TRITON_INTERPRET=1 earlier in this process")
    monkeypatch.setattr(triton_readout, "BLOCK_V", 4)
    return triton_readout


@pytest.mark.parametrize("config", [CONFIGS[1], CONFIGS[3], CONFIGS[4]],
                         ids=["nodk-cap-bias-ign", "dk0-cap-ign", "dkmid-cap-bias"])
def test_triton_readout_interpreted(triton_cpu, config):
    check_readout(torch.float32, config, "triton", 3)


@pytest.mark.parametrize("config,m", [(CONFIGS[0], 1), (CONFIGS[2], 4), (CONFIGS[4], 4)],
                         ids=["plain-m1", "dk-bias-ign-m4", "dkmid-cap-bias-m4"])
def test_triton_loss_interpreted(triton_cpu, config, m):
    check_loss(torch.float32, config, "triton", m, 3, n_blocks=5)


def test_triton_bf16_interpreted(triton_cpu):
    check_loss(torch.bfloat16, CONFIGS[4], "triton", 2, 2, n_blocks=5)


def test_triton_kernels_direct(triton_cpu):
    """The two kernels against plain torch on rows with large values and odd widths."""
    g = torch.Generator().manual_seed(7)
    cases = [(13, 12, None), (13, 0, 3.0), (2, None, None), (17, None, 5.0), (5, 3, None)]
    for v, dk_id, cap in cases:
        n = 6
        u = torch.randn(n, v, generator=g) * 20
        z = u if cap is None else cap * torch.tanh(u / cap)
        choices = torch.tensor([j for j in range(v) if j != dk_id])
        tgt = choices[torch.randint(len(choices), (n,), generator=g)]
        tgt[2] = IGNORE_INDEX
        out = tuple(torch.empty(4, n))
        triton_cpu.row_stats(u, tgt, dk_id, 1.5, cap, out)
        want = readout_reference(z, tgt, dk_id=dk_id, dk_bias=1.5)
        for name, a, b in zip(("log_t", "log_d", "log_not_d"), out, want):
            assert_close(a, b, 1e-5, name)
        keep = torch.ones(v, dtype=torch.bool)
        if dk_id is not None:
            keep[dk_id] = False
        norm = torch.logsumexp(z[:, keep], 1)
        assert_close(out[3], norm, 1e-6, "norm")
        # gradient of sum(a * log_t + b * log_d + c * log_not_d) w.r.t. u, by autograd
        up = torch.randn(3, n, generator=g)
        u_ref = u.clone().requires_grad_()
        z_ref = u_ref if cap is None else cap * torch.tanh(u_ref / cap)
        lt, ld, lnd = readout_reference(z_ref, tgt, dk_id=dk_id, dk_bias=1.5)
        total = (up[0] * lt).sum()
        if dk_id is not None:
            total = total + (up[1] * ld).sum() + (up[2] * lnd).sum()
        (ref,) = torch.autograd.grad(total, [u_ref])
        got = triton_cpu.logits_grad_(u.clone(), tgt, out[3], out[1], out[2], up[0], up[1], up[2],
                                      dk_id, cap)
        assert_close(got, ref, 1e-5, "logits grad")


# ------------------------------------------------------------------------------ on a GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_cuda_matches_reference(backend):
    if backend == "triton" and not triton_available():
        pytest.skip("triton is not installed")
    if os.environ.get("TRITON_INTERPRET"):
        pytest.skip("TRITON_INTERPRET is set")
    g = torch.Generator().manual_seed(0)
    n, h, v, m, dk = 512, 64, 5000, 4, 4999
    hidden = torch.randn(n, h, generator=g).cuda().requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 0.3).cuda().requires_grad_()
    bias = torch.randn(v, generator=g).cuda().requires_grad_()
    targets = torch.randint(0, v - 1, (n // m,), generator=g).repeat_interleave(m).cuda()
    targets[:m] = IGNORE_INDEX
    kw = dict(dk_id=dk, dk_bias=1.0, bias=bias, softcap=30.0)
    loss_fn = cyb_fn(m)
    loss, _ = fused_linear_loss(hidden, weight, targets, loss_fn, m, backend=backend,
                                chunk_blocks=37, **kw)
    want, _ = reference_loss(loss_fn, m, naive(hidden, weight, targets, **kw), targets)
    assert_close(loss, want, 1e-5, "loss")
    for a, b in zip(grads(loss, [hidden, weight, bias]), grads(want, [hidden, weight, bias])):
        assert_close(a, b, 1e-4, "grad")
    rows = fused_readout(hidden, weight, targets, backend=backend, chunk_rows=100, **kw)
    for a, b in zip(rows, naive(hidden, weight, targets, **kw)):
        assert_close(a, b, 1e-5, "readout")

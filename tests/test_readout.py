"""cyb.readout: (log_t, log_d, log_not_d) from logits, against an explicit float64 softmax."""

from __future__ import annotations

import math

import pytest
import torch

import reference as ref
from cyb import readout as readout_mod
from cyb.readout import dk_logit_bias, readout, readout_reference

IGNORE = -100


def make_case(shape, v, dk_id, dtype=torch.float64, seed=0, scale=3.0, ignore_every=3):
    """Random logits ``[*shape, V]`` and targets ``[*shape]`` (never dk; some ignored)."""
    g = torch.Generator().manual_seed(seed)
    logits = (scale * torch.randn(*shape, v, generator=g, dtype=torch.float64)).to(dtype)
    choices = [j for j in range(v) if j != dk_id]
    idx = torch.randint(0, len(choices), shape, generator=g)
    targets = torch.tensor(choices)[idx]
    flat = targets.view(-1)
    flat[1::ignore_every] = IGNORE
    return logits, targets


def explicit(logits, targets, dk_id, prior=None):
    """Row-by-row explicit softmax readout (tests/reference.py), float64, shape ``[...]``."""
    v = logits.shape[-1]
    rows = logits.double().reshape(-1, v).tolist()
    tg = targets.reshape(-1).tolist()
    out = []
    for z, y in zip(rows, tg):
        lt, ld, lnd = ref.readout_explicit(z, 0 if y == IGNORE else y, dk_id, prior)
        out.append((0.0 if y == IGNORE else lt, ld, lnd))
    res = torch.tensor(out, dtype=torch.float64).reshape(*targets.shape, 3)
    return res[..., 0], res[..., 1], res[..., 2]


def bias_vector(v, dk_id, b):
    """``b`` on the dk logit alone, as a log prior ratio for ``ref.readout_explicit``."""
    return [b if j == dk_id else 0.0 for j in range(v)]


def assert_triples_close(got, want, **kw):
    for name, g, w in zip(("log_t", "log_d", "log_not_d"), got, want):
        torch.testing.assert_close(g.double(), w.double(), msg=name, **kw)


SHAPES = [(), (7,), (2, 3)]


# ------------------------------------------------------------------------------- values


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("v, dk_id", [(2, 1), (5, 0), (33, 17), (33, 32)])
@pytest.mark.parametrize("bias", [0.0, 2.3, "prior"])
def test_values_match_explicit_softmax_float64(shape, v, dk_id, bias):
    b = dk_logit_bias(v, 0.9) if bias == "prior" else bias
    logits, targets = make_case(shape, v, dk_id)
    want = explicit(logits, targets, dk_id, bias_vector(v, dk_id, b))
    for fn in (readout, readout_reference):
        got = fn(logits, targets, dk_id=dk_id, dk_bias=b)
        assert all(x.dtype == torch.float64 and x.shape == targets.shape for x in got)
        assert_triples_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_values_lower_precision_inputs(dtype):
    v, dk_id = 50, 3
    logits, targets = make_case((4, 6), v, dk_id, dtype=dtype)
    b = dk_logit_bias(v, 0.9)
    want = explicit(logits, targets, dk_id, bias_vector(v, dk_id, b))  # from the same rounded logits
    for fn in (readout, readout_reference):
        got = fn(logits, targets, dk_id=dk_id, dk_bias=b)
        assert all(x.dtype == torch.float32 for x in got)
        assert_triples_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("v, dk_id", [(5, 0), (40, 21)])
@pytest.mark.parametrize("psi_dk", [0.5, 0.9, 0.99])
def test_dk_bias_equals_the_papers_log_prior_ratio_on_all_logits(v, dk_id, psi_dk):
    logits, targets = make_case((3, 4), v, dk_id)
    # Paper appendix: add log(psi'/psi) to the whole logit vector, psi uniform.
    want = explicit(logits, targets, dk_id, ref.dk_log_prior_ratio(v, dk_id, psi_dk))
    got = readout(logits, targets, dk_id=dk_id, dk_bias=dk_logit_bias(v, psi_dk))
    assert_triples_close(got, want, rtol=1e-12, atol=1e-12)


def test_dk_prior_on_uniform_logits_gives_psi_dk():
    v, dk_id = 11, 4
    logits = torch.zeros(2, v, dtype=torch.float64)
    _, log_d, _ = readout(logits, torch.tensor([0, 1]), dk_id=dk_id, dk_bias=dk_logit_bias(v, 0.9))
    torch.testing.assert_close(log_d.exp(), torch.full((2,), 0.9, dtype=torch.float64))


def test_dk_logit_bias_special_values():
    assert dk_logit_bias(100, None) == 0.0
    assert dk_logit_bias(100, 1 / 100) == pytest.approx(0.0, abs=1e-12)
    assert dk_logit_bias(100, 0.9) == pytest.approx(math.log(0.9 / (0.1 / 99)), rel=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_without_dk_is_plain_log_softmax(shape):
    v = 9
    logits, targets = make_case(shape, v, dk_id=None)
    log_t, log_d, log_not_d = readout(logits, targets)
    want_t, _, _ = explicit(logits, targets, None)
    torch.testing.assert_close(log_t, want_t, rtol=1e-12, atol=1e-12)
    valid = targets != IGNORE
    ls = torch.log_softmax(logits, -1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(log_t[valid], ls[valid])
    assert torch.isneginf(log_d).all() and (log_not_d == 0).all()
    ref_out = readout_reference(logits, targets)
    assert_triples_close((log_t, log_d, log_not_d), ref_out, rtol=1e-12, atol=1e-12)


def test_ignored_targets():
    v, dk_id = 12, 5
    logits, targets = make_case((8,), v, dk_id, ignore_every=2)
    logits.requires_grad_(True)
    log_t, log_d, log_not_d = readout(logits, targets, dk_id=dk_id)
    ignored = targets == IGNORE
    assert ignored.any() and (~ignored).any()
    assert (log_t[ignored] == 0).all()
    _, want_d, want_nd = explicit(logits.detach(), targets, dk_id)
    torch.testing.assert_close(log_d, want_d)  # dk is read at every position
    torch.testing.assert_close(log_not_d, want_nd)
    (g,) = torch.autograd.grad(log_t.sum(), logits)
    assert (g[ignored] == 0).all() and (g[~ignored] != 0).any()


def test_no_rows():
    logits = torch.randn(0, 7, requires_grad=True)
    out = readout(logits, torch.zeros(0, dtype=torch.long), dk_id=2)
    assert all(x.shape == (0,) for x in out)
    sum(x.sum() for x in out).backward()
    assert logits.grad.shape == (0, 7)


# ---------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("shape", [(), (4,), (2, 3)])
@pytest.mark.parametrize("dk_id, bias", [(2, 0.0), (0, 1.7), (5, "prior")])
def test_gradcheck_with_dk(shape, dk_id, bias):
    v = 6
    b = dk_logit_bias(v, 0.9) if bias == "prior" else bias
    logits, targets = make_case(shape, v, dk_id, seed=1, scale=1.0)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda z: readout(z, targets, dk_id=dk_id, dk_bias=b), (logits,), eps=1e-6, atol=1e-7
    )


@pytest.mark.parametrize("shape", [(), (5,), (2, 3)])
def test_gradcheck_without_dk(shape):
    logits, targets = make_case(shape, 7, None, seed=2, scale=1.0)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z: readout(z, targets)[0], (logits,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dk_id", [None, 3])
def test_gradients_match_reference(dtype, dk_id):
    v = 30
    logits, targets = make_case((5, 4), v, dk_id, dtype=dtype, seed=3)
    b = 0.0 if dk_id is None else dk_logit_bias(v, 0.9)
    g = torch.Generator().manual_seed(4)
    up = [torch.randn(5, 4, generator=g, dtype=torch.float64) for _ in range(3)]

    def grads(fn):
        z = logits.clone().requires_grad_(True)
        out = fn(z, targets, dk_id=dk_id, dk_bias=b)
        # log_d = -inf without dk: keep it out of the objective (it is a constant).
        used = out if dk_id is not None else out[:1]
        loss = sum((o.double() * u).sum() for o, u in zip(used, up))
        (gz,) = torch.autograd.grad(loss, z)
        return gz

    got, want = grads(readout), grads(readout_reference)
    assert got.dtype == dtype
    kw = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-2, atol=1e-2)
    if dtype == torch.float32:
        kw = dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.double(), want.double(), **kw)


# ----------------------------------------------------------------------------- chunking


@pytest.mark.parametrize("rows_per_chunk", [1, 3, 8])
@pytest.mark.parametrize("dk_id", [None, 4])
def test_chunked_equals_unchunked(monkeypatch, rows_per_chunk, dk_id):
    v = 16
    logits, targets = make_case((3, 7), v, dk_id, seed=5)  # 21 rows: several chunks, a short last one
    b = 0.0 if dk_id is None else 1.3
    up = torch.randn(3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(6))

    def run():
        z = logits.clone().requires_grad_(True)
        out = readout(z, targets, dk_id=dk_id, dk_bias=b)
        loss = (out[0] * up).sum() + (0 if dk_id is None else (out[1] * up.flip(0)).sum() + out[2].sum())
        (gz,) = torch.autograd.grad(loss, z)
        return out, gz

    whole_out, whole_g = run()
    monkeypatch.setattr(readout_mod, "_CHUNK_ELEMENTS", rows_per_chunk * v)
    assert readout_mod._rows_per_chunk(v) == rows_per_chunk
    chunk_out, chunk_g = run()
    assert_triples_close(chunk_out, whole_out, rtol=0, atol=0)
    torch.testing.assert_close(chunk_g, whole_g, rtol=1e-14, atol=1e-14)
    want = explicit(logits, targets, dk_id, None if dk_id is None else bias_vector(v, dk_id, b))
    assert_triples_close(chunk_out, want, rtol=1e-12, atol=1e-12)


def test_non_contiguous_logits():
    v, dk_id = 10, 2
    base, targets = make_case((4, 6), 2 * v, dk_id)
    targets = targets.clamp(max=v - 1).masked_fill(targets == dk_id, 0).t()
    leaf = base.clone().requires_grad_(True)
    logits = leaf[..., ::2].transpose(0, 1)  # [6, 4, V], a strided view
    assert not logits.is_contiguous()
    zc = logits.detach().contiguous().requires_grad_(True)
    a = readout(logits, targets, dk_id=dk_id)
    b = readout(zc, targets, dk_id=dk_id)
    assert_triples_close(a, b, rtol=0, atol=0)
    (ga,) = torch.autograd.grad(sum(x.sum() for x in a), leaf)
    (gb,) = torch.autograd.grad(sum(x.sum() for x in b), zc)
    torch.testing.assert_close(ga[..., ::2].transpose(0, 1), gb, rtol=0, atol=0)
    assert (ga[..., 1::2] == 0).all()


# ------------------------------------------------------------------------------ extremes


@pytest.mark.parametrize("dk_id", [None, 0, 63])
def test_bf16_logits_of_magnitude_1e4(dk_id):
    v = 64
    g = torch.Generator().manual_seed(7)
    logits = (1e4 * torch.randn(6, 5, v, generator=g)).clamp(-1e4, 1e4).to(torch.bfloat16)
    # Rows where dk dominates (d -> 1), where it is buried (d -> 0), and the target far below.
    if dk_id is not None:
        logits[0, :, dk_id] = 1e4
        logits[1, :, dk_id] = -1e4
    targets = torch.randint(1, v - 1, (6, 5), generator=g)
    targets[2] = logits[2, :, 1 : v - 1].float().argmin(-1) + 1
    targets[3, ::2] = IGNORE
    b = 0.0 if dk_id is None else dk_logit_bias(v, 0.9)
    z = logits.clone().requires_grad_(True)
    out = readout(z, targets, dk_id=dk_id, dk_bias=b)
    used = out if dk_id is not None else out[:1]
    for x in used:
        assert torch.isfinite(x).all()
    assert (out[0] <= 0).all() and (used[-1] <= 0).all()
    want = readout_reference(logits, targets, dk_id=dk_id, dk_bias=b)
    assert_triples_close(out, want, rtol=1e-5, atol=1e-3)
    loss = sum(x.sum() for x in used)
    (gz,) = torch.autograd.grad(loss, z)
    assert gz.dtype == torch.bfloat16 and torch.isfinite(gz).all()


def test_extreme_float32_logits_give_finite_values_and_gradients():
    v, dk_id = 10, 9
    logits = torch.full((3, v), -3e4)
    logits[0, dk_id] = 3e4  # d = 1 up to rounding: log_not_d very negative but finite
    logits[1, 0] = 3e4  # d = 0 up to rounding
    logits[2, 1] = 3e4  # target 0 has t -> 0
    targets = torch.tensor([0, 0, 0])
    z = logits.clone().requires_grad_(True)
    out = readout(z, targets, dk_id=dk_id, dk_bias=dk_logit_bias(v, 0.9))
    for x in out:
        assert torch.isfinite(x).all()
    (gz,) = torch.autograd.grad(sum(x.sum() for x in out), z)
    assert torch.isfinite(gz).all()


# ------------------------------------------------------------------------------- errors


def test_errors_name_the_argument():
    logits = torch.randn(4, 10)
    with pytest.raises(ValueError, match="logits.*targets"):
        readout(logits, torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="logits.*targets"):
        readout(logits, torch.zeros(4, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="dk_id"):
        readout(logits, torch.zeros(4, dtype=torch.long), dk_id=10)
    with pytest.raises(ValueError, match="dk_id"):
        readout(logits, torch.zeros(4, dtype=torch.long), dk_id=-1)
    with pytest.raises(ValueError, match="targets.*vocabulary"):
        readout(logits, torch.tensor([0, 1, 10, 2]))
    with pytest.raises(ValueError, match="targets.*vocabulary"):
        readout(logits, torch.tensor([0, 1, -5, 2]))
    with pytest.raises(ValueError, match="dk_id"):
        readout(logits, torch.tensor([0, 1, 3, 2]), dk_id=3)
    with pytest.raises(TypeError, match="logits"):
        readout(torch.zeros(4, 10, dtype=torch.long), torch.zeros(4, dtype=torch.long))
    for psi in (0.0, 1.0, 1.5, -0.2):
        with pytest.raises(ValueError, match="psi_dk"):
            dk_logit_bias(10, psi)
    with pytest.raises(ValueError, match="vocab_size"):
        dk_logit_bias(1, 0.9)

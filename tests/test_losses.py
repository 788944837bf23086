"""cyb.losses against the float64 references of tests/reference.py (the paper's equations)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import reference as ref
from cyb.losses import (
    cyb_anytime_loss,
    cyb_decoupled_loss,
    cyb_dp_loss,
    cyb_loss,
    cyb_ponder_loss,
    cyb_va_loss,
    discount,
    expected_stop_step,
    stop_distribution,
    stop_log_probs,
    tbys_loss,
)

STEPS = [1, 2, 3, 4, 7]
LEADS = [(), (3, 5), (2, 1)]
DTYPES = [torch.float64, torch.float32]
OMEGAS = ["default", "positive", "zeros", "one_hot", "per_token"]


def tol(dtype):
    return dict(rtol=1e-9, atol=1e-9) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)


def make_inputs(lead, m, dtype, seed=0):
    """Random ``log_t`` (t in (0, 1)) and ``log_d``, ``log_not_d`` from a logit ``u``."""
    g = torch.Generator().manual_seed(seed)
    log_t = F.logsigmoid(2 * torch.randn(*lead, m, generator=g, dtype=torch.float64))
    u = 2 * torch.randn(*lead, m, generator=g, dtype=torch.float64)
    return log_t.to(dtype), F.logsigmoid(u).to(dtype), F.logsigmoid(-u).to(dtype)


def probs(*logs):
    """The probabilities the references take, from exactly the values the library sees."""
    return [x.double().exp() for x in logs]


def make_omega(kind, lead, m, seed=1):
    """A world stop distribution: None (one-hot on M), a vector, or a per-token tensor."""
    g = torch.Generator().manual_seed(seed)
    if kind == "default":
        return None
    if kind == "positive":
        return torch.rand(m, generator=g, dtype=torch.float64) + 0.1
    if kind == "zeros":  # un-normalised, zeros inside and at the end where M allows
        w = torch.rand(m, generator=g, dtype=torch.float64) + 0.1
        w[1::2] = 0.0
        return w
    if kind == "one_hot":
        w = [0.0] * m
        w[m // 2] = 1.0
        return torch.tensor(w)
    if kind == "per_token":  # Recipe 2: one-hot at W per token, W ~ uniform
        stops = torch.randint(0, m, lead, generator=g)
        return F.one_hot(stops, m).to(torch.float64)
    raise AssertionError(kind)


def omega_support_end(omega, lead, m):
    """Smallest (over tokens) last step with omega > 0: s_i > 0 exactly for i up to it."""
    if omega is None:
        return m
    w = torch.as_tensor(omega, dtype=torch.float64).expand(*lead, m).reshape(-1, m)
    return min(int(torch.nonzero(row > 0).max()) + 1 for row in w)


def rho_with_zeros(m, support_end, seed=2):
    """A desired stop distribution with zeros, supported inside steps 1..support_end."""
    g = torch.Generator().manual_seed(seed)
    rho = torch.rand(m, generator=g, dtype=torch.float64) + 0.1
    rho[support_end:] = 0.0
    if support_end >= 3:
        rho[1] = 0.0
    return rho


def positive_rho(m, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(m, generator=g, dtype=torch.float64) + 0.05


def gamma_vector(m, seed=4):
    """gamma in [0, 1] with zeros but gamma_1 = 1 (s_1 > 0 always, so the loss stays finite)."""
    g = torch.Generator().manual_seed(seed)
    gam = torch.rand(m, generator=g, dtype=torch.float64)
    gam[0] = 1.0
    gam[2::3] = 0.0
    return gam


def ref_kw(name, value):
    """Keyword for ``ref.per_token``: per-token tensors travel as tensors, vectors as lists."""
    if isinstance(value, torch.Tensor) and value.dim() > 1:
        return {name: value}
    return {name: None if value is None else torch.as_tensor(value, dtype=torch.float64).tolist()}


# ------------------------------------------------------------------- the references agree


@pytest.mark.parametrize("m", STEPS)
@pytest.mark.parametrize("omega_kind", OMEGAS[:4])
def test_eq2_and_hazard_form_agree_and_sum_to_one(m, omega_kind):
    g = torch.Generator().manual_seed(m)
    omega = make_omega(omega_kind, (), m)
    omega = None if omega is None else torch.as_tensor(omega).tolist()
    for _ in range(20):
        d = torch.rand(m, generator=g, dtype=torch.float64).tolist()
        a = ref.stop_probs_eq2(d, omega)
        b = ref.stop_probs_hazard(d, omega)
        assert a == pytest.approx(b, rel=1e-12, abs=1e-15)
        assert sum(a) == pytest.approx(1.0, abs=1e-12)


def test_hazard_form_with_extreme_d_and_zero_tails():
    omega = [0.0, 0.4, 0.6, 0.0, 0.0]
    for d in itertools.product([0.0, 0.3, 1.0], repeat=5):
        a, b = ref.stop_probs_eq2(list(d), omega), ref.stop_probs_hazard(list(d), omega)
        assert a == pytest.approx(b, abs=1e-15)
        assert sum(a) == pytest.approx(1.0, abs=1e-12)


# ------------------------------------------------------- values against the references


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", STEPS)
@pytest.mark.parametrize("omega_kind", OMEGAS)
def test_stop_distribution_matches_both_references(omega_kind, m, dtype):
    for lead in LEADS:
        _, log_d, log_not_d = make_inputs(lead, m, dtype)
        omega = make_omega(omega_kind, lead, m)
        (d,) = probs(log_d)
        got = stop_log_probs(log_d, log_not_d, omega).exp()
        assert got.dtype == dtype and got.shape == (*lead, m)
        want = ref.per_token(ref.stop_probs_eq2, d, **ref_kw("omega", omega))
        want_h = ref.per_token(ref.stop_probs_hazard, d, **ref_kw("omega", omega))
        torch.testing.assert_close(want, want_h, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(got.double(), want, **tol(dtype))
        torch.testing.assert_close(stop_distribution(log_d, log_not_d, omega).double(), want, **tol(dtype))
        ones = torch.ones(lead, dtype=torch.float64)
        torch.testing.assert_close(got.double().sum(-1), ones, **tol(dtype))
        e = expected_stop_step(log_d, log_not_d, omega)
        assert e.dtype == dtype and e.shape == lead
        want_e = ref.per_token(ref.expected_stop_step, d, **ref_kw("omega", omega))
        torch.testing.assert_close(e.double(), want_e, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", STEPS)
@pytest.mark.parametrize("omega_kind", OMEGAS)
def test_cyb_loss_matches_reference(omega_kind, m, dtype):
    for lead, gamma in itertools.product(LEADS, [None, discount(0.8, m), gamma_vector(m)]):
        log_t, log_d, log_not_d = make_inputs(lead, m, dtype)
        omega = make_omega(omega_kind, lead, m)
        t, d = probs(log_t, log_d)
        got = cyb_loss(log_t, log_d, log_not_d, omega=omega, gamma=gamma)
        assert got.dtype == dtype and got.shape == lead
        want = ref.per_token(ref.cyb_loss, t, d, **ref_kw("omega", omega), **ref_kw("gamma", gamma))
        torch.testing.assert_close(got.double(), want, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", STEPS)
@pytest.mark.parametrize("omega_kind", OMEGAS)
def test_tbys_loss_matches_reference(omega_kind, m, dtype):
    for lead in LEADS:
        log_t, _, _ = make_inputs(lead, m, dtype)
        omega = make_omega(omega_kind, lead, m)
        (t,) = probs(log_t)
        got = tbys_loss(log_t, omega=omega)
        assert got.dtype == dtype and got.shape == lead
        want = ref.per_token(ref.tbys_loss, t, **ref_kw("omega", omega))
        torch.testing.assert_close(got.double(), want, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", STEPS)
def test_cyb_va_loss_matches_reference(m, dtype):
    for lead, gamma in itertools.product(LEADS, [None, discount(0.7, m)]):
        log_t, log_d, log_not_d = make_inputs(lead, m, dtype)
        rho = positive_rho(m)
        t, d = probs(log_t, log_d)
        got = cyb_va_loss(log_t, log_d, log_not_d, rho=rho, gamma=gamma)
        assert got.dtype == dtype and got.shape == lead
        want = ref.per_token(ref.cyb_va_loss, t, d, rho=rho, **ref_kw("gamma", gamma))
        torch.testing.assert_close(got.double(), want, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", STEPS)
@pytest.mark.parametrize("omega_kind", OMEGAS)
def test_cyb_dp_loss_matches_reference(omega_kind, m, dtype):
    for lead, alpha in itertools.product(LEADS, [0.0, 0.1, 2.5]):
        log_t, log_d, log_not_d = make_inputs(lead, m, dtype)
        omega = make_omega(omega_kind, lead, m)
        rho = rho_with_zeros(m, omega_support_end(omega, lead, m))
        gamma = discount(0.9, m)
        t, d = probs(log_t, log_d)
        got = cyb_dp_loss(log_t, log_d, log_not_d, rho=rho, alpha=alpha, omega=omega, gamma=gamma)
        assert got.dtype == dtype and got.shape == lead
        want = ref.per_token(
            ref.cyb_dp_loss, t, d, rho=rho, alpha=alpha, **ref_kw("omega", omega), **ref_kw("gamma", gamma)
        )
        torch.testing.assert_close(got.double(), want, **tol(dtype))


def test_cyb_dp_loss_is_infinite_not_nan_where_rho_leaves_the_support_of_s():
    log_t, log_d, log_not_d = make_inputs((4,), 3, torch.float64)
    got = cyb_dp_loss(log_t, log_d, log_not_d, rho=[0.0, 0.0, 1.0], alpha=0.5, omega=[0.5, 0.5, 0.0])
    assert torch.isinf(got).all() and (got > 0).all()


@pytest.mark.parametrize("m", STEPS)
def test_discount(m):
    got = discount(0.8, m)
    assert got.shape == (m,) and got.dtype == torch.float64
    assert got.tolist() == pytest.approx(ref.discount(0.8, m), rel=1e-15)
    assert discount(0.0, m).tolist() == [1.0] + [0.0] * (m - 1)
    assert discount(1.0, m).tolist() == [1.0] * m


@pytest.mark.parametrize("m", [2, 4])
def test_gamma_as_tensor_or_per_token(m):
    log_t, log_d, log_not_d = make_inputs((3,), m, torch.float64)
    t, d = probs(log_t, log_d)
    gam = torch.rand(3, m, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.5 + 0.5
    got = cyb_loss(log_t, log_d, log_not_d, gamma=gam)
    torch.testing.assert_close(got, ref.per_token(ref.cyb_loss, t, d, gamma=gam), rtol=1e-9, atol=1e-9)
    got = cyb_loss(log_t, log_d, log_not_d, gamma=gam[0])
    torch.testing.assert_close(got, ref.per_token(ref.cyb_loss, t, d, gamma=gam[0]), rtol=1e-9, atol=1e-9)


def test_sequences_are_used_at_full_precision():
    """omega, rho and gamma given as Python sequences must not be rounded (e.g. via float32)
    before they meet float64 inputs."""
    m = 4
    log_t, log_d, log_not_d = make_inputs((3,), m, torch.float64)
    t, d = probs(log_t, log_d)
    w = [0.1234567891, 0.2345678912, 0.0, 0.6419753197]
    rho = [0.3141592653, 0.0, 0.2718281828, 0.4140125519]
    rho_pos = [0.3141592653, 0.1, 0.2718281828, 0.4140125519]
    gam = (1.0, 0.9876543211, 0.8765432198, 0.7654321987)
    close = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(stop_log_probs(log_d, log_not_d, w).exp(),
                               ref.per_token(ref.stop_probs_eq2, d, omega=w), **close)
    torch.testing.assert_close(tbys_loss(log_t, omega=w), ref.per_token(ref.tbys_loss, t, omega=w), **close)
    torch.testing.assert_close(cyb_loss(log_t, log_d, log_not_d, omega=w, gamma=gam),
                               ref.per_token(ref.cyb_loss, t, d, omega=w, gamma=list(gam)), **close)
    torch.testing.assert_close(cyb_va_loss(log_t, log_d, log_not_d, rho=rho_pos, gamma=gam),
                               ref.per_token(ref.cyb_va_loss, t, d, rho=rho_pos, gamma=list(gam)), **close)
    torch.testing.assert_close(cyb_dp_loss(log_t, log_d, log_not_d, rho=rho, alpha=0.7, omega=w),
                               ref.per_token(ref.cyb_dp_loss, t, d, rho=rho, alpha=0.7, omega=w), **close)


# ----------------------------------------------------------------------------- d_M == 0


@pytest.mark.parametrize("omega_kind", ["default", "positive", "zeros"])
@pytest.mark.parametrize("last", [(0.0, -math.inf), (-math.inf, 0.0), (3.0, 5.0), (-0.2, -1.7)])
def test_d_last_is_ignored(last, omega_kind):
    m = 4
    log_t, log_d, log_not_d = make_inputs((5,), m, torch.float64)
    omega = make_omega(omega_kind, (5,), m)
    rho = rho_with_zeros(m, omega_support_end(omega, (5,), m))
    losses = {
        "stop": lambda a, b: stop_log_probs(a, b, omega).exp().sum(0),
        "cyb": lambda a, b: cyb_loss(log_t, a, b, omega=omega),
        "va": lambda a, b: cyb_va_loss(log_t, a, b, rho=positive_rho(m)),
        "dp": lambda a, b: cyb_dp_loss(log_t, a, b, rho=rho, alpha=0.3, omega=omega),
    }
    for name, fn in losses.items():
        base = fn(log_d, log_not_d)
        a, b = log_d.clone(), log_not_d.clone()
        a[:, -1], b[:, -1] = last
        a.requires_grad_(True)
        b.requires_grad_(True)
        out = fn(a, b)
        torch.testing.assert_close(out, base, rtol=1e-12, atol=1e-12, msg=name)
        ga, gb = torch.autograd.grad(out.sum(), [a, b], allow_unused=True)
        for gr in (ga, gb):
            if gr is not None:
                assert torch.isfinite(gr).all(), name
                assert (gr[:, -1] == 0).all(), name


# --------------------------------------------------------------------------- gradients


def _gradcheck(fn, m, omega_kind="default", lead=(2,)):
    log_t, _, _ = make_inputs(lead, m, torch.float64, seed=7)
    u = torch.randn(*lead, m, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    log_t.requires_grad_(True)
    u.requires_grad_(True)
    omega = make_omega(omega_kind, lead, m)

    def f(lt, uu):
        return fn(lt, F.logsigmoid(uu), F.logsigmoid(-uu), omega)

    assert torch.autograd.gradcheck(f, (log_t, u), eps=1e-6, atol=1e-6, rtol=1e-5)


GRAD_STEPS = [1, 3, 4]
GRAD_OMEGAS = ["default", "zeros", "per_token"]


@pytest.mark.parametrize("m", GRAD_STEPS)
@pytest.mark.parametrize("omega_kind", GRAD_OMEGAS)
def test_gradcheck_stop_log_probs_and_expected_step(m, omega_kind):
    _gradcheck(lambda lt, a, b, w: stop_log_probs(a, b, w).exp() + lt, m, omega_kind)
    _gradcheck(lambda lt, a, b, w: expected_stop_step(a, b, w) + lt.sum(-1), m, omega_kind)


@pytest.mark.parametrize("m", GRAD_STEPS)
@pytest.mark.parametrize("omega_kind", GRAD_OMEGAS)
def test_gradcheck_cyb_and_tbys(m, omega_kind):
    gamma = discount(0.8, m)
    _gradcheck(lambda lt, a, b, w: cyb_loss(lt, a, b, omega=w, gamma=gamma), m, omega_kind)
    _gradcheck(lambda lt, a, b, w: tbys_loss(lt, omega=w), m, omega_kind)


@pytest.mark.parametrize("m", GRAD_STEPS)
def test_gradcheck_cyb_va(m):
    rho = positive_rho(m)
    _gradcheck(lambda lt, a, b, w: cyb_va_loss(lt, a, b, rho=rho, gamma=discount(0.9, m)), m)


@pytest.mark.parametrize("m", GRAD_STEPS)
@pytest.mark.parametrize("omega_kind", GRAD_OMEGAS)
def test_gradcheck_cyb_dp(m, omega_kind):
    lead = (2,)
    omega = make_omega(omega_kind, lead, m)
    rho = rho_with_zeros(m, omega_support_end(omega, lead, m))
    _gradcheck(lambda lt, a, b, w: cyb_dp_loss(lt, a, b, rho=rho, alpha=0.4, omega=w), m, omega_kind, lead)


@pytest.mark.parametrize("m", GRAD_STEPS)
@pytest.mark.parametrize("omega_kind", GRAD_OMEGAS)
def test_gradcheck_anytime_and_ponder(m, omega_kind):
    _gradcheck(lambda lt, a, b, w: cyb_anytime_loss(lt, a, b, weight=0.3, omega=w, gamma=discount(0.8, m)),
               m, omega_kind)
    _gradcheck(lambda lt, a, b, w: cyb_ponder_loss(lt, a, b, tau=0.2, omega=w), m, omega_kind)


# ------------------------------------------------------------------ recipes beyond the paper


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", STEPS)
@pytest.mark.parametrize("omega_kind", OMEGAS)
def test_new_recipes_match_reference(omega_kind, m, dtype):
    for lead in LEADS:
        log_t, log_d, log_not_d = make_inputs(lead, m, dtype, seed=m)
        omega = make_omega(omega_kind, lead, m)
        t, d = probs(log_t, log_d)
        w = ref_kw("omega", omega)
        for got, want in [
            (cyb_anytime_loss(log_t, log_d, log_not_d, weight=0.25, omega=omega, gamma=discount(0.9, m)),
             ref.per_token(ref.cyb_anytime_loss, t, d, weight=0.25, gamma=ref.discount(0.9, m), **w)),
            (cyb_decoupled_loss(log_t, log_d, log_not_d, omega=omega),
             ref.per_token(ref.cyb_decoupled_loss, t, d, **w)),
            (cyb_ponder_loss(log_t, log_d, log_not_d, tau=0.3, omega=omega),
             ref.per_token(ref.cyb_ponder_loss, t, d, tau=0.3, **w)),
        ]:
            assert got.dtype == dtype and got.shape == lead
            torch.testing.assert_close(got.double(), want, **tol(dtype))


def test_anytime_trains_every_step_even_when_cyb_does_not():
    """With d = 0 at step 1 CYB reads out there only: later steps get no gradient; the anytime
    term gives each step weight / M."""
    m = 4
    log_t = torch.log(torch.full((3, m), 0.3, dtype=torch.float64)).requires_grad_(True)
    log_d = torch.full((3, m), -math.inf, dtype=torch.float64)
    log_not_d = torch.zeros((3, m), dtype=torch.float64)
    (g_cyb,) = torch.autograd.grad(cyb_loss(log_t, log_d, log_not_d).sum(), log_t)
    assert torch.equal(g_cyb[:, 1:], torch.zeros(3, m - 1, dtype=torch.float64))
    (g_any,) = torch.autograd.grad(cyb_anytime_loss(log_t, log_d, log_not_d, weight=0.2).sum(), log_t)
    torch.testing.assert_close(g_any[:, 1:], torch.full((3, m - 1), -0.2 / m, dtype=torch.float64))


@pytest.mark.parametrize("omega_kind", ["default", "positive", "per_token"])
def test_decoupled_gradients(omega_kind):
    """t learns only from the per-step cross-entropy; d only from the CYB likelihood."""
    m, lead = 4, (3, 2)
    log_t, log_d, log_not_d = (x.requires_grad_(True) for x in make_inputs(lead, m, torch.float64, seed=5))
    omega = make_omega(omega_kind, lead, m)
    g_t, g_d, g_nd = torch.autograd.grad(cyb_decoupled_loss(log_t, log_d, log_not_d, omega=omega).sum(),
                                         [log_t, log_d, log_not_d])
    torch.testing.assert_close(g_t, torch.full_like(g_t, -1.0 / m))
    w_d, w_nd = torch.autograd.grad(cyb_loss(log_t, log_d, log_not_d, omega=omega).sum(), [log_d, log_not_d])
    torch.testing.assert_close(g_d, w_d)
    torch.testing.assert_close(g_nd, w_nd)


def test_new_recipe_arguments_are_checked():
    log_t, log_d, log_not_d = make_inputs((2,), 3, torch.float64)
    for bad in (-0.1, math.nan):
        with pytest.raises(ValueError, match="aux_weight"):
            cyb_anytime_loss(log_t, log_d, log_not_d, weight=bad)
    with pytest.raises(ValueError, match="ponder_cost"):
        cyb_ponder_loss(log_t, log_d, log_not_d, tau=math.inf)


# --------------------------------------------------------------------------- reductions


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_step_is_cross_entropy_for_every_loss(dtype):
    log_t, log_d, log_not_d = make_inputs((3, 5), 1, dtype)
    ce = -log_t[..., 0]
    t = tol(dtype)
    # d_1 = d_M is ignored: random, "always dk" and "never dk" all give cross-entropy.
    for a, b in [(log_d, log_not_d), (torch.zeros_like(log_d), torch.full_like(log_d, -math.inf)),
                 (torch.full_like(log_d, -math.inf), torch.zeros_like(log_d))]:
        torch.testing.assert_close(cyb_loss(log_t, a, b), ce, **t)
        torch.testing.assert_close(cyb_loss(log_t, a, b, omega=[3.0], gamma=[1.0]), ce, **t)
        torch.testing.assert_close(cyb_va_loss(log_t, a, b, rho=[1.0]), ce, **t)
        for alpha in (0.0, 0.5, 10.0):
            torch.testing.assert_close(cyb_dp_loss(log_t, a, b, rho=[1.0], alpha=alpha), ce, **t)
    torch.testing.assert_close(tbys_loss(log_t), ce, **t)
    torch.testing.assert_close(tbys_loss(log_t, omega=[1.0]), ce, **t)


@pytest.mark.parametrize("m", [2, 3, 7])
def test_cyb_with_d_one_before_the_end_is_tbys(m):
    log_t, _, _ = make_inputs((3, 5), m, torch.float64)
    log_d = torch.zeros_like(log_t)  # d = 1 everywhere (d_M is ignored)
    log_not_d = torch.full_like(log_t, -math.inf)
    (t,) = probs(log_t)
    want = -log_t[..., -1]
    torch.testing.assert_close(cyb_loss(log_t, log_d, log_not_d), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tbys_loss(log_t), want, rtol=1e-12, atol=1e-12)
    # General omega: -log sum_i omega_i t_i, for both CYB with d = 1 and TBYS.
    for kind in ["positive", "zeros", "one_hot"]:
        omega = make_omega(kind, (3, 5), m)
        want = ref.per_token(ref.tbys_loss, t, **ref_kw("omega", omega))
        w = torch.as_tensor(omega, dtype=torch.float64)
        direct = -torch.log((w / w.sum() * t).sum(-1))
        torch.testing.assert_close(want, direct, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(tbys_loss(log_t, omega=omega), want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(
            cyb_loss(log_t, log_d, log_not_d, omega=omega), want, rtol=1e-12, atol=1e-12
        )


@pytest.mark.parametrize("m", [2, 4, 7])
def test_cyb_va_with_rho_equal_to_own_stop_distribution_has_zero_kl(m):
    log_t, log_d, log_not_d = make_inputs((3, 5), m, torch.float64)
    gamma = discount(0.9, m)
    s = stop_distribution(log_d, log_not_d).detach()
    got = cyb_va_loss(log_t, log_d, log_not_d, rho=s, gamma=gamma)
    want = -(s * (torch.log(gamma) + log_t)).sum(-1)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- extremes


def _extreme_inputs(m=3, t_values=(1e-30, 0.5, 1.0 - 1e-12)):
    """Every pattern of d in {0, 0.5, 1}^M, with log_d / log_not_d = -inf exactly at 0 / 1."""
    pats = torch.tensor(list(itertools.product([0.0, 0.5, 1.0], repeat=m)), dtype=torch.float64)
    log_d = torch.where(pats > 0, pats.log(), torch.full_like(pats, -math.inf))
    log_not_d = torch.where(pats < 1, (1 - pats).log(), torch.full_like(pats, -math.inf))
    tv = torch.tensor(t_values, dtype=torch.float64)
    t = tv[torch.arange(pats.numel()) % len(t_values)].view_as(pats)
    return t.log(), log_d, log_not_d, pats, t


def f64(*values):
    return torch.tensor(values, dtype=torch.float64)


EXTREME_OMEGAS = [None, f64(0.5, 0.0, 0.5), f64(0.2, 0.3, 0.5), f64(1.0, 0.0, 0.0)]


@pytest.mark.parametrize("omega", EXTREME_OMEGAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_extremes_values_and_gradients_are_safe(omega, dtype):
    log_t, log_d, log_not_d, d, t = _extreme_inputs()
    log_t, log_d, log_not_d = (x.to(dtype).requires_grad_(True) for x in (log_t, log_d, log_not_d))
    d, t = d.to(dtype).double(), log_t.detach().double().exp()
    m = d.shape[-1]
    cases = {
        "stop": (lambda: stop_log_probs(log_d, log_not_d, omega).exp(),
                 ref.per_token(ref.stop_probs_eq2, d, omega=omega)),
        "cyb": (lambda: cyb_loss(log_t, log_d, log_not_d, omega=omega, gamma=discount(0.5, m)),
                ref.per_token(ref.cyb_loss, t, d, omega=omega, gamma=ref.discount(0.5, m))),
        "tbys": (lambda: tbys_loss(log_t, omega=omega), ref.per_token(ref.tbys_loss, t, omega=omega)),
        "va": (lambda: cyb_va_loss(log_t, log_d, log_not_d, rho=f64(0.2, 0.5, 0.3)),
               ref.per_token(ref.cyb_va_loss, t, d, rho=f64(0.2, 0.5, 0.3))),
        "dp": (lambda: cyb_dp_loss(log_t, log_d, log_not_d, rho=f64(0.6, 0.0, 0.4), alpha=0.3, omega=omega),
               ref.per_token(ref.cyb_dp_loss, t, d, rho=f64(0.6, 0.0, 0.4), alpha=0.3, omega=omega)),
        "expected": (lambda: expected_stop_step(log_d, log_not_d, omega),
                     ref.per_token(ref.expected_stop_step, d, omega=omega)),
        "anytime": (lambda: cyb_anytime_loss(log_t, log_d, log_not_d, weight=0.1, omega=omega),
                    ref.per_token(ref.cyb_anytime_loss, t, d, weight=0.1, omega=omega)),
        "decoupled": (lambda: cyb_decoupled_loss(log_t, log_d, log_not_d, omega=omega),
                      ref.per_token(ref.cyb_decoupled_loss, t, d, omega=omega)),
        "ponder": (lambda: cyb_ponder_loss(log_t, log_d, log_not_d, tau=-0.05, omega=omega),
                   ref.per_token(ref.cyb_ponder_loss, t, d, tau=-0.05, omega=omega)),
    }
    for name, (fn, want) in cases.items():
        got = fn()
        assert not torch.isnan(got).any(), name
        # Infinite only where the paper's value is (CYB-DP: rho outside the support of s).
        assert torch.equal(torch.isinf(got), torch.isinf(want)), name
        fin = torch.isfinite(want)
        torch.testing.assert_close(got.double()[fin], want[fin], **tol(dtype), msg=name)
        grads = torch.autograd.grad(got.sum(), [log_t, log_d, log_not_d], allow_unused=True)
        for x, gr in zip(("log_t", "log_d", "log_not_d"), grads):
            if gr is not None:
                assert torch.isfinite(gr).all(), f"{name}: gradient w.r.t. {x}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_tiny_targets_and_per_token_omega_gradients(dtype):
    m = 5
    log_t, log_d, log_not_d = make_inputs((6, 4), m, dtype, seed=3)
    log_t = torch.full_like(log_t, math.log(1e-30))
    omega = make_omega("per_token", (6, 4), m)
    leaves = [x.clone().requires_grad_(True) for x in (log_t, log_d, log_not_d)]
    for out in (
        cyb_loss(*leaves, omega=omega),
        tbys_loss(leaves[0], omega=omega),
        cyb_dp_loss(*leaves, rho=[1.0, 0, 0, 0, 0], alpha=0.2, omega=omega),
        cyb_va_loss(*leaves, rho=[0.1, 0.2, 0.3, 0.2, 0.2]),
    ):
        assert torch.isfinite(out).all()
        for gr in torch.autograd.grad(out.sum(), leaves, allow_unused=True):
            assert gr is None or torch.isfinite(gr).all()


# ------------------------------------------------------------------------------ errors


def _args(m=3):
    return make_inputs((2,), m, torch.float64)


@pytest.mark.parametrize("bad, match", [
    ([0.5, -0.1, 0.6], "omega.*non-negative"),
    ([0.0, 0.0, 0.0], "omega.*(zero|positive)"),
    ([0.5, 0.5], "omega.*length"),
    ([0.5, 0.2, 0.2, 0.1], "omega.*length"),
])
def test_bad_omega(bad, match):
    lt, a, b = _args()
    with pytest.raises(ValueError, match=match):
        stop_log_probs(a, b, bad)
    with pytest.raises(ValueError, match=match):
        cyb_loss(lt, a, b, omega=bad)
    with pytest.raises(ValueError, match=match):
        tbys_loss(lt, omega=bad)
    with pytest.raises(ValueError, match=match):
        cyb_dp_loss(lt, a, b, rho=[1, 1, 1], alpha=0.1, omega=bad)


@pytest.mark.parametrize("bad, match", [
    ([0.5, -0.1, 0.6], "rho.*non-negative"),
    ([0.0, 0.0, 0.0], "rho.*(zero|positive)"),
    ([0.5, 0.5], "rho.*length"),
])
def test_bad_rho(bad, match):
    lt, a, b = _args()
    with pytest.raises(ValueError, match=match):
        cyb_va_loss(lt, a, b, rho=bad)
    with pytest.raises(ValueError, match=match):
        cyb_dp_loss(lt, a, b, rho=bad, alpha=0.1)


def test_cyb_va_rejects_zeros_in_rho():
    lt, a, b = _args()
    with pytest.raises(ValueError, match="rho"):
        cyb_va_loss(lt, a, b, rho=[0.5, 0.0, 0.5])


@pytest.mark.parametrize("bad, match", [
    ([1.0, 1.2, 0.5], r"gamma.*\[0, 1\]"),
    ([1.0, -0.1, 0.5], r"gamma.*\[0, 1\]"),
    ([1.0, 0.5], "gamma.*length"),
])
def test_bad_gamma(bad, match):
    lt, a, b = _args()
    with pytest.raises(ValueError, match=match):
        cyb_loss(lt, a, b, gamma=bad)
    with pytest.raises(ValueError, match=match):
        cyb_va_loss(lt, a, b, rho=[1, 1, 1], gamma=bad)
    with pytest.raises(ValueError, match=match):
        cyb_dp_loss(lt, a, b, rho=[1, 1, 1], alpha=0.1, gamma=bad)


def test_bad_alpha():
    lt, a, b = _args()
    for alpha in (-0.1, math.nan, math.inf):
        with pytest.raises(ValueError, match="alpha"):
            cyb_dp_loss(lt, a, b, rho=[1, 1, 1], alpha=alpha)


def test_bad_discount():
    with pytest.raises(ValueError, match="num_steps|M"):
        discount(0.9, 0)
    with pytest.raises(ValueError, match="num_steps|M"):
        discount(0.9, -2)
    for g0 in (-0.1, 1.5):
        with pytest.raises(ValueError, match="gamma0"):
            discount(g0, 3)


def test_shapes_that_do_not_line_up():
    lt, a, b = _args(3)
    with pytest.raises(ValueError, match="log_t"):
        cyb_loss(lt[:, :2], a, b)
    with pytest.raises(ValueError, match="log_t"):
        cyb_va_loss(lt[:1], a, b, rho=[1, 1, 1])
    with pytest.raises(ValueError, match="log_not_d"):
        cyb_loss(lt, a, b[:, :2])
    with pytest.raises(ValueError, match="log_not_d"):
        stop_log_probs(a, b[:1])
    with pytest.raises(ValueError, match="M >= 1|length"):
        stop_log_probs(a[:, :0], b[:, :0])
    with pytest.raises(ValueError, match="log_t"):
        tbys_loss(lt[:, :0])

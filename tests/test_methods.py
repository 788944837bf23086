"""cyb.methods: one spec per method, and everything that asks it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cyb import losses, methods
from cyb.config import MethodConfig, RunConfig

FIELDS = {f.name for f in dataclasses.fields(MethodConfig)}


@pytest.mark.parametrize("name", methods.NAMES)
def test_every_spec_is_consistent(name):
    s = methods.spec(name)
    assert s.name == name and s.layout in methods.LAYOUTS and s.label and s.colour and s.help
    assert set(s.fields) <= FIELDS, set(s.fields) - FIELDS
    assert s.model_steps(4) == (4 if s.uses_pauses else 1)
    assert s.block_steps(4) == (4 if s.layout == "blocks" else 1)
    assert not s.has_dk or s.layout == "blocks"
    if s.needs_rho:
        assert "rho" in s.fields
    if s.recipe2:
        assert "recipe" in s.fields


@pytest.mark.parametrize("name", methods.NAMES)
def test_losses_of_every_method_run_on_random_inputs(name):
    me = MethodConfig(name=name, num_steps=3, rho=[1.0, 2.0, 1.0], gamma0=0.9 if methods.spec(name).has_dk else None)
    g = torch.Generator().manual_seed(0)
    lt = torch.log_softmax(torch.randn(5, 3, generator=g, dtype=torch.float64), -1)
    d = torch.sigmoid(torch.randn(5, 3, generator=g, dtype=torch.float64))
    for build in (methods.spec(name).train_loss, methods.spec(name).eval_loss):
        out = build(me, None)(lt, d.log(), (-d).log1p())
        assert out.shape == (5,) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", methods.NAMES)
def test_perplexity_loss_is_the_eval_loss_with_stops_only_at_m(name):
    """What an evaluation reports: CYB with gamma = 1 and the model's own stopping for a model with
    dk, cross-entropy at the last step otherwise, whatever omega the run trained with."""
    s = methods.spec(name)
    m = s.block_steps(3)
    g = torch.Generator().manual_seed(1)
    lt = torch.log_softmax(torch.randn(5, m, generator=g, dtype=torch.float64), -1)
    d = torch.sigmoid(torch.randn(5, m, generator=g, dtype=torch.float64))
    got = s.perplexity_loss(m)(lt, d.log(), (-d).log1p())
    want = losses.cyb_loss(lt, d.log(), (-d).log1p()) if s.has_dk else -lt[..., -1]
    assert torch.equal(got, want)


def test_a_saved_model_gets_the_spec_its_label_names_or_the_inferred_one():
    from cyb.model import PauseSettings

    assert methods.of_model(PauseSettings(num_steps=4, method="cyb_ponder", dk_id=9, pause_ids=(6, 7, 8),
                                          vocab_size=10)).name == "cyb_ponder"
    assert methods.of_model(PauseSettings(num_steps=4, method="my run", pause_ids=(6, 7, 8),
                                          vocab_size=10, psi_dk=None)).name == "tbys"


def test_unknown_method_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown method 'cybb'; known: baseline, baseline_nx"):
        methods.spec("cybb")


def test_labels():
    label = lambda **kw: methods.label(MethodConfig(**kw))  # noqa: E731
    assert label(name="baseline") == "Baseline"
    assert label(name="baseline_nx", seq_multiplier=4) == "Baseline 4x seq"
    assert label(name="tbys", num_steps=2) == "TBYS 1 pause"
    assert label(name="cyb", num_steps=4, gamma0=0.99) == "CYB 3 pauses (gamma0=0.99)"
    assert label(name="cyb_va", rho=[1, 1, 1, 1]) == "CYB-VA 3 pauses (rho=1:1:1:1)"
    assert label(name="tbys_original", tbys_scheme="append") == "TBYS (original) 3 pauses (append pauses)"
    assert label(name="cyb", recipe=2, omega=[1, 1, 1, 1]) == "CYB 3 pauses (Recipe 2, omega=1:1:1:1)"


def test_discount_vector_and_infer():
    assert methods.discount_vector(MethodConfig(gamma0=0.5, num_steps=3)) == [1.0, 0.5, 0.25]
    assert methods.discount_vector(MethodConfig(gamma=[1, 0.5, 0.5, 0.1])) == [1.0, 0.5, 0.5, 0.1]
    assert methods.discount_vector(MethodConfig()) is None
    assert [methods.infer(True, 4), methods.infer(False, 4), methods.infer(False, 1)] == ["cyb", "tbys", "baseline"]


def test_config_asks_the_spec():
    assert RunConfig.from_dict({"method": {"name": "cyb_dp", "rho": [0, 1, 1, 1]}}).validate().method.uses_dk
    with pytest.raises(ValueError, match="Recipe 2 .* applies to tbys, cyb, .*, not cyb_va"):
        RunConfig.from_dict({"method": {"name": "cyb_va", "recipe": 2, "rho": [1, 1, 1, 1]}}).validate()


def test_gamma0_anneal_falls_linearly_from_one_to_gamma0():
    me = MethodConfig(name="cyb", num_steps=3, gamma0=0.8, gamma0_anneal_steps=10)
    base = [methods.at_step(me, s).gamma0 for s in (0, 1, 5, 10, 11, 1000)]
    assert base == pytest.approx([1.0, 0.98, 0.9, 0.8, 0.8, 0.8])
    assert methods.discount_vector(methods.at_step(me, 5)) == pytest.approx([1.0, 0.9, 0.81])
    plain = MethodConfig(name="cyb", gamma0=0.8)
    assert methods.at_step(plain, 3) is plain
    assert "annealed over 10 steps" in methods.label(me)


def test_objective_trains_with_the_discount_of_the_current_step():
    from cyb import losses
    from cyb.layout import PauseVocab
    from cyb.objective import Objective

    me = MethodConfig(name="cyb", num_steps=3, gamma0=0.5, gamma0_anneal_steps=4)
    obj = Objective(me, PauseVocab(num_steps=3, pause_ids=(10, 11), dk_id=12, vocab_size=13))
    g = torch.Generator().manual_seed(1)
    lt = torch.log_softmax(torch.randn(6, 3, generator=g, dtype=torch.float64), -1)
    d = torch.sigmoid(torch.randn(6, 3, generator=g, dtype=torch.float64))
    for step, gamma0 in ((1, 0.875), (2, 0.75), (4, 0.5), (9, 0.5)):
        obj.set_step(step)
        want = losses.cyb_loss(lt, d.log(), (-d).log1p(), gamma=[1.0, gamma0, gamma0 ** 2])
        torch.testing.assert_close(obj.train_loss(lt, d.log(), (-d).log1p()), want)

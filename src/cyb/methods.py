"""The training methods: one frozen :class:`MethodSpec` per method, the only place that knows them.

A method is how a run lays out its rows (no pauses, Recipe 1 blocks of ``M`` steps, or the
original TBYS's inserted pauses), whether the model has a ``<don't know>`` output, how pause
positions are numbered, its training loss, the loss behind its reported perplexity, its label in
tables and the configuration fields it reads. Everything else (configuration, objective,
evaluation, analysis, benchmarks, demo, report) asks the spec through :func:`spec`.

Adding a method: one :class:`MethodSpec` entry in :data:`REGISTRY`, its loss in
:mod:`cyb.losses` (a pure tensor function of the per-step log-probabilities), and its tests
(a float64 reference of the equation in ``tests/reference.py``, the golden batch in
``tests/test_objective.py``).

Loss builders take the run's ``method`` section (any object with the
:class:`~cyb.config.MethodConfig` fields) and an optional ``omega`` overriding its world stop
distribution (Recipe 2 passes per-token one-hots), and return ``f(log_t, log_d, log_not_d) ->
per-token loss`` on inputs ``[..., M]``.  Given an ``omega``, an evaluation-loss builder reads
nothing else of the section: the perplexity an evaluation reports depends on the method alone
(:meth:`MethodSpec.perplexity_loss`).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable

LossFn = Callable[..., Any]
LossBuilder = Callable[[Any, Any], LossFn]

#: How a method lays out a row of real tokens.
LAYOUTS = ("none", "blocks", "inserted")


def _losses():
    """:mod:`cyb.losses`, imported on first use so that reading configurations needs no torch."""
    return importlib.import_module(".losses", __package__)


def discount_vector(method) -> list[float] | None:
    """gamma of a method section: ``gamma``, or ``gamma0^(i-1)`` for ``i = 1..M`` when
    ``gamma0`` is set, or None (no discount)."""
    if getattr(method, "gamma", None) is not None:
        return [float(g) for g in method.gamma]
    if getattr(method, "gamma0", None) is not None:
        return _losses().discount(float(method.gamma0), method.num_steps).tolist()
    return None


def at_step(method, step: int):
    """The method section in force at optimiser step ``step`` (1-based): with
    ``gamma0_anneal_steps = N > 0`` the discount base is ``1 - (1 - gamma0) min(1, step / N)``;
    otherwise ``method`` itself."""
    n = getattr(method, "gamma0_anneal_steps", 0)
    if not n or method.gamma0 is None:
        return method
    frac = min(1.0, max(0, step) / n)
    return dataclasses.replace(method, gamma0=1.0 - (1.0 - method.gamma0) * frac, gamma0_anneal_steps=0)


def _world(method, omega):
    return omega if omega is not None else method.omega


def _last_step_ce(method, omega) -> LossFn:
    ce = _losses().cross_entropy_loss
    return lambda lt, ld, lnd: ce(lt[..., -1])


def _tbys(method, omega) -> LossFn:
    w, tbys = _world(method, omega), _losses().tbys_loss
    return lambda lt, ld, lnd: tbys(lt, omega=w)


def _cyb(method, omega) -> LossFn:
    w, gamma, cyb = _world(method, omega), discount_vector(method), _losses().cyb_loss
    return lambda lt, ld, lnd: cyb(lt, ld, lnd, omega=w, gamma=gamma)


def _cyb_va(method, omega) -> LossFn:
    gamma, va = discount_vector(method), _losses().cyb_va_loss
    return lambda lt, ld, lnd: va(lt, ld, lnd, rho=method.rho, gamma=gamma)


def _cyb_dp(method, omega) -> LossFn:
    w, gamma, dp = _world(method, omega), discount_vector(method), _losses().cyb_dp_loss
    return lambda lt, ld, lnd: dp(lt, ld, lnd, rho=method.rho, alpha=method.alpha, omega=w, gamma=gamma)


def _cyb_anytime(method, omega) -> LossFn:
    w, gamma, fn = _world(method, omega), discount_vector(method), _losses().cyb_anytime_loss
    return lambda lt, ld, lnd: fn(lt, ld, lnd, weight=method.aux_weight, omega=w, gamma=gamma)


def _cyb_decoupled(method, omega) -> LossFn:
    w, gamma, fn = _world(method, omega), discount_vector(method), _losses().cyb_decoupled_loss
    return lambda lt, ld, lnd: fn(lt, ld, lnd, omega=w, gamma=gamma)


def _cyb_ponder(method, omega) -> LossFn:
    w, gamma, fn = _world(method, omega), discount_vector(method), _losses().cyb_ponder_loss
    return lambda lt, ld, lnd: fn(lt, ld, lnd, tau=method.ponder_cost, omega=w, gamma=gamma)


def _own_stopping(method, omega) -> LossFn:
    """Perplexity of a dk model: gamma = 1 and its own stopping (the world's stops only where
    Recipe 2 imposes them)."""
    cyb = _losses().cyb_loss
    return lambda lt, ld, lnd: cyb(lt, ld, lnd, omega=omega)


@dataclass(frozen=True)
class MethodSpec:
    """What a training method is.

    Attributes:
        name: the value of ``method.name``.
        label: its name in tables ("CYB-VA"); :func:`label` adds pauses and settings.
        layout: ``"none"`` (real tokens only), ``"blocks"`` (Recipe 1: each real token followed
            by ``M - 1`` pauses, or Recipe 2's variable blocks) or ``"inserted"`` (the original
            TBYS: one shared pause id inserted at random places or after the prompt, no blocks).
        has_dk: the model has a ``<don't know>`` output.
        positions: ``"config"`` (``method.position_scheme`` decides) or ``"advance"`` (pauses
            always advance positions).
        train_loss: builder of the per-token training loss.
        eval_loss: builder of the per-token loss whose mean gives the reported perplexity.
        fields: the ``method.*`` fields it reads besides ``name`` and ``num_steps``.
        recipe2: Recipe 2 (variable pauses) applies to it.
        needs_rho: ``method.rho`` is required; ``rho_positive``: and must be > 0 everywhere.
        lengthens_context: real tokens per row are ``data.block_len x method.seq_multiplier``.
        colour: its colour in figures.
        help: one line for ``--help-config``.
    """

    name: str
    label: str
    layout: str
    has_dk: bool
    train_loss: LossBuilder
    eval_loss: LossBuilder
    positions: str = "config"
    fields: tuple[str, ...] = ()
    recipe2: bool = False
    needs_rho: bool = False
    rho_positive: bool = False
    lengthens_context: bool = False
    colour: str = "tab:gray"
    help: str = ""

    @property
    def uses_pauses(self) -> bool:
        return self.layout != "none"

    def model_steps(self, num_steps: int) -> int:
        """``M`` of the model built for this method: its pause ids number ``M - 1``."""
        return num_steps if self.uses_pauses else 1

    def block_steps(self, num_steps: int) -> int:
        """Steps per real token of the rows it reads out (1 without blocks)."""
        return num_steps if self.layout == "blocks" else 1

    def context(self, method, block_len: int) -> int:
        """Real tokens per training row."""
        return block_len * (method.seq_multiplier if self.lengthens_context else 1)

    def position_scheme(self, method) -> str:
        return "advance" if self.positions == "advance" else method.position_scheme

    def perplexity_loss(self, num_steps: int) -> LossFn:
        """The per-token loss whose mean is the perplexity an evaluation reports (``cyb eval``,
        the demo) for readouts of ``num_steps`` steps: :attr:`eval_loss` with the world stopping
        only at the last step (``omega`` one-hot on ``M``), whatever ``omega`` the run trained
        with.  A model with dk then stops by itself, TBYS reads out at step ``M``, and a model
        without pauses (``M = 1``) gets plain cross-entropy."""
        return self.eval_loss(None, [0.0] * (num_steps - 1) + [1.0])


_DISCOUNT = ("gamma", "gamma0", "gamma0_anneal_steps")
_VISIBILITY = ("pause_visibility", "pause_gate_init", "pause_gate_lr", "pause_gate_anneal_steps")
REGISTRY: dict[str, MethodSpec] = {s.name: s for s in (
    MethodSpec("baseline", "Baseline", "none", False, _last_step_ce, _last_step_ce,
               colour="tab:gray", help="no pauses"),
    MethodSpec("baseline_nx", "Baseline", "none", False, _last_step_ce, _last_step_ce,
               fields=("seq_multiplier",), lengthens_context=True, colour="tab:brown",
               help="no pauses, seq_multiplier x longer context (compute-matched)"),
    MethodSpec("tbys_original", "TBYS (original)", "inserted", False, _last_step_ce, _last_step_ce,
               positions="advance", fields=("tbys_scheme", "random_pause_fraction", *_VISIBILITY), colour="tab:olive",
               help="random pauses, advancing positions, one shared pause id"),
    MethodSpec("tbys", "TBYS", "blocks", False, _tbys, _tbys, fields=("omega", "position_scheme", *_VISIBILITY, "recipe"),
               recipe2=True, colour="tab:orange", help="Recipe 1 pauses, cross-entropy at the world's stop"),
    MethodSpec("cyb", "CYB", "blocks", True, _cyb, _own_stopping,
               fields=("omega", *_DISCOUNT, "psi_dk", "position_scheme", *_VISIBILITY, "recipe"), recipe2=True,
               colour="tab:blue", help="the CYB loss"),
    MethodSpec("cyb_va", "CYB-VA", "blocks", True, _cyb_va, _own_stopping,
               fields=(*_DISCOUNT, "rho", "psi_dk", "position_scheme", *_VISIBILITY), needs_rho=True, rho_positive=True,
               colour="tab:purple", help="variational CYB with a desired stop distribution rho"),
    MethodSpec("cyb_dp", "CYB-DP", "blocks", True, _cyb_dp, _own_stopping,
               fields=("omega", *_DISCOUNT, "rho", "alpha", "psi_dk", "position_scheme", *_VISIBILITY), needs_rho=True,
               colour="tab:green", help="CYB plus alpha KL(rho || s)"),
    # training recipes beyond the paper (docs/concepts/recipes.md; docs/record/results/recipes.md compares them)
    MethodSpec("cyb_anytime", "CYB-anytime", "blocks", True, _cyb_anytime, _own_stopping,
               fields=("omega", *_DISCOUNT, "aux_weight", "psi_dk", "position_scheme", *_VISIBILITY, "recipe"), recipe2=True,
               colour="tab:cyan", help="CYB plus aux_weight x the mean cross-entropy of every step"),
    MethodSpec("cyb_decoupled", "CYB-decoupled", "blocks", True, _cyb_decoupled, _own_stopping,
               fields=("omega", *_DISCOUNT, "psi_dk", "position_scheme", *_VISIBILITY, "recipe"), recipe2=True,
               colour="tab:red", help="per-step cross-entropy for the predictions, CYB for d alone"),
    MethodSpec("cyb_ponder", "CYB-ponder", "blocks", True, _cyb_ponder, _own_stopping,
               fields=("omega", *_DISCOUNT, "ponder_cost", "psi_dk", "position_scheme", *_VISIBILITY, "recipe"), recipe2=True,
               colour="tab:pink", help="CYB plus ponder_cost x E[S]"),
)}

#: Method names in the order of tables and figures.
NAMES = tuple(REGISTRY)

#: The reference of relative improvements (the paper's appendix F compares with TBYS).
REFERENCE = "tbys"


def spec(name: str) -> MethodSpec:
    """The :class:`MethodSpec` of ``name``; ValueError naming the known methods otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(NAMES)}") from None


def infer(use_dk: bool, num_steps: int) -> str:
    """The method a saved model most likely had, from its settings alone."""
    return "cyb" if use_dk else ("tbys" if num_steps > 1 else "baseline")


def of_model(settings) -> MethodSpec:
    """The spec of a saved model (its :class:`~cyb.model.PauseSettings`): the method its label
    names, or the one :func:`infer` gives when the label is not a registered method."""
    name = settings.method if settings.method in REGISTRY else infer(settings.use_dk, settings.num_steps)
    return REGISTRY[name]


def _ratio(values) -> str:
    return ":".join(f"{float(v):g}" for v in values)


def label(method) -> str:
    """A short name for a method section: method, pauses and any non-default ``omega``,
    ``gamma``/``gamma0``, ``rho`` or Recipe 2 (e.g. ``"CYB 3 pauses (gamma0=0.99)"``)."""
    s = spec(method.name)
    if s.lengthens_context:
        return f"{s.label} {method.seq_multiplier}x seq"
    if not s.uses_pauses:
        return s.label
    pauses = method.num_steps - 1
    text = f"{s.label} {pauses} pause" + ("" if pauses == 1 else "s")
    extras = []
    if "tbys_scheme" in s.fields and getattr(method, "tbys_scheme", "random") != "random":
        extras.append(f"{method.tbys_scheme} pauses")
    if getattr(method, "recipe", 1) == 2:
        extras.append("Recipe 2")
    if method.omega is not None:
        extras.append(f"omega={_ratio(method.omega)}")
    if s.has_dk:
        if method.gamma0 is not None:
            extras.append(f"gamma0={method.gamma0:g}")
            if getattr(method, "gamma0_anneal_steps", 0):
                extras.append(f"annealed over {method.gamma0_anneal_steps} steps")
        elif method.gamma is not None:
            extras.append(f"gamma={_ratio(method.gamma)}")
    if s.needs_rho and method.rho is not None:
        extras.append(f"rho={_ratio(method.rho)}")
    return text + (f" ({', '.join(extras)})" if extras else "")


__all__ = ["LAYOUTS", "MethodSpec", "NAMES", "REFERENCE", "REGISTRY", "at_step", "discount_vector", "infer", "label",
           "of_model", "spec"]

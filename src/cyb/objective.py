"""From a batch of real tokens to a training loss, for every method.

The loss of a micro-batch is returned as a *sum* over real tokens together with the number of
tokens it covers, so that the training loop can normalise by the real tokens of the whole
optimiser step (gradient accumulation and data parallelism then give the same update as one
large batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import losses
from .config import MethodConfig
from .layout import IGNORE_INDEX, PauseVocab, collapse, expand, expand_variable, insert_random_pauses, sample_pause_counts
from .readout import readout


@dataclass
class StepTerms:
    """Per-step readout of a batch laid out as blocks: tensors ``[B, L, M]`` plus masks."""

    log_t: torch.Tensor
    log_d: torch.Tensor
    log_not_d: torch.Tensor
    valid: torch.Tensor  # [B, L] blocks with a target
    omega: torch.Tensor | None = None  # per-token omega for Recipe 2


@dataclass
class LossOutput:
    """``loss_sum`` (differentiable, summed over real tokens), ``num_tokens`` and metric sums."""

    loss_sum: torch.Tensor
    num_tokens: int
    sums: dict = field(default_factory=dict)


def loss_fn_for(method: MethodConfig, omega=None) -> Callable:
    """The per-block training loss ``f(log_t, log_d, log_not_d) -> [...]`` of a method.

    Inputs are ``[..., M]``.  ``omega`` overrides the method's world stop distribution (Recipe 2
    passes a per-token one-hot).
    """
    w = omega if omega is not None else method.omega
    gamma = method.gamma
    if gamma is None and method.gamma0 is not None:
        gamma = losses.discount(method.gamma0, method.num_steps)
    name = method.name
    if name in ("baseline", "baseline_nx", "tbys_original"):
        return lambda lt, ld, lnd: losses.cross_entropy_loss(lt[..., -1])
    if name == "tbys":
        return lambda lt, ld, lnd: losses.tbys_loss(lt, omega=w)
    if name == "cyb":
        return lambda lt, ld, lnd: losses.cyb_loss(lt, ld, lnd, omega=w, gamma=gamma)
    if name == "cyb_va":
        return lambda lt, ld, lnd: losses.cyb_va_loss(lt, ld, lnd, rho=method.rho, gamma=gamma)
    if name == "cyb_dp":
        return lambda lt, ld, lnd: losses.cyb_dp_loss(
            lt, ld, lnd, rho=method.rho, alpha=method.alpha, omega=w, gamma=gamma)
    raise ValueError(f"unknown method {name!r}")


def eval_loss_fn(method: MethodConfig) -> Callable:
    """Per-token loss whose mean gives the reported perplexity.

    CYB variants: ``gamma = 1`` and the model's own stopping (omega one-hot on M); TBYS: cross-
    entropy at its readout (the last step); baselines: plain cross-entropy.
    """
    if method.uses_dk:
        return lambda lt, ld, lnd: losses.cyb_loss(lt, ld, lnd)
    return lambda lt, ld, lnd: losses.cross_entropy_loss(lt[..., -1])


def use_fused(impl: str, device: torch.device) -> bool:
    if impl == "fused":
        return True
    if impl == "naive":
        return False
    return device.type == "cuda"


@dataclass
class Prepared:
    """A micro-batch laid out for the model: inputs, per-step targets and how to regroup them.

    ``layout`` is ``"blocks"`` (Recipe 1: ``[B, L*M]`` -> ``[B, L, M]``), ``"variable"``
    (Recipe 2, regrouped with ``variable.gather``) or ``"flat"`` (original TBYS: one target per
    position, no blocks).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    num_tokens: int
    layout: str
    block_valid: torch.Tensor | None = None  # [B, L]
    variable: object | None = None


class Objective:
    """Lays out a batch for a method, runs the model and returns the loss sum.

    Args:
        method: the method section of the run configuration.
        vocab: the model's pause vocabulary (``M``, pause ids, dk id).
        dk_bias: the dk prior offset added to the dk logit.
        impl: ``"auto"``, ``"fused"`` or ``"naive"`` readout.
    """

    def __init__(self, method: MethodConfig, vocab: PauseVocab, dk_bias: float = 0.0, impl: str = "auto"):
        self.method = method
        self.vocab = vocab
        self.dk_bias = dk_bias
        self.impl = impl
        self.train_loss = loss_fn_for(method)
        self.eval_loss = eval_loss_fn(method)

    # ------------------------------------------------------------------------------ layout
    def prepare(self, batch: dict, *, generator: torch.Generator | None = None) -> Prepared:
        """Lay out ``batch`` (``ids`` ``[B, L]``, optional ``attention_mask``, ``loss_mask``)."""
        ids = batch["ids"]
        mask = batch.get("attention_mask")
        loss_mask = batch.get("loss_mask")
        if self.method.name == "tbys_original":
            num = max(1, int(round(self.method.random_pause_fraction * ids.shape[1])))
            seq = insert_random_pauses(ids, num, self.vocab.pause_ids[0], generator=generator)
            n = int((seq.labels != IGNORE_INDEX).sum())
            return Prepared(seq.input_ids, seq.position_ids, seq.attention_mask, seq.labels, n, "flat")
        if self.method.recipe == 2:
            counts = sample_pause_counts(ids.shape, self._omega_or_last(), generator=generator)
            ex = expand_variable(ids, counts.to(ids.device), self.vocab, attention_mask=mask,
                                 loss_mask=loss_mask)
            valid = ex.block_labels != IGNORE_INDEX
            return Prepared(ex.input_ids, ex.position_ids, ex.attention_mask, ex.labels,
                            int(valid.sum()), "variable", valid, ex)
        ex = expand(ids, self.vocab, attention_mask=mask, loss_mask=loss_mask)
        valid = ex.block_labels != IGNORE_INDEX
        return Prepared(ex.input_ids, ex.position_ids, ex.attention_mask, ex.labels,
                        int(valid.sum()), "blocks", valid)

    def _omega_or_last(self):
        m = self.vocab.num_steps
        return self.method.omega if self.method.omega is not None else [0.0] * (m - 1) + [1.0]

    def step_terms(self, model, prep: Prepared) -> StepTerms:
        """Naive readout (full logits): per-step ``(log_t, log_d, log_not_d)`` as ``[B, L, M]``."""
        if prep.layout == "flat":
            raise ValueError("the original TBYS layout has no blocks of steps")
        hidden, _ = model.hidden_states(prep.input_ids, prep.position_ids, prep.attention_mask)
        lt, ld, lnd = readout(model.logits(hidden), prep.labels, dk_id=self.vocab.dk_id,
                              dk_bias=self.dk_bias)
        if prep.layout == "variable":
            ex = prep.variable
            grid = [ex.gather(x.unsqueeze(-1)).squeeze(-1) for x in (lt, ld, lnd)]
            return StepTerms(*grid, valid=prep.block_valid, omega=ex.world_omega().to(lt.dtype))
        grid = [collapse(x, self.vocab.num_steps) for x in (lt, ld, lnd)]
        return StepTerms(*grid, valid=prep.block_valid)

    # ------------------------------------------------------------------------------ losses
    def loss(self, model, prep: Prepared, *, with_metrics: bool = True) -> LossOutput:
        """Training loss sum of a prepared micro-batch (see :class:`LossOutput`)."""
        if prep.layout == "flat":
            return self._flat_loss(model, prep)
        if prep.layout == "blocks" and use_fused(self.impl, prep.input_ids.device):
            return self._fused_loss(model, prep)
        terms = self.step_terms(model, prep)
        fn = loss_fn_for(self.method, terms.omega) if terms.omega is not None else self.train_loss
        per_token = fn(terms.log_t, terms.log_d, terms.log_not_d)
        loss_sum = torch.where(terms.valid, per_token, torch.zeros_like(per_token)).sum()
        out = LossOutput(loss_sum, prep.num_tokens)
        if with_metrics:
            out.sums = self.metric_sums(terms)
        return out

    def __call__(self, model, batch: dict, *, generator: torch.Generator | None = None) -> LossOutput:
        """``prepare`` then ``loss``."""
        return self.loss(model, self.prepare(batch, generator=generator))

    def _fused_loss(self, model, prep: Prepared) -> LossOutput:
        from .kernels import fused_linear_loss

        hidden, _ = model.hidden_states(prep.input_ids, prep.position_ids, prep.attention_mask)
        weight, bias = model.output_projection()
        loss_sum, stats = fused_linear_loss(
            hidden.reshape(-1, hidden.shape[-1]), weight, prep.labels.reshape(-1),
            self.train_loss, self.vocab.num_steps, dk_id=self.vocab.dk_id,
            dk_bias=self.dk_bias, bias=bias, softcap=model.final_logit_softcap)
        b, length = prep.block_valid.shape
        m = self.vocab.num_steps
        terms = StepTerms(*(x.detach().view(b, length, m) for x in stats), valid=prep.block_valid)
        return LossOutput(loss_sum, prep.num_tokens, self.metric_sums(terms))

    def _flat_loss(self, model, prep: Prepared) -> LossOutput:
        hidden, _ = model.hidden_states(prep.input_ids, prep.position_ids, prep.attention_mask)
        lt, _, _ = readout(model.logits(hidden), prep.labels)
        valid = prep.labels != IGNORE_INDEX
        nll = torch.where(valid, -lt, torch.zeros_like(lt)).sum()
        return LossOutput(nll, prep.num_tokens, {"nll": float(nll.detach()), "tokens": prep.num_tokens})

    @torch.no_grad()
    def metric_sums(self, terms: StepTerms) -> dict:
        """Sums over valid tokens: eval NLL (for perplexity) and, with dk, E[S] and Pr(S=i)."""
        valid = terms.valid
        lt, ld, lnd = (x.detach().float() for x in (terms.log_t, terms.log_d, terms.log_not_d))
        n = int(valid.sum())
        nll = self.eval_loss(lt, ld, lnd)
        sums = {"nll": float(nll[valid].sum()), "tokens": n}
        if self.method.uses_dk and n:
            s = losses.stop_distribution(ld, lnd)[valid]
            steps = torch.arange(1, s.shape[-1] + 1, dtype=s.dtype, device=s.device)
            sums["stop_step"] = float((s * steps).sum())
            sums["stop_dist"] = s.sum(0).tolist()
        return sums


def merge_sums(total: dict, part: dict) -> dict:
    """Accumulate metric sums (numbers add, lists add element-wise)."""
    for k, v in part.items():
        if isinstance(v, list):
            prev = total.get(k)
            total[k] = v if prev is None else [a + b for a, b in zip(prev, v)]
        else:
            total[k] = total.get(k, 0) + v
    return total


def summarise(sums: dict) -> dict:
    """Per-token metrics from sums: ``loss`` (mean NLL), ``ppl`` and, with dk, ``mean_steps``."""
    n = max(sums.get("tokens", 0), 1)
    out = {"loss": sums.get("nll", 0.0) / n}
    out["ppl"] = math.exp(min(out["loss"], 50.0))
    if "stop_step" in sums:
        out["mean_steps"] = sums["stop_step"] / n
        out["stop_dist"] = [x / n for x in sums["stop_dist"]]
    out["tokens"] = sums.get("tokens", 0)
    return out

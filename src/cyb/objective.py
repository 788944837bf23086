"""From a batch of real tokens to a training loss, for every method.

The loss of a micro-batch is returned as a *sum* over real tokens together with the number of
tokens it covers, so that the training loop can normalise by the real tokens of the whole
optimiser step (gradient accumulation and data parallelism then give the same update as one
large batch).  Metric sums stay tensors on the model's device (no host synchronisation per
micro-batch); :func:`reduce_sums` turns them into numbers when a line is logged.

Random layouts (Recipe 2 pause counts, original-TBYS random pauses) draw from one generator per
row, seeded by the caller (the trainer derives the seed from the run seed, the step and the
row's index in the global batch), so a row gets the same pauses whatever the number of
processes or micro-batches.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Sequence

import torch

from . import losses, methods
from .config import MethodConfig
from .layout import (IGNORE_INDEX, PauseVocab, collapse, expand, expand_variable, insert_pauses,
                     prompt_pause_slots, random_pause_slots, sample_pause_counts)
from .readout import readout
from .visibility import BlockSteps


@dataclass
class StepTerms:
    """Per-step readout of a batch laid out as blocks: tensors ``[B, L, M]`` plus masks."""

    log_t: torch.Tensor
    log_d: torch.Tensor
    log_not_d: torch.Tensor
    valid: torch.Tensor  # [B, L] blocks with a target
    omega: torch.Tensor | None = None  # [B, L, M] per-token world stops (Recipe 2)


@dataclass
class LossOutput:
    """``loss_sum`` (differentiable, summed over target tokens), ``num_targets`` and metric sums.

    ``sums`` maps names to detached tensors (or ints) that add up over micro-batches and
    processes: ``objective`` (the training loss), ``nll`` (the perplexity loss), ``targets``,
    and with dk ``stop_step`` (sum of E[S]) and ``stop_dist`` (``[M]`` sum of Pr(S=i)).
    """

    loss_sum: torch.Tensor
    num_targets: int
    sums: dict = field(default_factory=dict)


def use_fused(impl: str, device: torch.device) -> bool:
    """Whether ``train.loss_impl`` picks the fused readout (``auto``: on CUDA)."""
    if impl == "fused":
        return True
    if impl == "naive":
        return False
    return device.type == "cuda"


def _is_instance_of_dataclass(x) -> bool:
    return dataclasses.is_dataclass(x) and not isinstance(x, type)


def _move(x, device, non_blocking: bool):
    """``x`` with every tensor on ``device``: a tensor, or a dataclass whose fields are tensors or
    such dataclasses (Recipe 2's layout inside a :class:`Prepared`); anything else as it is."""
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=non_blocking)
    if _is_instance_of_dataclass(x):
        values = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
        return dataclasses.replace(x, **{name: _move(v, device, non_blocking) for name, v in values.items()
                                         if isinstance(v, torch.Tensor) or _is_instance_of_dataclass(v)})
    return x


@dataclass
class Prepared:
    """A micro-batch laid out for the model: inputs, per-step targets and how to regroup them.

    ``layout`` is ``"blocks"`` (Recipe 1: ``[B, L*M]`` -> ``[B, L, M]``), ``"variable"``
    (Recipe 2, regrouped with ``variable.gather``) or ``"flat"`` (original TBYS: one target per
    position, no blocks).  ``num_targets`` counts the real tokens that are predicted (the loss
    normaliser), ``num_real`` the real input tokens (throughput); both are host integers.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    num_targets: int
    num_real: int
    layout: str
    block_valid: torch.Tensor | None = None  # [B, L]
    variable: object | None = None
    steps: BlockSteps | None = None  # block and step of every position (non-shared pause masks)

    def to(self, device, non_blocking: bool = False) -> "Prepared":
        """A copy with every tensor on ``device``."""
        return _move(self, device, non_blocking)

    @property
    def max_position(self) -> int:
        """The largest position id used (for checks against the model's limit)."""
        return int(self.position_ids.max()) if self.position_ids.numel() else 0


def run_model(model, prep: Prepared) -> torch.Tensor:
    """``[B, T, H]`` last hidden states of a prepared batch, with the pause mask the model's
    visibility asks for."""
    hidden, _ = model.hidden_states(prep.input_ids, prep.position_ids, prep.attention_mask,
                                    steps=prep.steps)
    return hidden


def _generators(seeds: Sequence[int] | None, rows: int) -> list:
    if seeds is None:
        return [None] * rows
    if len(seeds) != rows:
        raise ValueError(f"seeds must hold one seed per row ({rows}), got {len(seeds)}")
    return [torch.Generator().manual_seed(int(s)) for s in seeds]


class Objective:
    """Lays out a batch for a method, runs the model and returns the loss sum.

    The method's :class:`~cyb.methods.MethodSpec` (``spec``, looked up once) gives the per-token
    training loss (``train_loss``) and the loss behind the logged perplexity (``eval_loss``);
    Recipe 2 builds them again with each batch's per-token world stops.

    Args:
        method: the method section of the run configuration.
        vocab: the model's pause vocabulary (``M``, pause ids, dk id).
        dk_bias: the dk prior offset added to the dk logit.
        impl: ``"auto"``, ``"fused"`` or ``"naive"`` readout.
    """

    def __init__(self, method: MethodConfig, vocab: PauseVocab, dk_bias: float = 0.0, impl: str = "auto"):
        self.method = self.base_method = method
        self.spec = methods.spec(method.name)
        self.vocab = vocab
        self.dk_bias = dk_bias
        self.impl = impl
        self.train_loss = self.spec.train_loss(method, None)
        self.eval_loss = self.spec.eval_loss(method, None)

    def set_step(self, step: int) -> None:
        """Use the method as it stands at optimiser step ``step`` (a scheduled discount,
        :func:`cyb.methods.at_step`); a no-op for unscheduled methods."""
        method = methods.at_step(self.base_method, step)
        if method != self.method:
            self.method = method
            self.train_loss = self.spec.train_loss(method, None)

    # ------------------------------------------------------------------------------ layout
    def prepare(self, batch: dict, *, seeds: Sequence[int] | None = None) -> Prepared:
        """Lay out ``batch`` (``ids`` ``[B, L]``, optional ``attention_mask``, ``loss_mask``).

        Best called on CPU tensors (the layout checks ids on the host) and moved with
        :meth:`Prepared.to`.  ``seeds`` (one per row) fix the random layouts; None draws from
        torch's global generator.
        """
        ids = batch["ids"].long()
        mask = batch.get("attention_mask")
        loss_mask = batch.get("loss_mask")
        num_real = int(mask.sum()) if mask is not None else ids.numel()
        gens = _generators(seeds, ids.shape[0])
        if self.spec.layout == "inserted":
            return self._prepare_inserted(ids, mask, loss_mask, gens)
        if self.method.recipe == 2:
            omega = self._omega_or_last()
            counts = torch.cat([sample_pause_counts((1, ids.shape[1]), omega, generator=g) for g in gens])
            ex = expand_variable(ids, counts, self.vocab, attention_mask=mask, loss_mask=loss_mask)
            valid = ex.block_labels != IGNORE_INDEX
            return Prepared(ex.input_ids, ex.position_ids, ex.attention_mask, ex.labels,
                            int(valid.sum()), num_real, "variable", valid, ex, ex.steps)
        ex = expand(ids, self.vocab, attention_mask=mask, loss_mask=loss_mask)
        valid = ex.block_labels != IGNORE_INDEX
        return Prepared(ex.input_ids, ex.position_ids, ex.attention_mask, ex.labels,
                        int(valid.sum()), num_real, "blocks", valid, steps=ex.steps)

    def _prepare_inserted(self, ids, mask, loss_mask, gens) -> Prepared:
        """The original TBYS: one shared pause id inserted after the prompt or at random."""
        pause_id = self.vocab.pause_ids[0]
        self.vocab.check_real_ids(ids, mask=mask)
        if self.method.tbys_scheme == "append":
            k = self.vocab.num_steps - 1
            slots = lambda r, n, target: prompt_pause_slots(target, k)  # noqa: E731
        else:
            frac = self.method.random_pause_fraction
            slots = lambda r, n, target: random_pause_slots(n, int(round(frac * n)), gens[r])  # noqa: E731
        ps = insert_pauses(ids, pause_id, slots, attention_mask=mask, loss_mask=loss_mask)
        num_real = int(((ps.input_ids != pause_id) & ps.attention_mask.bool()).sum())
        return Prepared(ps.input_ids, ps.position_ids, ps.attention_mask, ps.labels,
                        int((ps.labels != IGNORE_INDEX).sum()), num_real, "flat", steps=ps.steps)

    def _omega_or_last(self):
        m = self.vocab.num_steps
        return self.method.omega if self.method.omega is not None else [0.0] * (m - 1) + [1.0]

    # ------------------------------------------------------------------------------ losses
    def _row_terms(self, model, prep: Prepared, *, dk: bool = True):
        """``(log_t, log_d, log_not_d)`` ``[B, T]`` per position; without full logits when the
        fused readout is on (it recomputes each chunk's logits in backward)."""
        hidden = run_model(model, prep)
        dk_id = self.vocab.dk_id if dk else None
        if not use_fused(self.impl, hidden.device):
            return readout(model.logits(hidden), prep.labels, dk_id=dk_id, dk_bias=self.dk_bias)
        from .kernels import fused_readout

        weight, bias = model.output_projection()
        rows = fused_readout(hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype), weight,
                             prep.labels.reshape(-1), dk_id=dk_id, dk_bias=self.dk_bias, bias=bias,
                             softcap=model.final_logit_softcap)
        return tuple(x.view(prep.labels.shape) for x in rows)

    def step_terms(self, model, prep: Prepared) -> StepTerms:
        """Per-step ``(log_t, log_d, log_not_d)`` as ``[B, L, M]`` (blocks and Recipe 2 layouts)."""
        if prep.layout == "flat":
            raise ValueError("the original TBYS layout has no blocks of steps")
        lt, ld, lnd = self._row_terms(model, prep)
        if prep.layout == "variable":
            ex = prep.variable
            grid = [ex.gather(x.unsqueeze(-1)).squeeze(-1) for x in (lt, ld, lnd)]
            return StepTerms(*grid, valid=prep.block_valid, omega=ex.world_omega().to(lt.dtype))
        grid = [collapse(x, self.vocab.num_steps) for x in (lt, ld, lnd)]
        return StepTerms(*grid, valid=prep.block_valid)

    def loss(self, model, prep: Prepared, *, with_metrics: bool = True) -> LossOutput:
        """Training loss sum of a prepared micro-batch (see :class:`LossOutput`)."""
        if prep.layout == "flat":
            return self._flat_loss(model, prep)
        if prep.layout == "blocks" and use_fused(self.impl, prep.input_ids.device):
            return self._fused_loss(model, prep, with_metrics)
        terms = self.step_terms(model, prep)
        fn = self.spec.train_loss(self.method, terms.omega) if terms.omega is not None else self.train_loss
        per_token = fn(terms.log_t, terms.log_d, terms.log_not_d)
        loss_sum = torch.where(terms.valid, per_token, torch.zeros_like(per_token)).sum()
        out = LossOutput(loss_sum, prep.num_targets)
        if with_metrics:
            out.sums = self.metric_sums(terms, loss_sum, prep.num_targets)
        return out

    def __call__(self, model, batch: dict, *, seeds: Sequence[int] | None = None) -> LossOutput:
        """``prepare`` then ``loss`` (on the model's device)."""
        prep = self.prepare({k: v.cpu() for k, v in batch.items()}, seeds=seeds)
        return self.loss(model, prep.to(next(model.parameters()).device))

    def _fused_loss(self, model, prep: Prepared, with_metrics: bool) -> LossOutput:
        from .kernels import fused_linear_loss

        hidden = run_model(model, prep)
        weight, bias = model.output_projection()
        loss_sum, stats = fused_linear_loss(
            hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype), weight, prep.labels.reshape(-1),
            self.train_loss, self.vocab.num_steps, dk_id=self.vocab.dk_id,
            dk_bias=self.dk_bias, bias=bias, softcap=model.final_logit_softcap)
        out = LossOutput(loss_sum, prep.num_targets)
        if with_metrics:
            b, length = prep.block_valid.shape
            m = self.vocab.num_steps
            grid = (x.detach().view(b, length, m) for x in (stats.log_t, stats.log_d, stats.log_not_d))
            out.sums = self.metric_sums(StepTerms(*grid, valid=prep.block_valid), loss_sum, prep.num_targets)
        return out

    def _flat_loss(self, model, prep: Prepared) -> LossOutput:
        lt, _, _ = self._row_terms(model, prep, dk=False)
        valid = prep.labels != IGNORE_INDEX
        nll = torch.where(valid, -lt, torch.zeros_like(lt)).sum()
        sums = {"objective": nll.detach(), "nll": nll.detach(), "targets": prep.num_targets}
        return LossOutput(nll, prep.num_targets, sums)

    @torch.no_grad()
    def metric_sums(self, terms: StepTerms, loss_sum: torch.Tensor, num_targets: int) -> dict:
        """Sums over target tokens (detached tensors; no host synchronisation): the training
        objective, the perplexity NLL and, with dk, ``E[S]`` and ``Pr(S=i)``."""
        valid = terms.valid
        lt, ld, lnd = (x.detach().float() for x in (terms.log_t, terms.log_d, terms.log_not_d))
        nll_fn = self.spec.eval_loss(self.method, terms.omega) if terms.omega is not None else self.eval_loss
        nll = nll_fn(lt, ld, lnd)
        zero = torch.zeros((), dtype=nll.dtype, device=nll.device)
        sums = {"objective": loss_sum.detach().float(),
                "nll": torch.where(valid, nll, zero).sum(),
                "targets": num_targets}
        if self.spec.has_dk:
            s = losses.stop_distribution(ld, lnd, terms.omega)
            s = torch.where(valid.unsqueeze(-1), s, torch.zeros_like(s))
            steps = torch.arange(1, s.shape[-1] + 1, dtype=s.dtype, device=s.device)
            sums["stop_step"] = (s * steps).sum()
            expected = (s * steps).sum(-1)  # E[S] per token
            sums["stop_step_sq"] = (expected * expected).sum()
            sums["stop_dist"] = s.sum(dim=tuple(range(s.dim() - 1)))
        return sums


class LossModule(torch.nn.Module):
    """The model and its objective as one module, so DDP/FSDP hooks see every forward.

    ``forward(prep)`` returns ``(loss_sum, sums)`` (plain containers, which the wrappers look
    through for tensors).
    """

    def __init__(self, model, objective: Objective):
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, prep: Prepared):
        out = self.objective.loss(self.model, prep)
        return out.loss_sum, out.sums


def merge_sums(total: dict, part: dict) -> dict:
    """Accumulate metric sums in place (tensors and numbers add; vectors add element-wise).

    A vector may be a tensor or, in sums that went through :func:`cyb.distributed.reduce_sums`
    (a checkpoint's window of steps not logged yet), a list: mixed, the list becomes a tensor."""
    for k, v in part.items():
        prev = total.get(k)
        if isinstance(prev, list) and isinstance(v, torch.Tensor):
            prev = torch.as_tensor(prev, dtype=v.dtype, device=v.device)
        elif isinstance(v, list) and isinstance(prev, torch.Tensor):
            v = torch.as_tensor(v, dtype=prev.dtype, device=prev.device)
        elif isinstance(v, list) and isinstance(prev, list):
            v = [a + b for a, b in zip(prev, v)]
            prev = None
        total[k] = v if prev is None else prev + v
    return total


def sums_to_python(sums: dict) -> dict:
    """Metric sums as floats (vectors as lists); synchronises with the device once."""
    out = {}
    for k, v in sums.items():
        if isinstance(v, torch.Tensor):
            v = v.detach().double().cpu()
            out[k] = v.tolist() if v.dim() else float(v)
        else:
            out[k] = v
    return out


def summarise(sums: dict) -> dict:
    """Per-token metrics from (python) sums.

    ``objective``: mean training loss per target token; ``loss``: mean NLL used for
    perplexity; ``ppl = exp(loss)``; with dk ``mean_steps`` (E[S] averaged over tokens),
    ``steps_std`` (its standard deviation over tokens) and ``stop_dist``; ``targets``: tokens
    counted.
    """
    sums = sums_to_python(sums)
    n = max(sums.get("targets", 0), 1)
    out = {"loss": sums.get("nll", 0.0) / n}
    if "objective" in sums:
        out["objective"] = sums["objective"] / n
    out["ppl"] = math.exp(min(out["loss"], 50.0))
    if "stop_step" in sums:
        out["mean_steps"] = sums["stop_step"] / n
        if "stop_step_sq" in sums:
            out["steps_std"] = math.sqrt(max(sums["stop_step_sq"] / n - out["mean_steps"] ** 2, 0.0))
        out["stop_dist"] = [x / n for x in sums["stop_dist"]]
    out["targets"] = int(sums.get("targets", 0))
    return out

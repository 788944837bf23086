"""Perplexity of every method from per-step readouts, and the relative improvement of appendix F.

Perplexity is ``exp(mean per-real-token loss)`` with the paper's evaluation loss of the method,
as its :class:`~cyb.methods.MethodSpec` gives it (:meth:`~cyb.methods.MethodSpec.perplexity_loss`):

* models with dk (CYB, CYB-VA, CYB-DP): the CYB loss with ``gamma = 1`` and the model's own
  stopping (``omega`` one-hot on ``M``);
* models without dk: cross-entropy at the readout step, the last one (TBYS; baselines have
  ``M = 1``).

Also reported: the loss under the run's training ``omega``/``gamma`` (CYB variants: the CYB
likelihood term with those settings, without CYB-VA/DP's KL penalties; TBYS: ``-log sum_i
omega_i t_i``), and the perplexity of reading out at each fixed step ``i`` (``-log t_i``).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .. import losses, methods


def ppl_of(mean_loss: float) -> float:
    """``exp(mean_loss)``; ``inf`` when it overflows."""
    return math.exp(mean_loss) if mean_loss < 700 else math.inf


def _mean(per_token: torch.Tensor) -> float:
    return float(per_token.double().mean()) if per_token.numel() else math.nan


def _entry(per_token: torch.Tensor) -> dict:
    loss = _mean(per_token)
    return {"loss": loss, "ppl": ppl_of(loss)}


def perplexity_summary(
    log_t: torch.Tensor,
    log_d: torch.Tensor,
    log_not_d: torch.Tensor,
    *,
    method: str,
    omega: Sequence[float] | None = None,
    gamma: Sequence[float] | None = None,
) -> dict:
    """Perplexities of ``N`` tokens from their per-step readout ``[N, M]``.

    Args:
        method: the name of the model's training method (its spec picks the loss).
        omega, gamma: the run's training world stop distribution and discount (length ``M``);
            when either applies (``gamma`` only with dk) a ``"train_setting"`` entry is added.

    Returns:
        ``{"loss", "ppl", "tokens", "readout", "by_step": [ppl reading out at step i, i=1..M],
        "train_setting": {"loss", "ppl", "omega", "gamma"} (optional)}``; losses are mean nats
        per real token.
    """
    if log_t.dim() != 2:
        raise ValueError(f"per-step readouts must be [N, M], got {tuple(log_t.shape)}")
    lt, ld, lnd = (x.double() for x in (log_t, log_d, log_not_d))
    spec = methods.spec(method)
    has_dk = spec.has_dk
    primary = spec.perplexity_loss(lt.shape[-1])(lt, ld, lnd)
    if has_dk:
        readout = "CYB loss, gamma = 1, the model's own stopping (omega one-hot on M)"
    else:
        readout = "cross-entropy at the last step" if lt.shape[-1] > 1 else "cross-entropy"
    out = {**_entry(primary), "tokens": int(lt.shape[0]), "readout": readout}
    out["by_step"] = [ppl_of(_mean(-lt[:, i])) for i in range(lt.shape[-1])]
    if omega is not None or (gamma is not None and has_dk):
        if has_dk:
            per = losses.cyb_loss(lt, ld, lnd, omega=omega, gamma=gamma)
        else:
            per = losses.tbys_loss(lt, omega=omega)
        out["train_setting"] = {**_entry(per), "omega": None if omega is None else [float(x) for x in omega],
                                "gamma": None if gamma is None or not has_dk else [float(x) for x in gamma]}
    return out


def relative_improvement(ppl: float, reference_ppl: float) -> float:
    """Appendix F: ``(PPL_ref - PPL) / PPL_ref * 100`` (percent; positive = better than the
    reference)."""
    if not (math.isfinite(reference_ppl) and reference_ppl > 0):
        raise ValueError(f"the reference perplexity must be a finite number > 0, got {reference_ppl!r}")
    return (reference_ppl - ppl) / reference_ppl * 100.0

"""The optimiser of a run: AdamW with its parameter groups, and the learning-rate schedule
(the paper's recipe: peak ``lr_alpha / sqrt(d_model)``, linear warmup, cosine decay to
``min_lr_ratio`` of the peak)."""

from __future__ import annotations

import math

import torch

from .config import RunConfig
from .model import gates
from .model.pause_adapters import NO_DECAY_ATTR


def peak_lr(cfg: RunConfig, d_model: int) -> float:
    """The configured LR, or the paper's ``lr_alpha / sqrt(d_model)``."""
    return cfg.optim.lr if cfg.optim.lr is not None else cfg.optim.lr_alpha / math.sqrt(d_model)


def lr_factor(step: int, *, warmup: int, total: int, min_ratio: float) -> float:
    """LR multiplier of optimiser step ``step`` (counted from 0).

    Linear warmup ``(step + 1) / warmup`` over the first ``warmup`` steps, then cosine decay
    from 1 at ``step = warmup`` to ``min_ratio`` at ``step = total``.
    """
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    span = max(total - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: torch.nn.Module, cfg: RunConfig, lr: float):
    """AdamW with decoupled weight decay on matrices only, through torch's fused kernel on every
    device (on the CPU the others take the second moment's square root from MKL, whose last bits
    follow the CPU's approximate reciprocal square root, so another CPU model would train other
    weights: docs/record/benchmarks/cpu.md, "CPU numerics").  Not on the embedding of a frozen base
    (:func:`cyb.model.pause_adapters.freeze_base`), whose other rows must stay as they are; the
    gates of a gated pause layout (:mod:`cyb.model.gates`) in a group of their own at
    ``method.pause_gate_lr``."""
    gate_ids = {id(p) for p in gates.gate_parameters(model)}
    decay, no_decay, gate = [], [], []
    for p in model.parameters():
        if p.requires_grad:
            matrix = p.dim() >= 2 and not getattr(p, NO_DECAY_ATTR, False)  # a frozen base's embedding: rows only
            (gate if id(p) in gate_ids else decay if matrix else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.optim.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if gate:
        groups.append({"params": gate, "weight_decay": 0.0, "lr": cfg.method.pause_gate_lr})
    return torch.optim.AdamW(groups, lr=lr, betas=(cfg.optim.beta1, cfg.optim.beta2),
                             eps=cfg.optim.eps, fused=True)


__all__ = ["build_optimizer", "lr_factor", "peak_lr"]

"""Run a pause model over held-out batches and keep the per-token readout.

Batches are laid out as in training (:meth:`cyb.objective.Objective.prepare`) but always with
Recipe 1 (``M-1`` pauses after every token, the paper's inference), and read out per step
without keeping logits: the fused chunked readout on CUDA (``impl="auto"``), the plain readout
elsewhere.  Only ``[B, L, M]`` tensors are moved to the CPU.
"""

from __future__ import annotations

import dataclasses
import math
import sys

from typing import Iterable

import torch

from ..analysis.records import RecordCollector, TokenRecords
from ..config import MethodConfig
from ..layout import collapse
from ..objective import Objective, run_model, use_fused
from ..readout import readout
from ..runtime import autocast
from ..train import EVAL_SEED_STEP, row_seed

IMPLS = ("auto", "fused", "naive")
PRECISIONS = ("auto", "bf16", "fp32")


def _block_terms(model, prep, vocab, dk_bias: float, fused: bool):
    """``(log_t, log_d, log_not_d)`` as ``[B, L, M]`` of a prepared block batch."""
    hidden = run_model(model, prep)
    b, t, h = hidden.shape
    if fused:
        from ..kernels import fused_readout

        weight, bias = model.output_projection()
        flat = hidden.reshape(-1, h)
        if flat.dtype != weight.dtype:
            flat = flat.to(weight.dtype)
        terms = fused_readout(flat, weight, prep.labels.reshape(-1), dk_id=vocab.dk_id, dk_bias=dk_bias,
                              bias=bias, softcap=model.final_logit_softcap)
        terms = [x.view(b, t) for x in terms]
    else:
        terms = readout(model.logits(hidden), prep.labels, dk_id=vocab.dk_id, dk_bias=dk_bias)
    return [collapse(x, vocab.num_steps) for x in terms]


@torch.no_grad()
def collect_records(
    model,
    method: MethodConfig,
    batches: Iterable[dict],
    *,
    max_tokens: int | None = None,
    precision: str = "auto",
    impl: str = "auto",
    progress: bool = True,
    num_passages: int = 3,
    passage_tokens: int = 256,
    seed: int = 0,
    desc: str = "eval",
) -> TokenRecords:
    """Per-token readout of ``model`` on ``batches`` until ``max_tokens`` tokens are seen.

    Args:
        model: a :class:`~cyb.model.PauseModel` (in eval mode, on its device).
        method: the run's method; its layout (pauses, positions) is used with Recipe 1.
            ``tbys_original`` keeps its pause layout (random places seeded by ``seed``, or
            after the prompt), read out where a real token is next.
        batches: dicts of CPU tensors ``ids [B, L]`` (and optional ``attention_mask``,
            ``loss_mask``).
        max_tokens: stop after the batch that reaches this many evaluated tokens (None: all).
            Whole batches are used, so the count can exceed it by less than one batch.
        precision: ``"auto"`` (bf16 autocast on CUDA), ``"bf16"`` or ``"fp32"``.
        impl: ``"auto"`` (fused readout on CUDA), ``"fused"`` or ``"naive"`` (full logits of
            one batch).
        progress: show a progress bar (tokens, running perplexity).
        num_passages, passage_tokens: passages kept for shaded text.
        seed: the run's seed (``train.seed``); row ``r`` of the data gets the random layout
            the training loop gives held-out row ``r``.
        desc: the progress bar's label.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    device = model.device
    vocab = model.vocab
    method = dataclasses.replace(method, recipe=1)
    objective = Objective(method, vocab, model.dk_bias, impl)
    fused = use_fused(impl, device)
    flat = method.spec.layout == "inserted"
    has_dk = vocab.dk_id is not None
    collector = RecordCollector(1 if flat else vocab.num_steps, has_dk=has_dk,
                                num_passages=0 if flat else num_passages, passage_tokens=passage_tokens)
    rows_seen = 0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        # a bar on a terminal only: log files get no carriage-return noise
        bar = tqdm(total=max_tokens, desc=desc, unit="tok", dynamic_ncols=True,
                   disable=not getattr(sys.stderr, "isatty", lambda: False)())
    nll = 0.0
    model.eval()
    try:
        for batch in batches:
            rows = int(batch["ids"].shape[0])
            # One seed per row, as the training loop seeds its held-out rows (tbys_original's
            # random layout), whatever the batch size.
            seeds = [row_seed(seed, EVAL_SEED_STEP, rows_seen + r) for r in range(rows)]
            rows_seen += rows
            prep = objective.prepare({k: v.cpu() for k, v in batch.items()}, seeds=seeds).to(device)
            batch = {k: v.to(device) for k, v in batch.items()}
            with autocast(device, precision):
                if flat:
                    hidden = run_model(model, prep)
                    lt = readout(model.logits(hidden), prep.labels)[0]
                    n = collector.add_flat(prep.input_ids, prep.labels, lt, rows=rows)
                    nll -= float(lt[prep.labels != -100].double().sum())
                else:
                    lt, ld, lnd = _block_terms(model, prep, vocab, model.dk_bias, fused)
                    valid = prep.block_valid
                    block_labels = collapse(prep.labels, vocab.num_steps)[..., 0]
                    n = collector.add_blocks(batch["ids"], valid, block_labels, lt, ld, lnd,
                                             attention_mask=batch.get("attention_mask"))
                    nll += float(objective.eval_loss(lt.float(), ld.float(), lnd.float())[valid].double().sum())
            if bar is not None:
                bar.update(n)
                if collector.tokens:
                    bar.set_postfix(ppl=f"{math.exp(min(nll / collector.tokens, 50.0)):.3f}")
            if max_tokens is not None and collector.tokens >= max_tokens:
                break
    finally:
        if bar is not None:
            bar.close()
    return collector.finish()

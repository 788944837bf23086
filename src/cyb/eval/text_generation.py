"""Continuations of held-out text (``cyb eval RUN --generate N`` of a text run): what a token costs
when the model writes it, through the engine, rather than when it is teacher-forced.

Each of the first ``N`` held-out rows of the evaluation gives a prompt: its first
:data:`PROMPT_TOKENS` tokens (at most half the row).  The model continues every prompt by
:data:`NEW_TOKENS` tokens (an end-of-sequence token does not stop it), greedily, in fixed mode
(every token read out at step M: M positions a token) and, for a model with ``<don't know>``, in
adaptive mode (a pause only after dk: a token costs one position and each pause one more).  Per
mode: the positions per new token and the seconds it took; and the share of adaptive
continuations that are the fixed ones token for token (under private pauses adaptive decoding
reads what training read, so they differ only at near ties; under shared pauses the tokens after
a skipped pause read contexts Recipe 1 training never showed).
"""

from __future__ import annotations

import time
from typing import Iterable

#: a prompt's tokens at most (and at most half its held-out row)
PROMPT_TOKENS = 128
#: new tokens per prompt
NEW_TOKENS = 64


def held_out_prompts(batches: Iterable[dict], count: int, prompt_tokens: int = PROMPT_TOKENS) -> list[list[int]]:
    """The first ``prompt_tokens`` token ids (at most half the row's real tokens) of each of the
    first ``count`` rows of ``batches`` (the evaluation's ``{"ids", "attention_mask"?}``)."""
    out: list[list[int]] = []
    for batch in batches:
        ids, mask = batch["ids"], batch.get("attention_mask")
        for r in range(ids.shape[0]):
            real = int(mask[r].sum()) if mask is not None else ids.shape[1]
            take = min(prompt_tokens, real // 2)
            if take >= 1:
                out.append(ids[r, :take].tolist())
            if len(out) == count:
                return out
    return out


def score_text_generation(model, prompts: list[list[int]], *, new_tokens: int = NEW_TOKENS,
                          max_batch: int = 128) -> dict:
    """``{"prompts", "prompt_tokens", "new_tokens", "fixed": {...}, "adaptive": {...}}`` (adaptive
    only for a model with dk), each mode ``{"positions_per_token", "pauses_per_token", "seconds"}``
    and adaptive also ``"same_as_fixed"`` (see the module docstring)."""
    from ..generation import generate

    if not prompts:
        raise ValueError("no held-out row to take a prompt from")
    m = model.num_steps
    modes = ("fixed", "adaptive") if model.vocab.dk_id is not None else ("fixed",)
    out: dict = {"prompts": len(prompts), "prompt_tokens": sum(map(len, prompts)) / len(prompts),
                 "new_tokens": new_tokens}
    continuations = {}
    for mode in modes:
        t0 = time.perf_counter()
        results = generate(model, prompts, mode=mode, max_new_tokens=new_tokens, eos_token_ids=(),
                           max_batch=max_batch)
        seconds = time.perf_counter() - t0
        tokens = sum(len(r.steps) for r in results)
        used = tokens * m if mode == "fixed" else sum(sum(r.steps) for r in results)
        out[mode] = {"positions_per_token": used / tokens, "pauses_per_token": used / tokens - 1, "seconds": seconds}
        continuations[mode] = [r.token_ids for r in results]
    if "adaptive" in out:
        same = sum(a == f for a, f in zip(continuations["adaptive"], continuations["fixed"]))
        out["adaptive"]["same_as_fixed"] = same / len(prompts)
    return out


def format_text_generation(g: dict) -> str:
    """The summary's lines of :func:`score_text_generation`'s result."""
    lines = [f"generation: {g['new_tokens']} tokens after the first {g['prompt_tokens']:.0f} tokens (mean) of "
             f"{g['prompts']} held-out rows, greedy"]
    for mode in ("fixed", "adaptive"):
        if mode in g:
            line = f"  {mode} mode: {g[mode]['positions_per_token']:.2f} positions per token"
            if "same_as_fixed" in g[mode]:
                line += f", {g[mode]['same_as_fixed']:.1%} of the continuations as in fixed mode"
            lines.append(line)
    return "\n".join(lines)


__all__ = ["NEW_TOKENS", "PROMPT_TOKENS", "format_text_generation", "held_out_prompts", "score_text_generation"]

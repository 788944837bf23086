"""The anchor of the size benchmark: transformers' own continuous batching (its paged cache and
scheduler, ``ContinuousBatchingManager``) on the same requests, without pauses.

Its manager is entered through ``model.continuous_batching_context_manager`` (it warms up, that
is captures its CUDA graphs, before the timed part), every request is added at once with its own
answer length and EOS off, and the timed part runs from the first request added to the last
result.  Each request records its tokens' times: the time to first token (from its creation) and
the gap before each later token.  Fields of ``ContinuousBatchingConfig`` and arguments of
``add_request`` that the installed transformers lacks are left out (its API moved between 5.17
and 5.25); what was set is in ``config``.
"""

from __future__ import annotations

import dataclasses
import inspect
import time

from .load import percentile
from .timing import sync


def _cb_config(**wanted):
    """``(ContinuousBatchingConfig or None, the fields set)``: those of ``wanted`` it has."""
    try:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError:
        return None, {}
    known = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    given = {k: v for k, v in wanted.items() if k in known and v is not None}
    return ContinuousBatchingConfig(**given), given


def _blocks(hf_model, cache_bytes: int | None) -> int | None:
    """Blocks of transformers' paged cache that ``cache_bytes`` hold: a block keeps a page of
    ``page_size`` tokens (``block_size`` before 5.17) in every layer."""
    if cache_bytes is None:
        return None
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from ..engine.cache import kv_shape

    fields = {f.name: f.default for f in dataclasses.fields(ContinuousBatchingConfig)}
    page = fields.get("page_size") or fields.get("block_size") or 256
    layers, kv_heads, head_dim = kv_shape(hf_model)  # (it reads only the config)
    per_token = 2 * layers * kv_heads * head_dim * hf_model.dtype.itemsize
    return max(1, int(cache_bytes // (page * per_token)))


def _attention(current: str, flash: bool) -> str:
    """The attention implementation to enter continuous batching with: sdpa for cyb's pause
    attention.  Without ``flash``, where the manager has no ``auto_switch_to_flash`` (before 5.2x)
    it switches to flash attention wherever it finds it, the hub's kernels included, unless the
    implementation is already paged: there ``paged|sdpa``."""
    if flash:
        return current if current in ("sdpa", "eager") or "flash" in str(current) else "sdpa"
    try:
        from transformers.generation.continuous_batching import ContinuousBatchingManager

        params = inspect.signature(ContinuousBatchingManager.switch_to_cb_friendly_attn).parameters
    except (ImportError, AttributeError, ValueError):
        return "sdpa"
    return "sdpa" if "auto_switch_to_flash" in params else "paged|sdpa"


def continuous_batching(hf_model, items, *, concurrency: int, cache_bytes: int | None = None,
                        max_batch_tokens: int | None = None, flash: bool = False, prefix_sharing: bool = True,
                        timeout_s: float = 600.0) -> dict:
    """``items`` (``(prompt ids, answer length)``) through transformers' continuous batching of
    ``hf_model`` (greedy, EOS off), at most ``concurrency`` requests a batch, its cache as many
    blocks as ``cache_bytes`` hold (None: its default, a share of the free memory), at most
    ``max_batch_tokens`` a forward (None: its default); ``flash``: let it switch to flash
    attention where installed (else it keeps the model's sdpa); ``prefix_sharing``: its block
    sharing.  A model that attends through cyb's pause attention (a :class:`cyb.PauseModel` wrapped
    it) runs with plain sdpa here, the same kernel without pauses; its implementation is put back
    after.

    In the result, ``failed`` counts requests that ended with an error or the wrong length,
    ``unfinished`` those with no result when ``timeout_s`` ran out (``timed_out``) or the loop
    stopped; tokens per second count the finished ones."""
    from transformers import GenerationConfig

    config, given = _cb_config(max_requests_per_batch=concurrency, num_blocks=_blocks(hf_model, cache_bytes),
                               max_batch_tokens=max_batch_tokens, auto_switch_to_flash=flash,
                               allow_block_sharing=prefix_sharing, seed=0)
    gen = GenerationConfig(do_sample=False, max_new_tokens=max(n for _, n in items))
    gen.eos_token_id = -1  # no end: every answer decodes to its length
    attn_before = hf_model.config._attn_implementation
    enter = hf_model.continuous_batching_context_manager
    kwargs = {"generation_config": gen, "block": True, "timeout": 10}
    if config is not None and "continuous_batching_config" in inspect.signature(enter).parameters:
        kwargs["continuous_batching_config"] = config
    results: dict[str, object] = {}
    try:
        wanted = _attention(attn_before, flash)
        if wanted != attn_before:
            hf_model.set_attn_implementation(wanted)
        t_warm = time.perf_counter()
        with enter(**kwargs) as manager:
            warm_s = time.perf_counter() - t_warm
            add_params = inspect.signature(manager.add_request).parameters
            extra = {"record_timestamps": True} if "record_timestamps" in add_params else {}
            if "eos_token_id" in add_params:
                extra["eos_token_id"] = -1
            attn_used = hf_model.config._attn_implementation
            sync(hf_model.device)
            t0 = time.perf_counter()
            ids = [manager.add_request(list(p), max_new_tokens=n, **extra) for p, n in items]
            deadline = t0 + timeout_s
            while len(results) < len(ids) and time.perf_counter() < deadline:
                r = manager.get_result(timeout=1)
                if r is None:
                    if not manager.is_running():
                        break
                    continue
                if r.is_finished():
                    results[r.request_id] = r
            sync(hf_model.device)
            seconds = time.perf_counter() - t0
    finally:
        if hf_model.config._attn_implementation != attn_before:
            hf_model.set_attn_implementation(attn_before)
    ttft, gaps, failed, unfinished, tokens = [], [], 0, 0, 0
    for rid, (_, n) in zip(ids, items):
        r = results.get(rid)
        if r is None:  # not done when the time ran out (or the loop stopped)
            unfinished += 1
            continue
        if r.error is not None or len(r.generated_tokens) != n:
            failed += 1
        tokens += len(r.generated_tokens)
        stamps = getattr(r, "timestamps", None) or []
        if stamps:
            ttft.append((stamps[0] - r.created_time) * 1e3)
            gaps += [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:])]
    out = {"seconds": seconds, "warm_up_s": warm_s, "requests": len(items), "finished": len(results),
           "failed": failed, "unfinished": unfinished, "timed_out": unfinished > 0 and seconds >= timeout_s,
           "real_tokens": tokens, "real_tokens_per_s": tokens / seconds if seconds > 0 else None,
           "attn_implementation": attn_used, "config": {k: v for k, v in given.items()},
           "ttft_ms_p50": percentile(ttft, 50), "ttft_ms_p99": percentile(ttft, 99),
           "itl_ms_p50": percentile(gaps, 50), "itl_ms_p99": percentile(gaps, 99)}
    if out["itl_ms_p50"]:
        out["itl_p99_over_p50"] = out["itl_ms_p99"] / out["itl_ms_p50"]
    return out


__all__ = ["continuous_batching"]

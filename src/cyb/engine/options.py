"""How an engine runs: :class:`EngineOptions` (checked once), and the choices made from the
model: whether the engine runs it, positions per step, the default cache memory."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model import hf

POSITIONS = ("auto", "one", "block")
#: block sizes the engine's cache takes (powers of two)
BLOCK_SIZES = (1, 256)


def _int_at_least(name: str, value, low: int, note: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}{note}, got {value!r}")


@dataclass(frozen=True)
class EngineOptions:
    """How an engine runs (defaults are the library's).

    Attributes:
        max_slots: rows that decode at once at most.  A slot costs only the cache blocks its
            row holds.
        cache_bytes: memory for the KV cache's blocks; None: 60% of the free memory on CUDA,
            2 GiB elsewhere.  The pool is never larger than what ``max_slots`` rows of the
            engine's capacity hold.
        cache_blocks: blocks of the KV cache (the null block not counted); None: what
            ``cache_bytes`` holds.  At least one row of the engine's capacity must fit.
        block_size: columns per cache block, a power of two from 1 to 256.  Row attention reads
            blocks of 16 or more through the block tables; smaller blocks are gathered for it.
        prefix_caching: share the full blocks of prompt columns between requests whose prompts
            begin alike (a prefix cached once is not computed again; cached blocks are evicted
            least recently used first when the cache runs out).  None: on.  It changes no token:
            a cached block's keys and values are a function of the columns before it and its
            own, which its key stands for (:func:`cyb.engine.blocks.block_hashes`), and of their
            positions, which follow from the block's index.  (In bf16 a prefix computed in
            another request's forward may differ from the row's own in the last bits, as rows
            batched differently do.)
        positions: positions each row feeds per step: ``"one"``, ``"block"`` (``M``: the token
            and all its pauses; adaptive rows keep the steps up to their stop) or ``"auto"``
            (:func:`cyb.engine.choose_positions`).
        prefill_chunk: prompt columns one row writes per prefill forward at most.  On an H200
            (134 M model, a mixed load) chunks of 2048 made continuous batching with shared
            pauses 1.29x faster than chunks of 512: a shared prompt of up to 512 tokens then
            prefills in one graphed forward (``benchmarks/engine_traffic.py``).
        prefill_rows: a prefill forward computes at most ``prefill_rows x prefill_chunk``
            positions, padding included (rows are padded to the longest chunk among them, and
            where prefill runs from CUDA graphs, to its graph's shape).  While rows decode, every
            one of them waits for that forward: on an H200 (134 M model, 256 rows of a mixed
            load) 4,096 positions per forward held the p99 gap between tokens at 2.9x its median
            where 8,192 gave 4.3x, at the same throughput (``benchmarks/engine_gaps.py``).
        step_budget: positions per decoding step, prompt chunks included: while rows decode,
            waiting prompts are written inside the decoding steps (one forward carries the
            decoding rows' positions and chunks of prompts, up to this many positions, at least
            :data:`MIN_MIXED_CHUNK` of prompts), so that a long prompt delays a decoding row by
            at most one such step.  Mixed steps run without CUDA graphs, and need row attention
            (every pause layout; under gated pauses each prompt position's own pauses get no
            gate, as in a prefill forward).  None: prompts are written by prefill forwards of
            their own between decoding steps (``prefill_chunk``, ``prefill_rows``).
        refill: while rows decode, waiting prompts start in groups of this many (as many as
            free slots and waiting prompts allow; 0: an eighth of the slots in use), written by
            a few large prefill forwards; 1 starts each prompt as soon as a slot is free (more
            and smaller prefill forwards: a mixed load decodes at about half the rate).
        refill_wait: a smaller group starts once a prompt could have started for this many
            steps (the time to first token a group may add, in decoding steps).
        cuda_graph: capture decoding steps as CUDA graphs (None: on CUDA).
        attention_bucket: with CUDA graphs and attention through the mask, attention covers the
            columns in use rounded up to a multiple of this (one graph each), for batches of
            ``bucket_min_rows`` rows or more; smaller ones cover the whole capacity.  Without
            graphs it covers the columns in use rounded up to 16.
        capacity_multiple: columns per row (the block tables' length) are rounded up to a
            multiple of this and of ``block_size``.
        row_attention: decoding steps attend over each row's own columns through a Triton kernel
            (a step costs the columns its rows hold, and one CUDA graph serves every length);
            None: on CUDA where the model allows it (:func:`cyb.engine.runner.row_attention_reason`),
            False: through the mask, up to the attention limit above.
        fused: decoding steps and graphed prefill forwards run the model's norms, gated MLPs and
            rotary embedding compiled into fused kernels (:mod:`cyb.engine.fused`; on an H200 a
            token of a 134 M model at batch 1 took 0.85 ms where it took 1.41); None: where steps
            are CUDA graphs.
        read_at: an ablation: every token is read out at this step, whatever the model's dk
            says (1: no pause taken, the pauses removed at inference; ``M``: every pause taken;
            the reported ``d`` stays the model's own, fixed-mode rows still feed all pauses);
            None: the model's own decisions.
    """

    max_slots: int = 256
    cache_bytes: int | None = None
    cache_blocks: int | None = None
    block_size: int = 16
    prefix_caching: bool | None = None
    positions: str = "auto"
    prefill_chunk: int = 2048
    prefill_rows: int = 2
    step_budget: int | None = None
    refill: int = 0
    refill_wait: int = 16
    cuda_graph: bool | None = None
    attention_bucket: int = 256
    bucket_min_rows: int = 8
    capacity_multiple: int = 128
    row_attention: bool | None = None
    fused: bool | None = None
    read_at: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_slots", "prefill_chunk", "prefill_rows", "attention_bucket", "bucket_min_rows",
                     "capacity_multiple"):
            _int_at_least(name, getattr(self, name), 1)
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        _int_at_least("refill", self.refill, 0, " (0: an eighth of the slots in use)")
        _int_at_least("refill_wait", self.refill_wait, 0, " (steps)")
        if self.read_at is not None:
            _int_at_least("read_at", self.read_at, 1, " (a step) or None")
        for name in ("row_attention", "fused", "prefix_caching"):
            if not isinstance(getattr(self, name), (bool, type(None))):
                raise ValueError(f"{name} must be True, False or None, got {getattr(self, name)!r}")
        if self.cache_bytes is not None and (not isinstance(self.cache_bytes, int) or self.cache_bytes < 1):
            raise ValueError(f"cache_bytes must be a positive integer or None, got {self.cache_bytes!r}")
        if self.step_budget is not None:
            _int_at_least("step_budget", self.step_budget, 1, " (positions) or None")
        if self.cache_blocks is not None:
            _int_at_least("cache_blocks", self.cache_blocks, 1, " or None")
        low, high = BLOCK_SIZES
        b = self.block_size
        if isinstance(b, bool) or not isinstance(b, int) or not low <= b <= high or b & (b - 1):
            raise ValueError(f"block_size must be a power of two from {low} to {high}, got {b!r}")


#: the fewest prompt positions a mixed step carries while prompts wait (however many positions
#: its decoding rows take of ``step_budget``)
MIN_MIXED_CHUNK = 64
#: without CUDA graphs attention covers the columns in use rounded up to this
EAGER_BUCKET = 16
#: on CUDA, adaptive decoding of at most this many rows feeds whole blocks: a forward of M
#: positions costs about what one of a single position costs there (on an H100, 134 M model:
#: blocks as fast or faster up to 32 rows at E[S] 1.1 and 1.9; from 256 rows one position per
#: step was 1.4x faster at E[S] 1.1, blocks 1.2x faster at E[S] 1.9; docs/record/benchmarks/decoding.md)
BLOCK_MAX_ROWS = 32


def unsupported_reason(model) -> str | None:
    """Why the engine cannot run ``model`` (a :class:`cyb.PauseModel`), or None."""
    impl = hf.attention_of(model.hf_model)
    if impl not in (None, "sdpa", "eager", hf.PAUSE_ATTENTION):
        return f"the engine needs sdpa or eager attention, the model uses {impl!r}"
    return None


def choose_positions(model, modes, rows: int, choice: str = "auto") -> int:
    """Positions per row per step: ``M`` when every request is fixed mode (it feeds every
    pause anyway) or, on CUDA, for at most :data:`BLOCK_MAX_ROWS` rows; else 1."""
    m = model.vocab.num_steps
    if choice == "one":
        return 1
    if choice == "block" or m == 1:
        return m
    if all(mode == "fixed" for mode in modes):
        return m
    return m if model.device.type == "cuda" and rows <= BLOCK_MAX_ROWS else 1


def default_cache_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.6)
    return 2 << 30


__all__ = ["BLOCK_MAX_ROWS", "BLOCK_SIZES", "EngineOptions", "MIN_MIXED_CHUNK", "POSITIONS", "choose_positions",
           "default_cache_bytes", "unsupported_reason"]

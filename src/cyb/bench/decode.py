"""Decode benchmark: per-real-token latency (batch 1) and throughput (batch 32), M = 4 vs M = 1.

One model, two pause settings on the same weights: fixed mode with ``M`` steps per token (a
CYB model: ``M - 1`` pauses, dk) and ``M = 1`` (no pauses).  Implementations:

* ``hf_eager``: a plain Hugging Face loop -- the causal LM's forward with a ``DynamicCache``,
  ``M`` new positions per step (the token and ``M - 1`` pause ids, default positions), argmax of
  the last logits.  The reference for "eager HF per-step latency".
* ``cyb_eager``: :class:`cyb.generation.decoders.FixedDecoder` (the library's decode loop:
  explicit positions and mask, ``DynamicCache``, sequential readout).
* ``cyb_graph``: :class:`cyb.generation.static.StaticFixedDecoder` (preallocated KV cache, the
  decode step captured as a CUDA graph on CUDA; on CPU it runs the same step eagerly and the row
  is called ``cyb_static``).

Every step reads the decided tokens back to the host (as a streaming generator must), and is
timed on the host clock.  A real token per row per step, so the per-real-token latency is the
step time and throughput is ``batch / step time``.  Greedy outputs of ``cyb_graph`` are checked
against ``cyb_eager``: in float32 on prompts with left padding (must be equal), and on the timed
bf16 runs (reported; bf16 rounding may flip near-ties).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass

import torch

from .models import DTYPES, SHAPE_134M, SHAPE_TINY, ModelShape, build_hf_model, random_ids
from .models import real_ids_limit, wrap
from ..runtime import resolve_device
from .timing import Budget, environment, free_memory, guarded, median, sync
from .timing import write_json

IMPLS = ("hf_eager", "cyb_eager", "cyb_graph")
#: Anchor: eager Hugging Face decode, batch 1, 1 new position per step, one H200 (ms).
HF_EAGER_ANCHOR_MS = 8.4


@dataclass
class DecodeBenchConfig:
    """What to measure."""

    shape: ModelShape = SHAPE_134M
    vocab: int = 32768
    num_steps: int = 4
    batches: tuple = (1, 32)
    prompt_len: int = 128
    new_tokens: int = 64
    warmup_steps: int = 3
    impls: tuple = IMPLS
    dtype: str = "bf16"
    check_tokens: int = 24
    device: str | None = None
    budget_s: float | None = None
    seed: int = 0

    @classmethod
    def quick(cls, **overrides) -> "DecodeBenchConfig":
        """Tiny shapes on CPU in float32 (a smoke run)."""
        base = dict(shape=SHAPE_TINY, vocab=256, batches=(1, 4), prompt_len=8, new_tokens=6,
                    warmup_steps=1, dtype="fp32", check_tokens=6, device="cpu")
        base.update(overrides)
        return cls(**base)

    def validate(self) -> "DecodeBenchConfig":
        bad = [i for i in self.impls if i not in IMPLS]
        if bad:
            raise ValueError(f"impls: unknown {bad}; choose from {IMPLS}")
        if self.num_steps < 2:
            raise ValueError(f"num_steps (M) must be >= 2, got {self.num_steps}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        for name in ("prompt_len", "new_tokens", "check_tokens"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name} must be >= 2, got {getattr(self, name)}")
        if not self.batches or min(self.batches) < 1:
            raise ValueError(f"batches must be >= 1, got {list(self.batches)}")
        return self

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["shape"] = self.shape.to_dict()
        d["batches"], d["impls"] = list(self.batches), list(self.impls)
        return d


# -------------------------------------------------------------------------- decode loops


def _timed_steps(step, n: int) -> tuple[list[float], list[list[int]]]:
    """``n`` calls of ``step() -> token tensor [B]``, each read back; host times in ms."""
    times, tokens = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        tok = step().tolist()
        times.append((time.perf_counter() - t0) * 1e3)
        tokens.append(tok)
    return times, tokens


def hf_eager_loop(hf_model, ids: torch.Tensor, pause_ids: list[int], steps: int) -> dict:
    """Plain Hugging Face decoding: the last token and ``pause_ids`` (``M`` new positions) per
    step, default positions, greedy on the last position's logits."""
    from ..model import hf

    arg = hf.cache_arg_name(hf_model)
    cache = _new_cache(hf_model)
    t0 = time.perf_counter()
    out = hf_model(input_ids=ids, use_cache=True, **{arg: cache})
    state = {"token": out.logits[:, -1].argmax(-1), "cache": cache}
    first = state["token"].tolist()
    prefill_ms = (time.perf_counter() - t0) * 1e3
    tail = torch.tensor(pause_ids, dtype=torch.long, device=ids.device)
    tail = tail.unsqueeze(0).expand(ids.shape[0], -1)

    def step():
        feed = torch.cat([state["token"].unsqueeze(1), tail], dim=1)
        o = hf_model(input_ids=feed, use_cache=True, **{arg: state["cache"]})
        state["token"] = o.logits[:, -1].argmax(-1)
        return state["token"]

    times, tokens = _timed_steps(step, steps)
    return {"prefill_ms": prefill_ms, "times": times, "tokens": [first] + tokens}


def _new_cache(hf_model):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=hf_model.config)
    except TypeError:
        return DynamicCache()


def cyb_loop(model, ids, mask, steps: int, *, static: bool, cuda_graph: bool | None = None) -> dict:
    """The library's fixed-mode decoder (``static=False``) or the static one."""
    from ..generation.decoders import FixedDecoder, StepReadout
    from ..generation.static import StaticFixedDecoder

    device = ids.device
    if static:
        dec = StaticFixedDecoder(model, ids, mask, max_new_tokens=steps + 1, cuda_graph=cuda_graph)
    else:
        dec = FixedDecoder(model, ids, mask, StepReadout(model.vocab, model.dk_bias))
    t0 = time.perf_counter()
    first = dec.start().token.tolist()
    prefill_ms = (time.perf_counter() - t0) * 1e3
    capture_ms = None
    if static and dec.use_graph:
        t0 = time.perf_counter()
        dec.capture()
        sync(device)
        capture_ms = (time.perf_counter() - t0) * 1e3
    times, tokens = _timed_steps(lambda: dec.step().token, steps)
    return {"prefill_ms": prefill_ms, "capture_ms": capture_ms, "times": times,
            "tokens": [first] + tokens}


# ------------------------------------------------------------------------------ benchmark


def _summary(res: dict, batch: int, warmup: int) -> dict:
    times = res["times"][warmup:]
    mean = sum(times) / len(times)
    med = median(times)
    return {"prefill_ms": res["prefill_ms"], "capture_ms": res.get("capture_ms"),
            "step_ms": med, "step_ms_mean": mean, "step_ms_all": times,
            "per_real_token_ms": med, "real_tokens_per_s": batch * 1e3 / mean,
            "steps_timed": len(times)}


def _compare(a: list[list[int]], b: list[list[int]]) -> dict:
    """Agreement of two ``[steps][B]`` token streams."""
    flat_a = [t for step in a for t in step]
    flat_b = [t for step in b for t in step]
    n = min(len(flat_a), len(flat_b))
    same = sum(x == y for x, y in zip(flat_a[:n], flat_b[:n]))
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return {"equal": flat_a == flat_b, "match_fraction": same / max(n, 1),
            "first_mismatch_step": first}


@torch.no_grad()
def spread_weights(hf_model, seed: int = 0) -> None:
    """Redraw every matrix with std ``2 / sqrt(fan_in)``: a freshly initialised model repeats
    its input token, which would make greedy comparisons trivially equal."""
    g = torch.Generator().manual_seed(seed)
    for p in hf_model.parameters():
        if p.dim() == 2:
            p.copy_(torch.randn(p.shape, generator=g) * (2.0 / p.shape[1] ** 0.5))


def greedy_check(hf_model, cfg: DecodeBenchConfig, device) -> dict:
    """float32: static (graph on CUDA) vs library decoder, left-padded prompts, M and 1."""
    from ..generation.static import StaticFixedDecoder, greedy_tokens
    from ..generation.decoders import FixedDecoder, StepReadout

    model32 = copy.deepcopy(hf_model).float().eval()
    out = {}
    try:
        limit = real_ids_limit(cfg.vocab, cfg.num_steps)
        ids = random_ids(2, cfg.prompt_len, limit, seed=cfg.seed + 7).to(device)
        mask = torch.ones_like(ids)
        mask[1, : cfg.prompt_len // 2] = 0  # left padding in the second row
        for method, m in (("cyb", cfg.num_steps), ("baseline", 1)):
            pm = wrap(model32, method, m)
            with torch.inference_mode():
                ref = greedy_tokens(FixedDecoder(pm, ids, mask, StepReadout(pm.vocab, pm.dk_bias)),
                                    cfg.check_tokens)
                got = greedy_tokens(StaticFixedDecoder(pm, ids, mask, max_new_tokens=cfg.check_tokens),
                                    cfg.check_tokens)
            out[f"M={m}"] = {"equal": ref == got, "tokens": cfg.check_tokens, "rows": 2,
                             "reference": ref, "static": got}
    finally:
        del model32
        free_memory(device)
    out["equal"] = all(v["equal"] for k, v in out.items() if k.startswith("M="))
    return out


def run(cfg: DecodeBenchConfig, *, out=None, log=print) -> dict:
    """Run the decode benchmark; returns (and writes to ``out`` after every row) the result."""
    cfg.validate()
    device = resolve_device(cfg.device, what="--device")
    budget = Budget(cfg.budget_s)
    dtype = DTYPES[cfg.dtype]
    result = {"kind": "decode", "env": environment(device), "config": cfg.to_dict(),
              "anchor_hf_eager_ms": HF_EAGER_ANCHOR_MS, "results": []}
    rows = result["results"]
    graph_name = "cyb_graph" if device.type == "cuda" else "cyb_static"
    m_big = cfg.num_steps
    total = cfg.warmup_steps + cfg.new_tokens
    max_pos = (cfg.prompt_len + total + 2) * m_big + 16
    hf_model = build_hf_model(cfg.shape, cfg.vocab, dtype=dtype, device=device,
                              max_positions=max_pos, seed=cfg.seed).eval()
    spread_weights(hf_model, cfg.seed)
    models = {m_big: wrap(hf_model, "cyb", m_big), 1: wrap(hf_model, "baseline", 1)}
    pause_ids = {m_big: list(models[m_big].vocab.pause_ids), 1: []}

    # Eager rows first, then the CUDA-graph rows, then the float32 check (which captures graphs
    # too): a failed capture cannot spoil the eager measurements.
    limit = real_ids_limit(cfg.vocab, m_big)
    prompts = {b: random_ids(b, cfg.prompt_len, limit, seed=cfg.seed).to(device) for b in cfg.batches}
    tokens_by = {}
    order = [i for i in IMPLS if i in cfg.impls]
    for impl in order:
        for batch in cfg.batches:
            for m in (1, m_big):
                row = {"impl": graph_name if impl == "cyb_graph" else impl, "batch": batch,
                       "num_steps": m, "prompt_len": cfg.prompt_len, "new_tokens": cfg.new_tokens,
                       "cuda_graph": impl == "cyb_graph" and device.type == "cuda"}
                if not budget.allows(5.0):
                    row.update(status="skipped", reason=f"time budget ({cfg.budget_s} s) spent")
                else:
                    ids = prompts[batch]

                    def measure(impl=impl, m=m, ids=ids, batch=batch):
                        with torch.inference_mode():
                            if impl == "hf_eager":
                                res = hf_eager_loop(hf_model, ids, pause_ids[m], total)
                            else:
                                res = cyb_loop(models[m], ids, torch.ones_like(ids), total,
                                               static=impl == "cyb_graph")
                        tokens_by[(impl, batch, m)] = res["tokens"]
                        return _summary(res, batch, cfg.warmup_steps)
                    row.update(guarded(measure, device))
                    ref = tokens_by.get(("cyb_eager", batch, m))
                    got = tokens_by.get(("cyb_graph", batch, m))
                    if impl == "cyb_graph" and ref is not None and got is not None:
                        row["tokens_vs_cyb_eager"] = _compare(ref, got)
                rows.append(row)
                log(format_row(row))
                write_json(out, result)

    if budget.allows(5.0):
        result["greedy_check_fp32"] = guarded(lambda: greedy_check(hf_model, cfg, device), device)
    else:
        result["greedy_check_fp32"] = {"status": "skipped",
                                       "reason": f"time budget ({cfg.budget_s} s) spent"}
    log(f"greedy check (fp32, static vs library decoder): {_check_line(result['greedy_check_fp32'])}")
    result["elapsed_s"] = budget.elapsed()
    write_json(out, result)
    return result


def _check_line(check: dict) -> str:
    if check.get("status") != "ok":
        return f"{check.get('status')} {check.get('reason', '')}"
    return " ".join(f"{k}: {'equal' if v['equal'] else 'DIFFERENT'}"
                    for k, v in check.items() if k.startswith("M="))


def format_row(row: dict) -> str:
    """One line per row for the log."""
    head = f"{row['impl']:<10} B={row['batch']:>2} M={row['num_steps']}"
    if row.get("status") != "ok":
        return f"{head} {row.get('status')} {row.get('reason', '')}".rstrip()
    tail = ""
    if "tokens_vs_cyb_eager" in row:
        tail = f"  tokens vs eager: {row['tokens_vs_cyb_eager']['match_fraction']:.2f} equal"
    return (f"{head} step {row['step_ms']:8.3f} ms (mean {row['step_ms_mean']:.3f})  "
            f"{row['real_tokens_per_s']:9.1f} real tok/s  prefill {row['prefill_ms']:.1f} ms{tail}")

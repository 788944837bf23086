"""Decode benchmark: graph vs eager, fixed vs adaptive, M = 4 vs M = 1, batch 1 and 32.

One model, several pause settings on the same weights: fixed mode with ``M`` steps per token (a
CYB model: ``M - 1`` pauses, dk), ``M = 1`` (no pauses), and adaptive mode on a CYB model whose
dk prior is set so that a known share of the first steps say dk (the *adaptive fixture*: a
random model says dk arbitrarily; the prior is set from the prompts' step-1 dk margins so that
``pause_fraction`` of them say dk; the pauses that follow decide alike, so the positions per
token are measured, not assumed).  Implementations:

* ``hf_eager``: a plain Hugging Face loop -- the causal LM's forward with a ``DynamicCache``,
  ``M`` new positions per step (the token and ``M - 1`` pause ids, default positions), argmax of
  the last logits.  The reference for "eager HF per-step latency".
* ``cyb_eager``: :class:`cyb.generation.decoders.FixedDecoder` / ``BlockAdaptiveDecoder`` (the
  eager decoders: explicit positions and 4-D mask, ``DynamicCache``, sequential readout; in
  adaptive mode whole blocks, one forward per real token, what greedy decoding uses on CUDA).
* ``cyb_eager_pos`` (adaptive mode only): ``AdaptiveDecoder``, one position per forward (what
  sampling, and greedy decoding on a CPU, use).
* ``cyb_graph``: :class:`cyb.generation.static.StaticFixedDecoder` /
  ``StaticBlockAdaptiveDecoder`` (preallocated KV cache, the decode step captured as a CUDA graph
  on CUDA; on CPU it runs the same step eagerly and the row is called ``cyb_static``): what
  greedy decoding uses.  In adaptive mode it feeds whole blocks, one replay per real token.
* ``cyb_graph_pos`` (adaptive mode only): ``StaticAdaptiveDecoder``, one position per replay
  (what sampling in adaptive mode uses); ``cyb_static_pos`` on CPU.

Every step reads its decisions back to the host (as a streaming generator must), and is timed on
the host clock; each library row first runs an untimed short decode of the same shapes (the
first launches of kernels are slow), then ``warmup_steps`` untimed steps of the timed decode.  Fixed mode: a real token per row per step.  Adaptive mode: a row answers at
some steps and pauses at others; ``ms_per_token`` is the time per real token of a row
(total time / (real tokens / batch)), ``positions_per_token`` the positions fed per real token
and ``steps_per_token`` the steps the readout took per real token (``E[S]`` realised: the
positions adaptive mode keeps).  Checks: the graph (static) decoders against the eager ones through
:func:`cyb.generation.generate` in float32 on a left-padded batch (fixed and adaptive, greedy
and sampled: must be equal), and on the timed bf16 runs (reported; bf16 rounding in different
kernels may flip near-ties, and a flipped token changes everything after it).  End to end:
:func:`cyb.generation.generate` (what ``cyb generate`` runs) against the decoder's own rate.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass

import torch

from ..generation.registry import MODES
from .static_batches import CAPACITY_MULTIPLE, StaticCacheOptions
from .models import DTYPES, SHAPE_134M, SHAPE_TINY, ModelShape, adaptive_fixture, build_hf_model
from .models import random_ids, real_ids_limit, spread_weights, wrap
from ..runtime import resolve_device
from .timing import Budget, environment, free_memory, guarded, median, sync, time_calls
from .timing import write_json

IMPLS = ("hf_eager", "cyb_eager", "cyb_eager_pos", "cyb_graph", "cyb_graph_pos")
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
    modes: tuple = MODES
    dtype: str = "bf16"
    pause_fraction: float = 0.5
    check_batch: int = 32
    check_tokens: int = 24
    e2e_tokens: int = 128
    ll_batch: int = 32
    ll_context: int = 512
    ll_continuation: int = 16
    device: str | None = None
    budget_s: float | None = None
    seed: int = 0
    #: a saved pause model (its folder, or a run folder of ``cyb train``) to time instead of the
    #: random one: its ``M``, vocabulary and dk decisions are used as they are (no adaptive
    #: fixture, no float32 check or loglikelihood)
    model: str | None = None
    #: a text file of prompts, one per line, for ``model`` (needs its tokenizer; default random ids)
    prompts: str | None = None
    #: the static decoder rows (``cyb_graph``, ``cyb_graph_pos``) attend over the whole cache at
    #: every batch size (no attention limits); the checks and ``generate`` keep the defaults
    whole_cache: bool = False
    #: the static decoder rows round their cache's slots per row up to a multiple of this
    capacity_multiple: int = CAPACITY_MULTIPLE
    #: the pause models' visibility (``shared`` or ``private``: a cache of real tokens only)
    visibility: str = "shared"

    @classmethod
    def quick(cls, **overrides) -> "DecodeBenchConfig":
        """Tiny shapes on CPU in float32 (a smoke run)."""
        base = dict(shape=SHAPE_TINY, vocab=256, batches=(1, 4), prompt_len=8, new_tokens=6,
                    warmup_steps=1, dtype="fp32", check_batch=4, check_tokens=6, e2e_tokens=8,
                    ll_batch=4, ll_context=16, ll_continuation=4, device="cpu")
        base.update(overrides)
        return cls(**base)

    def validate(self) -> "DecodeBenchConfig":
        bad = [i for i in self.impls if i not in IMPLS]
        if bad:
            raise ValueError(f"impls: unknown {bad}; choose from {IMPLS}")
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ValueError(f"modes: choose one or more of {MODES}, got {list(self.modes)}")
        if self.num_steps < 2:
            raise ValueError(f"num_steps (M) must be >= 2, got {self.num_steps}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        for name in ("prompt_len", "new_tokens", "check_tokens", "e2e_tokens"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name} must be >= 2, got {getattr(self, name)}")
        if not self.batches or min(self.batches) < 1 or self.check_batch < 1:
            raise ValueError(f"batches and check_batch must be >= 1, got {list(self.batches)}, "
                             f"{self.check_batch}")
        for name in ("ll_batch", "ll_context", "ll_continuation"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prompts is not None and self.model is None:
            raise ValueError("prompts: a prompts file goes with a trained model (model)")
        if self.visibility not in ("shared", "private"):
            raise ValueError(f"visibility must be shared or private, got {self.visibility!r}")
        if not 0.0 <= self.pause_fraction <= 1.0:
            raise ValueError(f"pause_fraction must lie in [0, 1], got {self.pause_fraction}")
        self.cache_options()
        return self

    def cache_options(self) -> StaticCacheOptions:
        """The static cache of the decoder rows."""
        return StaticCacheOptions(attention_limits=not self.whole_cache,
                                  capacity_multiple=self.capacity_multiple)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["shape"] = self.shape.to_dict()
        d["batches"], d["impls"], d["modes"] = list(self.batches), list(self.impls), list(self.modes)
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


def hf_eager_loop(model, ids: torch.Tensor, pause_ids: list[int], steps: int) -> dict:
    """Plain Hugging Face decoding of ``model.hf_model`` (``model``: a :class:`cyb.PauseModel`
    that wraps it, for its empty ``DynamicCache``): the last token and ``pause_ids`` (``M`` new
    positions) per step, default positions, greedy on the last position's logits."""
    from ..model import hf

    hf_model = model.hf_model
    arg = hf.cache_arg_name(hf_model)
    cache = model.new_cache()
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
    b = ids.shape[0]
    return {"prefill_ms": prefill_ms, "times": times, "answered": [b] * steps,
            "steps_used": [b * (len(pause_ids) + 1)] * steps,
            "positions_per_step": len(pause_ids) + 1, "tokens": [first] + tokens}


def cyb_loop(model, ids, mask, steps: int, *, static: bool, mode: str = "fixed",
             one_position: bool = False, cache_options: StaticCacheOptions | None = None) -> dict:
    """``steps`` decode steps of the library's greedy eager (``static=False``) or static decoder
    (its step a CUDA graph on CUDA); in adaptive mode the decoder that feeds whole blocks, or with
    ``one_position`` the one that feeds one position per step (those run until every row has
    ``steps + 1`` tokens).  Each step's decisions are read back as
    :func:`cyb.generation.generate` reads them.  ``cache_options``: the static decoder's cache."""
    from ..generation.registry import make_decoder

    name = ("graph" if ids.device.type == "cuda" else "static") if static else "eager"
    dec = make_decoder(name, model, ids, mask, mode=mode, max_new_tokens=steps + 2,
                       one_position=one_position, cache_options=cache_options)

    def read(out) -> list[list[int]]:
        return torch.stack([out.answered.long(), out.token, out.steps]).tolist()

    t0 = time.perf_counter()
    first = read(dec.start())
    prefill_ms = (time.perf_counter() - t0) * 1e3
    graphs = static and dec.use_graph
    if graphs:
        dec.capture()
    times, decisions = [], [first]
    # a decoder that feeds one position per step runs until every row has ``steps + 1`` tokens
    # (as many as a token-per-step decoder gives), at most ``steps * M`` steps
    per_token = mode == "fixed" or dec.positions_per_step > 1
    emitted = torch.tensor(first[0])
    limit = steps if per_token else steps * model.vocab.num_steps
    while len(times) < limit and (len(times) < steps or int(emitted.min()) < steps + 1):
        captured = dec.capture_ms if graphs else 0.0
        t0 = time.perf_counter()
        decisions.append(read(dec.step()))
        # a step that outgrew the attention limit captured a graph first: counted apart
        times.append((time.perf_counter() - t0) * 1e3 - ((dec.capture_ms - captured) if graphs else 0.0))
        emitted += torch.tensor(decisions[-1][0])
    capture_ms = dec.capture_ms if graphs else None
    # per row, the tokens in the order they were emitted
    b = ids.shape[0]
    tokens = [[tok for (ans, toks, _) in decisions for a, tok in [(ans[r], toks[r])] if a] for r in range(b)]
    return {"prefill_ms": prefill_ms, "capture_ms": capture_ms, "times": times,
            "graphs_captured": dec.graphs_captured if graphs else None,
            "answered": [sum(ans) for ans, _, _ in decisions[1:]],
            "steps_used": [sum(a * s for a, s in zip(ans, st)) for ans, _, st in decisions[1:]],
            "positions_per_step": dec.positions_per_step, "row_tokens": tokens}


# ------------------------------------------------------------------------------ benchmark


def _summary(res: dict, batch: int, warmup: int) -> dict:
    times = res["times"][warmup:]
    answered = sum(res["answered"][warmup:])
    total = sum(times)
    med = median(times)
    out = {"prefill_ms": res["prefill_ms"], "capture_ms": res.get("capture_ms"),
           "graphs_captured": res.get("graphs_captured"),
           "step_ms": med, "step_ms_mean": total / len(times), "step_ms_all": times,
           "steps_timed": len(times), "real_tokens_timed": answered}
    if answered:
        out["per_real_token_ms"] = total / (answered / batch)
        out["real_tokens_per_s"] = answered * 1e3 / total
        out["positions_per_token"] = len(times) * res["positions_per_step"] * batch / answered
        out["steps_per_token"] = sum(res["steps_used"][warmup:]) / answered
    else:
        out["per_real_token_ms"] = out["real_tokens_per_s"] = out["positions_per_token"] = None
        out["steps_per_token"] = None
    return out


def _compare(a: list[list[int]], b: list[list[int]]) -> dict:
    """Agreement of two token streams (lists of lists, compared position by position)."""
    flat_a = [t for step in a for t in step]
    flat_b = [t for step in b for t in step]
    n = min(len(flat_a), len(flat_b))
    same = sum(x == y for x, y in zip(flat_a[:n], flat_b[:n]))
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return {"equal": flat_a == flat_b, "match_fraction": same / max(n, 1),
            "first_mismatch": first}


def _row_compare(a: list[list[int]], b: list[list[int]]) -> dict:
    """Agreement of per-row token lists, each row cut to the shorter of the two."""
    cut = [(x[:min(len(x), len(y))], y[:min(len(x), len(y))]) for x, y in zip(a, b)]
    return _compare([x for x, _ in cut], [y for _, y in cut])


def agreement_check(hf_model, cfg: DecodeBenchConfig, device, graph_kind: str) -> dict:
    """float32: :func:`cyb.generation.generate` with the graph (or static) decoder against the
    eager one, ``check_batch`` left-padded prompts, fixed and adaptive mode, greedy and sampled."""
    from ..generation import generate

    model32 = copy.deepcopy(hf_model).float().eval()
    out = {}
    try:
        m = cfg.num_steps
        limit = real_ids_limit(cfg.vocab, m)
        g = torch.Generator().manual_seed(cfg.seed + 7)
        lengths = torch.randint(max(cfg.prompt_len // 4, 1), cfg.prompt_len + 1, (cfg.check_batch,),
                                generator=g).tolist()
        lengths[0] = cfg.prompt_len
        prompts = [torch.randint(0, limit, (n,), generator=g).tolist() for n in lengths]
        padded = torch.tensor([p + [0] * (cfg.prompt_len - len(p)) for p in prompts])
        adaptive, _ = adaptive_fixture(model32, m, padded.to(device), cfg.pause_fraction, cfg.visibility)
        cases = [("fixed", f"M={m}", adaptive), ("fixed", "M=1", wrap(model32, "baseline", 1)),
                 ("adaptive", f"M={m}", adaptive)]
        for mode, label, pm in cases:
            if mode not in cfg.modes:
                continue
            for sample in (False, True):
                opts = dict(mode=mode, max_new_tokens=cfg.check_tokens, eos_token_ids=())
                if sample:
                    opts.update(sample=True, temperature=0.8, top_p=0.95, seed=cfg.seed)
                ref = generate(pm, prompts, decoder="eager", **opts)
                got = generate(pm, prompts, decoder=graph_kind, **opts)
                a, b = [r.token_ids for r in ref], [r.token_ids for r in got]
                res = _compare(a, b)
                res["steps_equal"] = [r.steps for r in ref] == [r.steps for r in got]
                res["equal"] = res["equal"] and res["steps_equal"]
                res.update(rows=len(prompts), tokens=cfg.check_tokens,
                           mean_steps=sum(s for r in ref for s in r.steps) / sum(len(r.steps) for r in ref))
                out[f"{mode} {label} {'sampled' if sample else 'greedy'}"] = res
    finally:
        del model32
        free_memory(device)
    out["equal"] = all(v["equal"] for v in out.values() if isinstance(v, dict))
    return out


def end_to_end(models: dict, prompts: dict, masks: dict, cfg: DecodeBenchConfig,
               graph_kind: str, num_steps: int | None = None) -> list[dict]:
    """:func:`cyb.generation.generate` after a warm-up call, no EOS, with the graph decoder (the
    default on CUDA; the static one elsewhere): tokens/s of the whole call (prefill, capture and
    decoding) and of its decoding part (from the 3rd token event to the last).  ``num_steps``:
    the M of the models (a trained model's own; default ``cfg.num_steps``)."""
    from ..generation import generate

    m = num_steps or cfg.num_steps
    rows = []
    for mode in cfg.modes:
        for batch in cfg.batches:
            pm = models[("adaptive" if mode == "adaptive" else "fixed", m)]
            ids = [row[mk.bool()].tolist() for row, mk in zip(prompts[batch], masks[batch])]
            opts = dict(mode=mode, max_new_tokens=cfg.e2e_tokens, eos_token_ids=(), decoder=graph_kind)
            row = {"mode": mode, "batch": batch, "num_steps": m,
                   "new_tokens": cfg.e2e_tokens, "decoder": graph_kind}

            def measure(pm=pm, ids=ids, opts=opts, batch=batch):
                generate(pm, ids, **opts)  # warm-up (allocator, kernels)
                stamps = []
                sync(pm.device)
                t0 = time.perf_counter()
                generate(pm, ids, on_token=lambda e: stamps.append((e.index, time.perf_counter())), **opts)
                total = time.perf_counter() - t0
                later = [t for i, t in stamps if i >= 2]
                start = max(t for i, t in stamps if i == 1)
                n_later = sum(1 for i, _ in stamps if i >= 2)
                return {"total_s": total, "tokens_per_s": batch * cfg.e2e_tokens / total,
                        "decode_tokens_per_s": n_later / (max(later) - start) if later else None}
            row.update(guarded(measure, pm.device))
            rows.append(row)
    return rows


def loglikelihood_bench(model, cfg: DecodeBenchConfig, device) -> dict:
    """lm-eval ``loglikelihood`` scoring (:func:`cyb.integrations.scoring.score_batch`) of
    ``ll_batch`` requests (``ll_context`` + ``ll_continuation`` real tokens each) against the
    same readout on the full logits of every position (what a plain causal-LM forward makes)."""
    from ..integrations.scoring import score_batch, token_log_likelihood
    from ..layout import collapse, expand
    from ..readout import readout

    limit = real_ids_limit(cfg.vocab, model.num_steps)
    g = torch.Generator().manual_seed(cfg.seed + 11)
    seqs = torch.randint(0, limit, (cfg.ll_batch, cfg.ll_context + cfg.ll_continuation), generator=g)
    pairs = [(row[:cfg.ll_context], row[cfg.ll_context:]) for row in seqs.tolist()]
    n_tok = cfg.ll_batch * cfg.ll_continuation
    max_length = cfg.ll_context + cfg.ll_continuation

    def fused():
        return score_batch(model, pairs, max_length=max_length)

    def full_logits():
        with torch.inference_mode():
            ids = seqs[:, :-1].to(device)
            lay = expand(ids, model.vocab)
            hidden, _ = model.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask,
                                            steps=lay.steps)
            logits = model.logits(hidden)  # [B, L*M, V]: every position
            m = model.num_steps
            blocks = collapse(logits, m)[:, -cfg.ll_continuation:]  # [B, C, M, V]
            tgt = seqs[:, cfg.ll_context:].to(device).unsqueeze(-1).expand(-1, -1, m)
            lt, ld, lnd = readout(blocks, tgt, dk_id=model.settings.dk_id, dk_bias=model.dk_bias)
            return token_log_likelihood(lt, ld, lnd, has_dk=model.settings.dk_id is not None).sum(-1).tolist()

    out = {"batch": cfg.ll_batch, "context": cfg.ll_context, "continuation": cfg.ll_continuation,
           "num_steps": model.num_steps}
    for name, fn in (("scored_blocks", fused), ("full_logits", full_logits)):
        res = guarded(lambda fn=fn: time_calls(fn, device=device, warmup=1, repeats=3), device)
        if res.get("status") == "ok":
            res["requests_per_s"] = cfg.ll_batch * 1e3 / res["ms"]
            res["tokens_scored_per_s"] = n_tok * 1e3 / res["ms"]
        out[name] = res
        free_memory(device)
    a, b = fused(), full_logits()
    out["max_abs_difference"] = max(abs(x - y) for (x, _), y in zip(a, b))
    return out


def trained_model(cfg: DecodeBenchConfig, device, dtype):
    """``(model, prompts {batch: [B, P] ids}, masks {batch: [B, P]}, info)`` for ``cfg.model``:
    the saved pause model in ``dtype`` on ``device`` and the first ``B`` prompts of
    ``cfg.prompts`` (cycled; left-padded), or random real ids of ``prompt_len``."""
    from ..layout import left_pad
    from ..model import PauseModel

    from ..model.sources import saved_model_folder

    folder = saved_model_folder(cfg.model, "--model")  # a model folder, or a run folder's final/
    model = PauseModel.from_pretrained(folder).to(device=device, dtype=dtype).eval()
    limit = min(model.vocab.special_ids, default=model.vocab.vocab_size)  # ids below every special one
    if cfg.prompts is None:
        encoded = random_ids(max(cfg.batches), cfg.prompt_len, limit, seed=cfg.seed).tolist()
        source = f"random ids, {cfg.prompt_len} per prompt"
    else:
        if model.tokenizer is None:
            raise ValueError(f"{cfg.model} has no tokenizer to encode the prompts of {cfg.prompts}")
        from ..generation.text import encode_prompt

        with open(cfg.prompts, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in f if line.strip()]
        if not lines:
            raise ValueError(f"{cfg.prompts} holds no prompt")
        encoded = [encode_prompt(model.tokenizer, line, i) for i, line in enumerate(lines)]
        source = f"{len(lines)} prompts of {cfg.prompts}"
    prompts, masks = {}, {}
    for b in cfg.batches:
        rows = [encoded[i % len(encoded)] for i in range(b)]
        prompts[b], masks[b] = left_pad(rows, device)
    info = {"path": str(folder), "num_steps": model.num_steps, "method": model.settings.method,
            "vocab": model.vocab.vocab_size, "prompts": source}
    return model, prompts, masks, info


def run(cfg: DecodeBenchConfig, *, out=None, log=print) -> dict:
    """Run the decode benchmark; returns (and writes to ``out`` after every row) the result."""
    cfg.validate()
    device = resolve_device(cfg.device, what="--device")
    budget = Budget(cfg.budget_s)
    dtype = DTYPES[cfg.dtype]
    result = {"kind": "decode", "env": environment(device), "config": cfg.to_dict(),
              "anchor_hf_eager_ms": HF_EAGER_ANCHOR_MS, "results": []}
    rows = result["results"]
    names = {"cyb_graph": "cyb_graph", "cyb_graph_pos": "cyb_graph_pos"} if device.type == "cuda" \
        else {"cyb_graph": "cyb_static", "cyb_graph_pos": "cyb_static_pos"}
    graph_kind = "graph" if device.type == "cuda" else "static"
    total = cfg.warmup_steps + cfg.new_tokens
    if cfg.model is None:
        m_big = cfg.num_steps
        e2e = max(cfg.e2e_tokens, cfg.check_tokens)
        max_pos = max((cfg.prompt_len + max(total, e2e) + 2) * m_big,
                      (cfg.ll_context + cfg.ll_continuation) * m_big) + 16
        hf_model = build_hf_model(cfg.shape, cfg.vocab, dtype=dtype, device=device,
                                  max_positions=max_pos, seed=cfg.seed).eval()
        spread_weights(hf_model, cfg.seed)
        limit = real_ids_limit(cfg.vocab, m_big)
        prompts = {b: random_ids(b, cfg.prompt_len, limit, seed=cfg.seed).to(device) for b in cfg.batches}
        masks = {b: torch.ones_like(ids) for b, ids in prompts.items()}
        fixture, info = adaptive_fixture(hf_model, m_big, prompts[max(cfg.batches)], cfg.pause_fraction,
                                         cfg.visibility)
        result["adaptive_fixture"] = info
        trained = wrap(hf_model, "cyb", m_big, cfg.visibility)
    else:
        trained, prompts, masks, info = trained_model(cfg, device, dtype)
        fixture, hf_model, m_big = trained, trained.hf_model, trained.num_steps
        result["trained_model"] = info
        result["config"]["num_steps"] = m_big  # the model's M, not the option's
    models = {("fixed", m_big): trained, ("fixed", 1): wrap(hf_model, "baseline", 1),
              ("adaptive", m_big): fixture}
    pause_ids = {m_big: list(models[("fixed", m_big)].vocab.pause_ids), 1: []}

    # Eager rows first, then the CUDA-graph rows, then the checks (which capture graphs too):
    # a failed capture cannot spoil the eager measurements.
    tokens_by = {}
    cases = [(mode, m) for mode in ("fixed", "adaptive") if mode in cfg.modes
             for m in ((1, m_big) if mode == "fixed" else (m_big,))]
    for impl in [i for i in IMPLS if i in cfg.impls]:
        for batch in cfg.batches:
            for mode, m in cases:
                if (impl == "hf_eager" and (mode != "fixed" or not bool(masks[batch].all()))) \
                        or (impl.endswith("_pos") and mode != "adaptive"):
                    continue  # the plain loop has no padding
                static = impl in ("cyb_graph", "cyb_graph_pos")
                row = {"impl": names.get(impl, impl), "mode": mode,
                       "batch": batch, "num_steps": m, "prompt_len": cfg.prompt_len,
                       "new_tokens": cfg.new_tokens, "cuda_graph": static and device.type == "cuda"}
                if not budget.allows(5.0):
                    row.update(status="skipped", reason=f"time budget ({cfg.budget_s} s) spent")
                else:
                    ids = prompts[batch]

                    def measure(impl=impl, m=m, ids=ids, batch=batch, mode=mode):
                        with torch.inference_mode():
                            if impl == "hf_eager":
                                res = hf_eager_loop(models[("fixed", 1)], ids, pause_ids[m], total)
                                res["row_tokens"] = [list(r) for r in zip(*res["tokens"])]
                            else:
                                run_loop = lambda n: cyb_loop(  # noqa: E731
                                    models[(mode, m)], ids, masks[batch], n, static=static,
                                    mode=mode, one_position=impl.endswith("_pos"),
                                    cache_options=cfg.cache_options())
                                run_loop(2)  # untimed: first launches of this row's kernels
                                res = run_loop(total)
                        tokens_by[(impl, batch, mode, m)] = res["row_tokens"]
                        return _summary(res, batch, cfg.warmup_steps)
                    row.update(guarded(measure, device))
                    ref = tokens_by.get(("cyb_eager_pos" if impl.endswith("_pos") else "cyb_eager",
                                         batch, mode, m))
                    got = tokens_by.get((impl, batch, mode, m))
                    if static and ref is not None and got is not None:
                        row["tokens_vs_cyb_eager"] = _row_compare(ref, got)
                rows.append(row)
                log(format_row(row))
                write_json(out, result)

    for key, fn in (("agreement_fp32", lambda: agreement_check(hf_model, cfg, device, graph_kind)),
                    ("end_to_end", lambda: {"rows": end_to_end(models, prompts, masks, cfg, graph_kind, m_big)}),
                    ("loglikelihood", lambda: loglikelihood_bench(models[("fixed", m_big)], cfg, device))):
        if cfg.model is not None and key != "end_to_end":
            result[key] = {"status": "skipped", "reason": "random-model check (not run with --model)"}
        elif budget.allows(5.0):
            result[key] = guarded(fn, device)
        else:
            result[key] = {"status": "skipped", "reason": f"time budget ({cfg.budget_s} s) spent"}
        write_json(out, result)
    log(f"agreement (fp32, {graph_kind} vs eager decoder): {_check_line(result['agreement_fp32'])}")
    for r in result["end_to_end"].get("rows", []):
        log(format_e2e(r))
    ll = result["loglikelihood"]
    for name in ("scored_blocks", "full_logits"):
        r = ll.get(name, {})
        if r.get("status") == "ok":
            peak = "" if r["peak_gib"] is None else f", peak {r['peak_gib']:.2f} GiB"
            log(f"loglikelihood {name}: {r['ms']:.1f} ms per batch of {ll['batch']}, "
                f"{r['requests_per_s']:.1f} requests/s{peak}")
    result["elapsed_s"] = budget.elapsed()
    write_json(out, result)
    return result


def _check_line(check: dict) -> str:
    if check.get("status") != "ok":
        return f"{check.get('status')} {check.get('reason', '')}"
    return "; ".join(f"{k}: {'equal' if v['equal'] else 'DIFFERENT'}"
                     for k, v in check.items() if isinstance(v, dict))


def format_row(row: dict) -> str:
    """One line per row for the log."""
    head = f"{row['impl']:<10} {row.get('mode', 'fixed'):<8} B={row['batch']:>2} M={row['num_steps']}"
    if row.get("status") != "ok":
        return f"{head} {row.get('status')} {row.get('reason', '')}".rstrip()
    tail = ""
    if "tokens_vs_cyb_eager" in row:
        tail = f"  tokens vs eager: {row['tokens_vs_cyb_eager']['match_fraction']:.2f} equal"
    if row["per_real_token_ms"] is None:
        return f"{head} no real token in the timed steps{tail}"
    return (f"{head} {row['per_real_token_ms']:8.3f} ms/token  step {row['step_ms']:.3f} ms  "
            f"{row['positions_per_token']:.2f} pos/token  {row['steps_per_token']:.2f} steps/token  "
            f"{row['real_tokens_per_s']:9.1f} real tok/s  "
            f"prefill {row['prefill_ms']:.1f} ms{tail}")


def format_e2e(row: dict) -> str:
    head = f"generate {row['mode']:<8} B={row['batch']:>2} M={row['num_steps']} ({row['decoder']})"
    if row.get("status") != "ok":
        return f"{head} {row.get('status')} {row.get('reason', '')}".rstrip()
    dec = row.get("decode_tokens_per_s")
    return (f"{head} {row['tokens_per_s']:.1f} tok/s whole call, "
            f"{dec:.1f} tok/s decoding" if dec else f"{head} {row['tokens_per_s']:.1f} tok/s")

"""``cyb bench decode``: what a real token costs, against batch, for every decoder and layout.

One random model (the 134 M Llama shape by default; or a saved pause model, ``model``), wrapped
with several pause settings on the same weights: ``M = 1`` (no pauses), fixed mode with ``M``
steps per token, and adaptive mode on a CYB model whose dk prior makes a given share of the
step-1 decisions say dk (the *adaptive fixture*, :func:`cyb.bench.models.adaptive_fixture`; the
pauses that follow decide as the model does, so positions per token are measured, not assumed),
for each pause visibility asked for.  Implementations (``impls``):

* ``hf_eager``: a plain Hugging Face loop (``DynamicCache``, the token and ``M - 1`` pause ids
  per step, default positions, argmax) -- fixed mode, shared pauses;
* ``eager``: the eager decoders (:mod:`cyb.generation.decoders`; adaptive mode: whole blocks on
  CUDA, one position elsewhere) and ``eager_pos`` (adaptive mode, one position per step; for
  gated pauses these recompute the row every step);
* ``static_batches``: the previous release's decoders (:mod:`cyb.bench.static_batches`: a static
  batch, every row feeding its whole block, each step a CUDA graph on CUDA);
* ``engine_one`` and ``engine_block``: the engine (:mod:`cyb.engine`) with one position per row
  per step, or whole blocks (:func:`cyb.bench.engine_runs.engine_rate`).

Every row decodes ``warmup_steps`` untimed steps, then ``new_tokens`` timed ones, reading each
step's decisions back as generation does.  ``ms_per_token`` is the time per real token of a row
(total time / (real tokens / batch)); ``steps_per_token`` the steps the readout took per token
(``E[S]`` realised), ``positions_per_token`` the positions that went through the network.  Then:
a float32 check that ``generate`` with the engine makes the eager decoders' decisions, the
offline job (``offline`` prompts of mixed lengths through the engine against static batches of
the same memory, :func:`cyb.bench.engine_runs.offline_job`), and lm-eval loglikelihood scoring.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass

import torch

from ..generation.registry import MODES
from ..runtime import resolve_device
from .engine_runs import engine_rate, mixed_job, offline_job, offline_static
from .models import DTYPES, SHAPE_134M, SHAPE_TINY, ModelShape, adaptive_fixture, build_hf_model
from .models import random_ids, real_ids_limit, spread_weights, wrap
from .timing import Budget, environment, free_memory, guarded, median, time_calls, write_json

IMPLS = ("hf_eager", "eager", "eager_pos", "static_batches", "engine_one", "engine_block")
VISIBILITIES = ("shared", "private", "gated")


@dataclass
class DecodeBenchConfig:
    """What to measure."""

    shape: ModelShape = SHAPE_134M
    vocab: int = 32768
    num_steps: int = 4
    batches: tuple = (1, 32, 256)
    prompt_len: int = 128
    new_tokens: int = 64
    warmup_steps: int = 4
    impls: tuple = IMPLS
    modes: tuple = MODES
    dtype: str = "bf16"
    pause_fractions: tuple = (0.1, 0.5)
    visibilities: tuple = ("shared",)
    check_batch: int = 16
    check_tokens: int = 24
    #: prompts of the offline job (0: no job), its static batch, prompt and answer lengths
    offline: int = 0
    offline_batch: int = 256
    offline_prompt_lengths: tuple = (16, 512)
    offline_answer_lengths: tuple = (8, 256)
    ll_batch: int = 32
    ll_context: int = 512
    ll_continuation: int = 16
    device: str | None = None
    budget_s: float | None = None
    seed: int = 0
    #: a saved pause model (its folder, or a run folder of ``cyb train``) to time instead of the
    #: random one: its ``M``, vocabulary, visibility and dk decisions are used as they are (no
    #: adaptive fixture, no float32 check, offline job or loglikelihood)
    model: str | None = None
    #: a text file of prompts, one per line, for ``model`` (needs its tokenizer; default random ids)
    prompts: str | None = None

    @classmethod
    def quick(cls, **overrides) -> "DecodeBenchConfig":
        """Tiny shapes on CPU in float32 (a smoke run)."""
        base = dict(shape=SHAPE_TINY, vocab=256, batches=(1, 4), prompt_len=8, new_tokens=6,
                    warmup_steps=1, dtype="fp32", check_batch=4, check_tokens=6, offline=12,
                    offline_batch=4, offline_prompt_lengths=(2, 10), offline_answer_lengths=(2, 8),
                    ll_batch=4, ll_context=16, ll_continuation=4, device="cpu", pause_fractions=(0.5,))
        base.update(overrides)
        return cls(**base)

    def validate(self) -> "DecodeBenchConfig":
        bad = [i for i in self.impls if i not in IMPLS]
        if bad:
            raise ValueError(f"impls: unknown {bad}; choose from {IMPLS}")
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ValueError(f"modes: choose one or more of {MODES}, got {list(self.modes)}")
        bad = [v for v in self.visibilities if v not in VISIBILITIES]
        if bad or not self.visibilities:
            raise ValueError(f"visibility: choose one or more of {VISIBILITIES}, got {list(self.visibilities)}")
        if self.num_steps < 2:
            raise ValueError(f"num_steps (M) must be >= 2, got {self.num_steps}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        for name in ("prompt_len", "new_tokens", "check_tokens"):
            if getattr(self, name) < 2:
                raise ValueError(f"{name} must be >= 2, got {getattr(self, name)}")
        if not self.batches or min(self.batches) < 1 or self.check_batch < 1 or self.offline_batch < 1:
            raise ValueError(f"batches, check_batch and offline_batch must be >= 1, got {list(self.batches)}, "
                             f"{self.check_batch}, {self.offline_batch}")
        if self.offline < 0:
            raise ValueError(f"offline must be >= 0 (0: no offline job), got {self.offline}")
        for name in ("offline_prompt_lengths", "offline_answer_lengths"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be (low, high) with 1 <= low <= high, got {(lo, hi)}")
        for name in ("ll_batch", "ll_context", "ll_continuation"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.prompts is not None and self.model is None:
            raise ValueError("prompts: a prompts file goes with a trained model (model)")
        if any(not 0.0 <= f <= 1.0 for f in self.pause_fractions) or not self.pause_fractions:
            raise ValueError(f"pause fractions must lie in [0, 1], got {list(self.pause_fractions)}")
        return self

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["shape"] = self.shape.to_dict()
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
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


def decoder_loop(model, prompts: list[list[int]], steps: int, *, impl: str, mode: str) -> dict:
    """``steps`` decode steps of an eager decoder (``eager``, ``eager_pos``) or of the previous
    release's static-batch decoder (``static_batches``), greedy, each step's decisions read back;
    a decoder that feeds one position per step runs until every row has ``steps + 1`` tokens."""
    from ..generation.decoders import StepReadout
    from ..generation.registry import make_decoder
    from ..layout import left_pad
    from . import static_batches as sb

    ids, mask = left_pad(prompts, model.device)
    readout = StepReadout(model.vocab, model.dk_bias)
    if impl == "static_batches":
        if model.pause_visibility == "private":
            dec = sb.StaticPrivateDecoder(model, ids, mask, readout, max_new_tokens=steps + 2, mode=mode)
        else:
            cls = sb.StaticFixedDecoder if mode == "fixed" else sb.StaticBlockAdaptiveDecoder
            dec = cls(model, ids, mask, readout, max_new_tokens=steps + 2)
    else:
        dec = make_decoder(model, ids, mask, readout, mode=mode,
                           one_position=True if impl == "eager_pos" else None)

    def read(out) -> list[list[int]]:
        return torch.stack([out.answered.long(), out.token, out.steps]).tolist()

    t0 = time.perf_counter()
    first = read(dec.start())
    prefill_ms = (time.perf_counter() - t0) * 1e3
    graphs = impl == "static_batches" and dec.use_graph
    if graphs:
        dec.capture()
    times, decisions = [], [first]
    per_token = mode == "fixed" or dec.positions_per_step > 1
    emitted = torch.tensor(first[0])
    limit = steps if per_token else steps * model.vocab.num_steps
    while len(times) < limit and (len(times) < steps or int(emitted.min()) < steps + 1):
        captured = dec.capture_ms if graphs else 0.0
        t0 = time.perf_counter()
        decisions.append(read(dec.step()))
        times.append((time.perf_counter() - t0) * 1e3 - ((dec.capture_ms - captured) if graphs else 0.0))
        emitted += torch.tensor(decisions[-1][0])
    positions = dec.positions_per_step
    return {"prefill_ms": prefill_ms, "capture_ms": dec.capture_ms if graphs else None, "times": times,
            "answered": [sum(ans) for ans, _, _ in decisions[1:]],
            "steps_used": [sum(a * s for a, s in zip(ans, st)) for ans, _, st in decisions[1:]],
            "positions_per_step": positions}


def _summary(res: dict, batch: int, warmup: int) -> dict:
    times = res["times"][warmup:]
    answered = sum(res["answered"][warmup:])
    total = sum(times)
    out = {"prefill_ms": res["prefill_ms"], "capture_ms": res.get("capture_ms"),
           "step_ms": median(times), "steps_timed": len(times), "real_tokens": answered}
    if answered:
        out["ms_per_token"] = total / (answered / batch)
        out["real_tokens_per_s"] = answered * 1e3 / total
        out["positions_per_token"] = len(times) * res["positions_per_step"] * batch / answered
        out["steps_per_token"] = sum(res["steps_used"][warmup:]) / answered
    return out


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
    """``(model, prompts {batch: B lists of ids}, info)`` for ``cfg.model``: the saved pause
    model in ``dtype`` on ``device`` and the first ``B`` prompts of ``cfg.prompts`` (cycled), or
    random real ids of ``prompt_len``."""
    from ..model import PauseModel

    from ..run_models import saved_model_folder

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

        from ..data.sources import read_utf8

        lines = [line.rstrip("\n") for line in read_utf8(cfg.prompts).splitlines(keepends=True) if line.strip()]
        if not lines:
            raise ValueError(f"{cfg.prompts} holds no prompt")
        encoded = [encode_prompt(model.tokenizer, line, i) for i, line in enumerate(lines)]
        source = f"{len(lines)} prompts of {cfg.prompts}"
    prompts = {b: [encoded[i % len(encoded)] for i in range(b)] for b in cfg.batches}
    info = {"path": str(folder), "num_steps": model.num_steps, "method": model.settings.method,
            "vocab": model.vocab.vocab_size, "prompts": source}
    return model, prompts, info



# ------------------------------------------------------------------------------ benchmark


def _applies(impl: str, mode: str, m: int, visibility: str, m_big: int) -> bool:
    """Whether ``impl`` has a row for this case."""
    if impl == "hf_eager":
        return mode == "fixed" and visibility == "shared"
    if impl == "static_batches":
        return visibility != "gated"
    if impl == "eager_pos":
        return mode == "adaptive"
    if impl == "engine_one":
        return mode == "adaptive" or m == 1
    if impl == "engine_block":
        return m > 1
    return True


def _measure(impl: str, model, prompts: list[list[int]], mode: str, cfg: DecodeBenchConfig) -> dict:
    total = cfg.warmup_steps + cfg.new_tokens
    with torch.inference_mode():
        if impl.startswith("engine"):
            engine_rate(model, prompts, mode=mode, positions=impl[len("engine_"):], warmup=1, timed=2)  # untimed
            res = engine_rate(model, prompts, mode=mode, positions=impl[len("engine_"):],
                              warmup=cfg.warmup_steps, timed=cfg.new_tokens)
            res.pop("impl")
            return res
        if impl == "hf_eager":
            ids = torch.tensor(prompts, device=model.device)
            res = hf_eager_loop(model, ids, list(model.vocab.pause_ids), total)
        else:
            decoder_loop(model, prompts, 2, impl=impl, mode=mode)  # untimed: first launches
            res = decoder_loop(model, prompts, total, impl=impl, mode=mode)
    return _summary(res, len(prompts), cfg.warmup_steps)


def agreement_check(hf_model, cfg: DecodeBenchConfig, device, visibility: str) -> dict:
    """float32: :func:`cyb.generation.generate` (the engine) against the eager decoders on
    ``check_batch`` prompts of mixed lengths, fixed and adaptive mode, greedy and sampled."""
    from ..generation import generate

    model32 = copy.deepcopy(hf_model).float().eval()
    out = {}
    try:
        m = cfg.num_steps
        limit = real_ids_limit(cfg.vocab, m)
        g = torch.Generator().manual_seed(cfg.seed + 7)
        lengths = torch.randint(max(cfg.prompt_len // 4, 1), cfg.prompt_len + 1, (cfg.check_batch,),
                                generator=g).tolist()
        prompts = [torch.randint(0, limit, (n,), generator=g).tolist() for n in lengths]
        padded = torch.tensor([p + [0] * (cfg.prompt_len - len(p)) for p in prompts])
        adaptive, _ = adaptive_fixture(model32, m, padded.to(device), 0.5, visibility)
        for mode in cfg.modes:
            for sample in (False, True):
                opts = dict(mode=mode, max_new_tokens=cfg.check_tokens, eos_token_ids=())
                if sample:
                    opts.update(sample=True, temperature=0.8, top_p=0.95, seed=cfg.seed)
                ref = generate(adaptive, prompts, decoder="eager", **opts)
                got = generate(adaptive, prompts, **opts)
                same = [(r.token_ids, r.steps) == (h.token_ids, h.steps) for r, h in zip(ref, got)]
                out[f"{visibility} {mode} {'sampled' if sample else 'greedy'}"] = {
                    "equal": all(same), "rows_equal": sum(same), "rows": len(prompts),
                    "tokens": cfg.check_tokens,
                    "mean_steps": sum(s for r in ref for s in r.steps) / sum(len(r.steps) for r in ref)}
    finally:
        del model32
        free_memory(device)
    # (sampling on a random model of a large vocabulary draws from nearly flat distributions, where
    # float32 sums in another order move a token boundary: sampled rows are reported, not required)
    out["equal"] = all(v["equal"] for k, v in out.items() if isinstance(v, dict) and k.endswith("greedy"))
    return out


def run(cfg: DecodeBenchConfig, *, out=None, log=print) -> dict:
    """Run the decode benchmark; returns (and writes to ``out`` after every row) the result."""
    cfg.validate()
    device = resolve_device(cfg.device, what="--device")
    budget = Budget(cfg.budget_s)
    dtype = DTYPES[cfg.dtype]
    result = {"kind": "decode", "env": environment(device), "config": cfg.to_dict(), "results": []}
    rows = result["results"]
    if cfg.model is None:
        m_big = cfg.num_steps
        longest = cfg.prompt_len + cfg.warmup_steps + cfg.new_tokens + 16
        if cfg.offline:
            longest = max(longest, cfg.offline_prompt_lengths[1] + cfg.offline_answer_lengths[1] + 4)
        max_pos = max(longest * m_big, (cfg.ll_context + cfg.ll_continuation) * m_big) + 16
        hf_model = build_hf_model(cfg.shape, cfg.vocab, dtype=dtype, device=device,
                                  max_positions=max_pos, seed=cfg.seed).eval()
        spread_weights(hf_model, cfg.seed)
        limit = real_ids_limit(cfg.vocab, m_big)
        prompts = {b: random_ids(b, cfg.prompt_len, limit, seed=cfg.seed).tolist() for b in cfg.batches}
        sets = []
        for vis in cfg.visibilities:
            fixtures = {}
            for frac in cfg.pause_fractions:
                ids = torch.tensor(prompts[max(cfg.batches)], device=device)
                fixtures[frac], info = adaptive_fixture(hf_model, m_big, ids, frac, vis)
                result.setdefault("adaptive_fixture", {})[f"{vis} {frac}"] = info
            sets.append((vis, wrap(hf_model, "cyb", m_big, vis), fixtures))
        baseline = wrap(hf_model, "baseline", 1)
    else:
        trained, prompts, info = trained_model(cfg, device, dtype)
        hf_model, m_big = trained.hf_model, trained.num_steps
        sets = [(trained.pause_visibility, trained, {None: trained})]
        baseline = None
        result["trained_model"] = info
        result["config"]["num_steps"] = m_big
    cases = []  # (visibility, mode, M, pause fraction, model)
    if baseline is not None and "fixed" in cfg.modes:
        cases.append(("shared", "fixed", 1, None, baseline))
    for vis, fixed_model, fixtures in sets:
        if "fixed" in cfg.modes:
            cases.append((vis, "fixed", m_big, None, fixed_model))
        if "adaptive" in cfg.modes:
            cases += [(vis, "adaptive", m_big, frac, pm) for frac, pm in fixtures.items()]
    for batch in cfg.batches:
        for vis, mode, m, frac, pm in cases:
            for impl in cfg.impls:
                if not _applies(impl, mode, m, vis if m > 1 else "shared", m_big):
                    continue
                row = {"impl": impl, "visibility": vis if m > 1 else "none", "mode": mode, "batch": batch,
                       "num_steps": m, "pause_fraction": frac, "prompt_len": cfg.prompt_len,
                       "new_tokens": cfg.new_tokens}
                if not budget.allows(5.0):
                    row.update(status="skipped", reason=f"time budget ({cfg.budget_s} s) spent")
                else:
                    row.update(guarded(lambda: _measure(impl, pm, prompts[batch], mode, cfg), device))
                rows.append(row)
                log(format_row(row))
                write_json(out, result)
                free_memory(device)
    if cfg.model is None:
        for vis in cfg.visibilities:
            key = f"agreement_fp32 {vis}"
            result[key] = (guarded(lambda: agreement_check(hf_model, cfg, device, vis), device)
                           if budget.allows(5.0) else {"status": "skipped", "reason": "time budget spent"})
            log(f"agreement (fp32, engine vs eager, {vis}): {_check_line(result[key])}")
            write_json(out, result)
        if cfg.offline:
            result["offline"] = []
            for vis, fixed_model, fixtures in sets:
                pm = fixtures[min(fixtures)]
                for job in _offline(pm, vis, cfg, device, limit):
                    result["offline"].append(job)
                    log(format_offline(job))
                    write_json(out, result)
        if budget.allows(5.0):
            result["loglikelihood"] = guarded(lambda: loglikelihood_bench(sets[0][1], cfg, device), device)
            write_json(out, result)
    result["elapsed_s"] = budget.elapsed()
    write_json(out, result)
    return result


def _offline(model, visibility: str, cfg: DecodeBenchConfig, device, limit: int) -> list[dict]:
    """The offline job in adaptive mode: the engine, then the previous release's static batches."""
    prompts, answers = mixed_job(cfg.offline, cfg.offline_prompt_lengths, cfg.offline_answer_lengths, limit,
                                 seed=cfg.seed)
    jobs = []
    common = {"visibility": visibility, "prompt_lengths": list(cfg.offline_prompt_lengths),
              "answer_lengths": list(cfg.offline_answer_lengths), "batch": cfg.offline_batch}
    for name, fn in (("engine", offline_job), ("static_batches", offline_static)):
        if visibility == "gated" and name == "static_batches":
            continue
        res = guarded(lambda fn=fn: fn(model, prompts, answers, mode="adaptive", batch=cfg.offline_batch), device)
        res.update(common, impl=name)
        jobs.append(res)
        free_memory(device)
    if len(jobs) == 2 and all(j.get("status") == "ok" for j in jobs):
        jobs[0]["speedup_vs_static_batches"] = jobs[0]["real_tokens_per_s"] / jobs[1]["real_tokens_per_s"]
    return jobs


def _check_line(check: dict) -> str:
    if check.get("status") != "ok":
        return f"{check.get('status')} {check.get('reason', '')}"
    return "; ".join(f"{k}: {'equal' if v['equal'] else 'DIFFERENT'}"
                     for k, v in check.items() if isinstance(v, dict))


def format_row(row: dict) -> str:
    """One line per row for the log."""
    frac = "" if row.get("pause_fraction") is None else f" p={row['pause_fraction']}"
    head = (f"{row['impl']:<14} {row['visibility']:<7} {row['mode']:<8} B={row['batch']:>4} "
            f"M={row['num_steps']}{frac}")
    if row.get("status") != "ok":
        return f"{head} {row.get('status')} {row.get('reason', '')}".rstrip()
    if row.get("ms_per_token") is None:
        return f"{head} no real token in the timed steps"
    return (f"{head} {row['ms_per_token']:8.3f} ms/token  step {row['step_ms']:.3f} ms  "
            f"{row['positions_per_token']:.2f} pos/token  {row['steps_per_token']:.2f} steps/token  "
            f"{row['real_tokens_per_s']:10.1f} real tok/s")


def format_offline(job: dict) -> str:
    head = f"offline {job['impl']:<14} {job['visibility']:<7} {job.get('prompts', '')} prompts"
    if job.get("status") != "ok":
        return f"{head} {job.get('status')} {job.get('reason', '')}".rstrip()
    extra = f"  {job['speedup_vs_static_batches']:.2f}x static batches" if "speedup_vs_static_batches" in job else ""
    return (f"{head} {job['seconds']:.1f} s  {job['real_tokens_per_s']:,.0f} real tok/s  slots {job['slots']}  "
            f"cache {job['cache_gib']:.2f} GiB{extra}")

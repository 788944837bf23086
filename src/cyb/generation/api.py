"""Generation with pauses: fixed (Recipe 1) or adaptive (Recipe 2), greedy or sampled, streamed.

::

    from cyb import PauseModel
    from cyb.generation import generate, stream

    model = PauseModel.from_pretrained("runs/cyb/final").eval()
    [res] = generate(model, "12+34=", max_new_tokens=8)
    res.text, res.token_ids, res.steps, res.d, res.expected_steps

    s = stream(model, ["a prompt", "another"], mode="adaptive", sample=True, seed=0)
    for event in s:                       # one TokenEvent per new token, as soon as it is decided
        print(event.text, end="", flush=True)
    s.results                             # the GenerationResults, once the stream is exhausted

**Fixed mode** (default, the paper's inference): every prompt token is followed by its ``M-1``
pauses and the prompt runs in one pass; after that, each new real token and its ``M-1`` pauses
go through the network in one forward of ``M`` positions (their inputs are known), and the
sequential readout of that block decides the next token: greedy (at step ``i`` the argmax over
``{dk} U V``, dk -> step ``i+1``, at step ``M`` the argmax without dk) or sampled (dk with
probability ``d_i``, else a token from the tempered, top-k/top-p filtered distribution without
dk).  Cost per token: one forward of ``M`` positions; the KV cache grows by ``M`` per token.

**Adaptive mode**: pauses are fed only when the readout says dk, one step per forward, at most
``M`` steps per token.  The prompt keeps all ``M-1`` pauses on every token but the last (what
the model saw in Recipe 1 training; the first decision, on the last prompt token, is already
adaptive).  Models without dk (TBYS) read out at step ``M`` and so always take ``M`` steps;
baselines (``M = 1``) take one.

**Decoders** (``decoder=``): by default the engine (:mod:`cyb.engine`) runs the prompts: up to
``max_batch`` rows decode at once, each advancing on its own (one position per step in adaptive
mode, so a token without pauses costs one position), a finished row's slot goes to the next
prompt at once, and on CUDA every decoding step is a CUDA graph.  ``decoder="eager"`` runs
left-padded batches on a growing ``DynamicCache`` instead (:mod:`cyb.generation.decoders`).
Every decoder makes the same decisions, greedy or sampled: prompt ``i`` of a call draws its
random numbers from its own stream (from ``seed`` and ``i``), so its text does not depend on
the other prompts, the batch or the decoder.  Pause ids are never produced as tokens.  Decoding
uses the model as it is: call ``model.eval()`` first (dropout).  See :mod:`cyb.generation` for
the parts.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator, Literal

import torch

from ..decision import row_keys
from ..engine import Engine, EngineOptions, Request
from ..engine.layout import RowLayout
from ..layout import left_pad
from ..model import hf as _hf
from .decoders import StepOutput, StepReadout
from .registry import DECODERS, DEFAULT, MODES, REGISTRY, make_decoder, resolve_decoder
from .text import TextStream, decode_fn, encode_prompt, split_prompts


@dataclass(frozen=True)
class GenerationConfig:
    """How to generate (validated on construction; ``dataclasses.replace`` re-validates).

    Attributes:
        mode: ``"fixed"`` (Recipe 1: all ``M-1`` pauses after every token, one forward of ``M``
            positions per token) or ``"adaptive"`` (Recipe 2: a pause only after a dk).
        max_new_tokens: real tokens to generate at most per prompt (>= 1), EOS included.
        sample: sample instead of the greedy sequential decision.
        temperature: >= 0; divides the token logits when sampling (not ``d``); 0 is greedy.
        top_k: keep the ``k`` most likely tokens when sampling (None or 0: all).
        top_p: nucleus sampling, in (0, 1] (None or 1: off).
        seed: the sampler's seed: prompt ``i`` draws from the stream of ``(seed, i)``
            (:func:`cyb.decision.row_keys`; None: fresh random streams).
        stop: stop strings; generation of a row ends when its text contains one, and its
            text is cut before it (the ids keep the token that completed it).
        eos_token_ids: ids that end a row (kept as its last token).  None: the tokenizer's and
            the model config's EOS ids; ``()``: never stop on EOS.
        decoder: which decode loop runs (all make the same decisions; the names and their
            rules are those of :mod:`cyb.generation.registry`): ``"graph"`` a preallocated KV
            cache with the decode step captured as a CUDA graph (CUDA only; full-attention
            models); ``"static"`` the same decoder without the graph (any device); ``"eager"``
            a growing ``DynamicCache`` (every model and device); ``"auto"`` (default) ``graph``
            on CUDA, ``static`` elsewhere, ``eager`` where the engine cannot run the model.
        max_batch: prompts that decode at once at most (the engine's slots; more wait for a
            free slot).
    """

    mode: Literal["fixed", "adaptive"] = "fixed"
    max_new_tokens: int = 64
    sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    eos_token_ids: tuple[int, ...] | None = None
    decoder: str = DEFAULT
    max_batch: int = 256

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {self.decoder!r}")
        for name in ("max_new_tokens", "max_batch"):
            n = getattr(self, name)
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        k = self.top_k
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 0):
            raise ValueError(f"top_k must be an integer >= 0 (0: off) or None, got {k!r}")
        p = self.top_p
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0):
            raise ValueError(f"top_p must lie in (0, 1] or be None, got {p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {list(stop)!r}")
        object.__setattr__(self, "stop", stop)
        if self.eos_token_ids is not None:
            eos = (self.eos_token_ids,) if isinstance(self.eos_token_ids, int) else tuple(self.eos_token_ids)
            if any(not isinstance(e, int) or isinstance(e, bool) or e < 0 for e in eos):
                raise ValueError(f"eos_token_ids must be non-negative integer ids, got {list(eos)!r}")
            object.__setattr__(self, "eos_token_ids", eos)

    def to_dict(self) -> dict:
        """JSON-ready fields (tuples as lists)."""
        out = dataclasses.asdict(self)
        out["stop"] = list(self.stop)
        out["eos_token_ids"] = None if self.eos_token_ids is None else list(self.eos_token_ids)
        return out


@dataclass(frozen=True)
class TokenEvent:
    """One new real token of one prompt, as soon as it is decided.

    Attributes:
        row: index of the prompt.
        index: 0-based index of the token among the prompt's new tokens.
        token_id: the token.
        steps: steps it used, ``1..M`` (``steps - 1`` pauses).
        text: text released with it; may be empty while text that could start a stop string
            (or an incomplete character) is held back; None without a tokenizer.
        finished: whether this is the prompt's last token.
        stop_reason: ``"eos"``, ``"stop"`` or ``"length"`` when finished, else None.
    """

    row: int
    index: int
    token_id: int
    steps: int
    text: str | None
    finished: bool = False
    stop_reason: str | None = None


@dataclass
class GenerationResult:
    """The generation of one prompt.

    Attributes:
        prompt: the prompt as given (text, or a list of ids).
        prompt_ids: its token ids.
        token_ids: the generated ids (an EOS that ended generation included).
        text: their text without special tokens, cut before a stop string; None without a
            tokenizer.
        steps: steps used by each generated token, ``1..M``.
        d: per token the ``M`` values ``d_1..d_M`` (probability of dk at each step under the
            dk prior; ``d_M = 0``; 1 before ``M`` for models without dk).  Adaptive mode: NaN
            for the steps before ``M`` that were never run.
        expected_steps: per token ``E[S]`` of its block (:func:`cyb.losses.expected_stop_step`;
            ``E[S] - 1`` is the paper's expected pauses); fixed mode only, else None.
        stop_reason: ``"eos"``, ``"stop"`` (a stop string) or ``"length"`` (max_new_tokens).
        mode: ``"fixed"`` or ``"adaptive"``.
        num_steps: ``M`` of the model.
        positions: positions of this row that went through the network, prompt included.
    """

    prompt: object
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str | None = None
    steps: list[int] = field(default_factory=list)
    d: list[list[float]] = field(default_factory=list)
    expected_steps: list[float] | None = None
    stop_reason: str | None = None
    mode: str = "fixed"
    num_steps: int = 1
    positions: int = 0

    @property
    def mean_steps(self) -> float:
        """Mean steps used per generated token (NaN when nothing was generated)."""
        return sum(self.steps) / len(self.steps) if self.steps else math.nan

    def to_dict(self) -> dict:
        """JSON-ready (NaN as None; a tensor prompt as a list of ids)."""
        prompt = self.prompt.tolist() if isinstance(self.prompt, torch.Tensor) else self.prompt
        return {
            "prompt": prompt if isinstance(prompt, str) else list(prompt),
            "prompt_ids": list(self.prompt_ids),
            "text": self.text,
            "token_ids": list(self.token_ids),
            "steps": list(self.steps),
            "d": [[None if math.isnan(x) else x for x in row] for row in self.d],
            "expected_steps": self.expected_steps,
            "stop_reason": self.stop_reason,
            "mode": self.mode,
            "num_steps": self.num_steps,
            "positions": self.positions,
        }


class GenerationStream:
    """Iterator of :class:`TokenEvent`; :attr:`results` holds the :class:`GenerationResult`
    list once the iterator is exhausted (None before).  :attr:`partial` holds the same results
    while they are filled, in the order of the prompts: a prompt's result is complete once its
    last event (``finished``) has come."""

    def __init__(self, events: Iterator[TokenEvent], partial: list[GenerationResult]) -> None:
        self._events = events
        self.partial = partial
        self.results: list[GenerationResult] | None = None

    def __iter__(self) -> "GenerationStream":
        return self

    def __next__(self) -> TokenEvent:
        try:
            return next(self._events)
        except StopIteration as end:
            self.results = end.value
            raise


def stream(model, prompts, config: GenerationConfig | None = None, *,
           generator: torch.Generator | None = None, engine_options: EngineOptions | None = None,
           **overrides) -> GenerationStream:
    """Generate for ``prompts``, yielding a :class:`TokenEvent` per new token as it is decided.

    Args:
        model: a :class:`cyb.PauseModel`.
        prompts: a prompt or a list of prompts; a prompt is text (needs the model's tokenizer)
            or token ids (a list of ints or a 1-D tensor).  A 2-D tensor is a batch of prompts.
            Text the model cannot read (characters its tokenizer lacks, or that its synthetic
            task never had: :attr:`cyb.PauseModel.trained_on`) raises
            :class:`cyb.data.tokenizer.UnencodableText`, a ValueError naming them.
        config: a :class:`GenerationConfig`; ``overrides`` (its field names) replace fields.
        generator: a CPU ``torch.Generator`` from which the prompts' random streams are drawn
            when sampling (default: from ``config.seed``).
        engine_options: how the engine runs (:class:`cyb.engine.EngineOptions`: cache memory,
            positions per step, prefill chunks...); ``max_batch`` sets its ``max_slots``.

    Returns:
        a :class:`GenerationStream`.  Prompts and options are checked at once; the model runs
        as the stream is iterated.  Events come in the order tokens are decided (prompts finish
        in any order); :attr:`GenerationStream.results` are in the order of ``prompts``.
    """
    cfg = _config(config, overrides)
    rows, encoded, keys = _prepare(model, split_prompts(prompts), cfg, generator)
    kind = resolve_decoder(model, cfg.decoder)
    if REGISTRY[kind].engine:
        options = dataclasses.replace(engine_options or EngineOptions(), max_slots=cfg.max_batch,
                                      cuda_graph=REGISTRY[kind].needs_cuda)
        return GenerationStream(_run_engine(model, rows, encoded, keys, cfg, options), [r.result for r in rows])
    readout = StepReadout(model.vocab, model.dk_bias, sample=cfg.sample, temperature=cfg.temperature,
                          top_k=cfg.top_k or None, top_p=cfg.top_p,
                          keys=None if keys is None else torch.tensor(keys, dtype=torch.long))
    return GenerationStream(_run_decoder(model, rows, encoded, readout, cfg), [r.result for r in rows])


def generate(model, prompts, config: GenerationConfig | None = None, *,
             on_token: Callable[[TokenEvent], None] | None = None,
             generator: torch.Generator | None = None, engine_options: EngineOptions | None = None,
             **overrides) -> list[GenerationResult]:
    """Generate for ``prompts`` (see :func:`stream`) and return one result per prompt, in order.

    ``on_token`` is called with each :class:`TokenEvent` as soon as its token is decided.
    """
    s = stream(model, prompts, config, generator=generator, engine_options=engine_options, **overrides)
    for event in s:
        if on_token is not None:
            on_token(event)
    return s.results


# --------------------------------------------------------------------------- internals


def _config(config: GenerationConfig | None, overrides: dict) -> GenerationConfig:
    if config is None:
        config = GenerationConfig()
    elif not isinstance(config, GenerationConfig):
        raise TypeError(f"config must be a GenerationConfig, got {type(config).__name__}")
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(GenerationConfig)})
    if unknown:
        names = [f.name for f in dataclasses.fields(GenerationConfig)]
        raise TypeError(f"unknown generation option(s) {unknown}; known: {names}")
    return dataclasses.replace(config, **overrides) if overrides else config


def default_eos_ids(model) -> tuple[int, ...]:
    """EOS ids of the tokenizer and of the model's (generation) config, within the vocabulary."""
    found: list[int] = []

    def add(value) -> None:
        if value is None:
            return
        for v in (value if isinstance(value, (list, tuple, set)) else [value]):
            if isinstance(v, int) and not isinstance(v, bool) and v not in found:
                found.append(v)

    tok = model.tokenizer
    if tok is not None:
        add(getattr(tok, "eos_token_id", None))
        add(getattr(tok, "eos_id", None))
    add(getattr(getattr(model.hf_model, "generation_config", None), "eos_token_id", None))
    add(getattr(_hf.text_config(model.config), "eos_token_id", None))
    special = model.vocab.special_ids
    return tuple(e for e in found if 0 <= e < model.vocab.vocab_size and e not in special)


def _check_positions(model, encoded: list[list[int]], cfg: GenerationConfig) -> None:
    """Raise before running if the longest prompt plus ``max_new_tokens`` would need positions
    beyond the model's ``max_position_embeddings``."""
    limit = getattr(_hf.text_config(model.config), "max_position_embeddings", None)
    layout = RowLayout.of(model.vocab, model.pause_visibility)
    layout.check_positions(max(len(ids) for ids in encoded), cfg.max_new_tokens, limit)


class _Row:
    """Host-side bookkeeping of one prompt: tokens, stop conditions, text."""

    def __init__(self, index: int, result: GenerationResult, text: TextStream | None,
                 eos: frozenset, max_new_tokens: int) -> None:
        self.index, self.result, self.text = index, result, text
        self.eos, self.max_new_tokens = eos, max_new_tokens
        self.finished = False

    def add(self, token: int, steps: int, d: list[float], expected: float | None) -> TokenEvent:
        r = self.result
        r.token_ids.append(token)
        r.steps.append(steps)
        r.d.append(d)
        if expected is not None:
            r.expected_steps.append(expected)
        piece, reason = None, None
        if self.text is not None:
            piece, hit = self.text.push(token)
            reason = "stop" if hit else None
        if reason is None and token in self.eos:
            reason = "eos"
        if reason is None and len(r.token_ids) >= self.max_new_tokens:
            reason = "length"
        if reason is not None:
            self.finished = True
            r.stop_reason = reason
            if self.text is not None:
                piece += self.text.flush()
                r.text = self.text.text
        return TokenEvent(self.index, len(r.token_ids) - 1, token, steps, piece, self.finished, reason)


def _prepare(model, prompts: list, cfg: GenerationConfig, generator: torch.Generator | None):
    """Validate and encode everything before any forward: ``(rows, encoded ids, stream keys or
    None when no decision is random)``."""
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    tok = model.tokenizer
    decode = decode_fn(tok)
    if cfg.stop and decode is None:
        raise ValueError("stop strings need a tokenizer (the model has none)")
    trained_on = getattr(model, "trained_on", None)
    encoded = [encode_prompt(tok, p, i, trained_on=trained_on) for i, p in enumerate(prompts)]
    vocab = model.vocab
    for i, ids in enumerate(encoded):
        try:
            vocab.check_real_ids(torch.tensor(ids))
        except ValueError as e:
            raise ValueError(f"prompt {i}: {e}") from None
    _check_positions(model, encoded, cfg)
    if generator is not None and generator.device.type != "cpu":
        raise ValueError(f"generator must be a CPU torch.Generator, got one on {generator.device}")
    if model.hf_model.training:
        warnings.warn("generating with a model in training mode (dropout on); call model.eval()",
                      stacklevel=4)
    keys = None
    if cfg.sample and cfg.temperature > 0:
        keys = row_keys(len(prompts), seed=None if generator is not None else cfg.seed, generator=generator)
    eos = frozenset(default_eos_ids(model) if cfg.eos_token_ids is None else cfg.eos_token_ids)
    rows = [
        _Row(i, GenerationResult(prompt=p, prompt_ids=ids, mode=cfg.mode, num_steps=vocab.num_steps,
                                 expected_steps=[] if cfg.mode == "fixed" else None,
                                 text="" if decode is not None else None),
             TextStream(decode, cfg.stop) if decode is not None else None, eos, cfg.max_new_tokens)
        for i, (p, ids) in enumerate(zip(prompts, encoded))
    ]
    return rows, encoded, keys


def _run_engine(model, rows: list[_Row], encoded: list[list[int]], keys: list[int] | None,
                cfg: GenerationConfig, options: EngineOptions) -> Iterator[TokenEvent]:
    """Every prompt as a request of one :class:`cyb.engine.Engine`; a row whose text hits a stop
    string ends its request.  Events are yielded outside ``torch.inference_mode`` (the engine
    enters it per step), so that the caller's code between tokens runs normally."""
    requests = [Request(tuple(ids), cfg.max_new_tokens, mode=cfg.mode, sample=cfg.sample,
                        temperature=cfg.temperature, top_k=cfg.top_k or 0, top_p=cfg.top_p or 1.0,
                        key=keys[i] if keys is not None else 0, eos=row.eos)
               for i, (ids, row) in enumerate(zip(encoded, rows))]
    with torch.inference_mode():
        engine = Engine.sized_for(model, requests, options=options)
    index = {engine.submit(r): row for r, row in zip(requests, rows)}
    for rid, row in index.items():
        row.result.positions = engine.positions(rid)
    while engine.busy:
        for e in engine.step():
            row = index[e.request]
            event = row.add(e.token, e.steps, list(e.d), e.expected_steps)
            row.result.positions = e.positions
            if row.finished and e.finished is None:
                engine.abort(e.request, "stop")
            yield event
    return [row.result for row in rows]


def _run_decoder(model, rows: list[_Row], encoded: list[list[int]], readout: StepReadout,
                 cfg: GenerationConfig) -> Iterator[TokenEvent]:
    """The eager decoders over left-padded batches of at most ``max_batch`` prompts, one batch
    after another (each prompt keeps its own random stream)."""
    for start in range(0, len(rows), cfg.max_batch):
        part = copy.copy(readout)
        if readout.keys is not None:
            part.keys = readout.keys[start:start + cfg.max_batch]
        yield from _run_batch(model, rows[start:start + cfg.max_batch], encoded[start:start + cfg.max_batch],
                              part, cfg)
    return [row.result for row in rows]


def _run_batch(model, rows: list[_Row], encoded: list[list[int]], readout: StepReadout,
               cfg: GenerationConfig) -> Iterator[TokenEvent]:
    """One eager decoder over a left-padded batch: one forward and one host read per step;
    events are yielded outside ``torch.inference_mode`` so that the caller's code between
    tokens runs normally."""
    with torch.inference_mode():
        ids, mask = left_pad(encoded, model.device)
        decoder = make_decoder(model, ids, mask, readout, mode=cfg.mode)
        out = decoder.start()
        for row, n in zip(rows, decoder.prompt_positions.tolist()):
            row.result.positions = n
    active = list(range(len(rows)))  # prompt index of each batch row
    while True:
        yield from _collect(out, [rows[i] for i in active])
        keep = [j for j, i in enumerate(active) if not rows[i].finished]
        if not keep:
            break
        with torch.inference_mode():
            if len(keep) < len(active) and not decoder.keeps_rows:
                decoder.keep(keep)  # finished rows leave the batch, cache included
                active = [active[j] for j in keep]
            out = decoder.step()
        per_row = getattr(decoder, "last_positions", None)  # positions that differ by row
        for j, i in enumerate(active):
            if not rows[i].finished:
                rows[i].result.positions += per_row[j] if per_row is not None else decoder.positions_per_step


def _collect(out: StepOutput, batch: list[_Row]) -> list[TokenEvent]:
    """Move one step's decisions to the host (one read per step: ids, steps and ``d`` in one
    float64 tensor, exact for ids below 2**53 and for float32 values) and update the rows."""
    cols = [out.answered.double().unsqueeze(1), out.token.double().unsqueeze(1),
            out.steps.double().unsqueeze(1), out.d.double()]
    if out.expected_steps is not None:
        cols.append(out.expected_steps.double().unsqueeze(1))
    m = out.d.shape[1]
    events = []
    for row, values in zip(batch, torch.cat(cols, 1).tolist()):
        if values[0] and not row.finished:  # a static batch keeps its finished rows
            expected = values[3 + m] if out.expected_steps is not None else None
            events.append(row.add(int(values[1]), int(values[2]), values[3:3 + m], expected))
    return events

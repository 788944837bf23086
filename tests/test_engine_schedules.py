"""The engine under traffic: seeded random schedules against the no-cache reference.

Each schedule draws a model (every pause layout and position scheme on Llama, and Gemma 3 with
sliding windows of 4 under shared and private pauses), engine options (1-8 slots, prefill
chunks of 2-8 columns, 1-4 rows per prefill forward, refill thresholds, attention buckets that
change with the columns in use, one position or whole blocks per step, cache blocks of 1-16
columns, prefix caching on or off, and in about half the schedules a cache of one to two rows,
so that rows are preempted and cached prefixes evicted) and 3-9 requests (prompts of 1-24
tokens, so several prefill chunks, many of them beginning with one of a few shared stems, some
repeated whole; 1-12 new tokens; fixed or adaptive mode; greedy or sampled with their own keys,
temperatures, top-k and top-p) that arrive while others decode.  Some end at an EOS taken from
their own answer, some are aborted after a few tokens; rows finish at different times, so slots
are reused and decoding rows are compacted.  Half the schedules run with the host reading one
step behind (as on CUDA) on the CPU too.

Every request's tokens, steps and ``d`` must be the reference's for its prompt alone, cut where
it ended.  The same schedules run on the CPU in the suite and on CUDA under ``-m gpu`` (steps
captured as graphs, the host reading one step behind).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random

import pytest
import torch

from cyb.engine import Engine, EngineOptions, Request
from cyb.engine.layout import RowLayout
from engine_helpers import LAYOUTS, M, Sampling, assert_same, layout_model, reference, sliding_model
from generation_helpers import encode

pytestmark = pytest.mark.usefixtures("one_thread")

SCHEDULES = 24
#: schedules under memory pressure (seeds from SCHEDULES on): a cache of one row, requests with
#: short prompts and long answers that arrive together into at least four slots
PRESSURED = 12
MODELS = [f"llama-{v}-{s}" for v, s in LAYOUTS] + ["gemma3-shared", "gemma3-private"]


@functools.lru_cache(maxsize=None)
def schedule_model(name: str, device: str):
    """A test model by name, float32 on ``device`` (built once per session)."""
    family, visibility = name.split("-")[:2]
    if family == "llama":
        pm = layout_model(visibility, scheme=name.split("-")[2])
    else:
        pm = sliding_model("gemma3", visibility)
    return pm.to(device)


@dataclasses.dataclass
class Planned:
    """One request of a schedule: what it asks, when it arrives (engine steps), and how it ends
    early (an EOS index into its own reference answer, or an abort after some tokens)."""

    prompt: tuple
    max_new: int
    mode: str
    sampling: Sampling
    key: int
    arrive: int
    eos_at: int | None = None
    abort_after: int | None = None


@dataclasses.dataclass
class Schedule:
    model: str
    options: EngineOptions
    requests: list
    #: the cache in rows of the engine's capacity (None: as large as the slots need)
    cache_rows: float | None = None
    lookahead: bool = False


STEMS = ["hello world ", "12+34=", "the quick brown fox "]


def make_schedule(seed: int) -> Schedule:
    rng = random.Random(seed)
    model = MODELS[seed % len(MODELS)]
    pressured = seed >= SCHEDULES
    options = EngineOptions(
        max_slots=rng.randint(4 if pressured else 1, 8), prefill_chunk=rng.choice([2, 3, 5, 8]), prefill_rows=rng.choice([1, 2, 4]),
        refill=rng.choice([0, 1, 2]), attention_bucket=rng.choice([4, 8, 16]),
        bucket_min_rows=rng.choice([1, 2, 8]), positions=rng.choice(["one", "block"]),
        block_size=rng.choice([1, 2, 4, 16]), prefix_caching=rng.random() < 0.8,
        capacity_multiple=rng.choice([1, 8]))
    vocab = "0123456789+-=abcdefghijklmnopqrstuvwxyz "
    requests = []
    for i in range(rng.randint(3, 9)):
        text = "".join(rng.choices(vocab, k=rng.randint(1, 12 if pressured else 24)))
        if requests and rng.random() < 0.15:
            prompt = rng.choice(requests).prompt  # a prompt again
        else:
            if rng.random() < 0.5:
                text = (rng.choice(STEMS) + text)[:24]
            prompt = tuple(encode(text))
        sampled = rng.random() < 0.5
        sampling = (Sampling(True, rng.choice([0.7, 1.0, 1.3]), rng.choice([0, 5, 20]), rng.choice([1.0, 0.9, 0.6]))
                    if sampled else Sampling())
        p = Planned(prompt, rng.randint(8 if pressured else 1, 12), rng.choice(["fixed", "adaptive"]), sampling, rng.randrange(1 << 30),
                    arrive=0 if i < 2 else rng.randint(0, 4 if pressured else 30))
        ending = rng.random()
        if ending < 0.2:
            p.eos_at = rng.randrange(p.max_new)
        elif ending < 0.35:
            p.abort_after = rng.randint(1, p.max_new)
        requests.append(p)
    cache_rows = 1.0 if pressured else rng.choice([1.0, 1.0, 1.25]) if rng.random() < 0.5 else None
    return Schedule(model, options, requests, cache_rows, rng.random() < 0.5)


_REFERENCES: dict = {}


def reference_of(pm, name: str, p: Planned):
    """The no-cache reference of ``p`` alone (kept per model and request)."""
    key = (name, str(pm.device), p.prompt, p.max_new, p.mode, dataclasses.astuple(p.sampling), p.key)
    if key not in _REFERENCES:
        _REFERENCES[key] = reference(pm, list(p.prompt), p.max_new, p.mode, p.sampling, p.key)
    return _REFERENCES[key]


def drive(pm, sched: Schedule, wants: list):
    """Run ``sched`` through one engine; returns per request ``(tokens, steps, d, reason)``."""
    layout = RowLayout.of(pm.vocab, pm.pause_visibility)
    reqs = []
    for p, want in zip(sched.requests, wants):
        eos = frozenset() if p.eos_at is None else frozenset({want[0][p.eos_at]})
        s = p.sampling
        reqs.append(Request(p.prompt, p.max_new, mode=p.mode, sample=s.sample, temperature=s.temperature,
                            top_k=s.top_k, top_p=s.top_p, key=p.key, eos=eos))
    capacity = max(layout.columns_needed(len(r.prompt), r.max_new_tokens) for r in reqs)
    q = 1 if sched.options.positions == "one" else M
    options = sched.options
    if sched.cache_rows is not None:  # a cache of so many rows of the engine's capacity
        block, mult = options.block_size, math.lcm(options.capacity_multiple, options.block_size)
        row = -(-(capacity + 2 * q) // mult) * mult // block  # (the engine's capacity, in blocks)
        options = dataclasses.replace(options, cache_blocks=int(row * sched.cache_rows))
    engine = Engine(pm, capacity=capacity, slots=options.max_slots, positions=q, options=options)
    if pm.device.type == "cpu":  # (on CUDA the host always reads one step behind)
        engine._set_lookahead(sched.lookahead)
    order = sorted(range(len(reqs)), key=lambda i: sched.requests[i].arrive)
    got = {i: ([], [], [], None) for i in range(len(reqs))}
    index: dict[int, int] = {}
    step = 0
    while order or engine.busy:
        while order and sched.requests[order[0]].arrive <= step:
            i = order.pop(0)
            index[engine.submit(reqs[i])] = i
        for e in engine.step():
            i = index[e.request]
            tokens, steps, d, reason = got[i]
            if reason is not None:
                raise AssertionError(f"request {i} decided a token after it ended ({reason})")
            tokens.append(e.token), steps.append(e.steps), d.append(list(e.d))
            reason = e.finished
            if reason is None and sched.requests[i].abort_after == len(tokens):
                engine.abort(e.request)
                reason = "abort"
            got[i] = (tokens, steps, d, reason)
        step += 1
        assert step < 5000, "the schedule did not finish"
    assert engine.slots_in_use == 0 and engine.queued == 0 and engine.free_blocks == engine.num_blocks
    return got, engine


def check_schedule(seed: int, device: str) -> None:
    sched = make_schedule(seed)
    pm = schedule_model(sched.model, device)
    wants = [reference_of(pm, sched.model, p) for p in sched.requests]
    got, engine = drive(pm, sched, wants)
    for i, (p, want) in enumerate(zip(sched.requests, wants)):
        tokens, steps, d, reason = got[i]
        n = len(tokens)
        if p.eos_at is not None:
            cut = want[0].index(want[0][p.eos_at]) + 1
            assert (n, reason) == (cut, "eos"), (i, p)
        elif p.abort_after is not None:
            assert (n, reason) == (p.abort_after, "abort" if p.abort_after < p.max_new else "length"), (i, p)
        else:
            assert (n, reason) == (p.max_new, "length"), (i, p)
        try:
            assert_same((tokens, steps, d), tuple(x[:n] for x in want))
        except AssertionError as e:
            raise AssertionError(f"schedule {seed} ({sched.model}, {sched.options}, cache rows {sched.cache_rows}, "
                                 f"lookahead {sched.lookahead}), request {i} {p}: {e}") from e
    return engine.stats


_SEEN: dict = {}


@pytest.mark.parametrize("seed", range(SCHEDULES + PRESSURED))
def test_random_schedules_equal_the_reference(seed):
    _SEEN[seed] = check_schedule(seed, "cpu")


def test_schedules_preempt_hit_and_evict():
    """Across the schedules (those of this session; all of them when run alone), rows were
    preempted, prompts found cached blocks and cached blocks were evicted."""
    for seed in range(SCHEDULES + PRESSURED):
        if seed not in _SEEN:
            _SEEN[seed] = check_schedule(seed, "cpu")
    names = ("preemptions", "prefix_hit_blocks", "prefix_evictions")
    total = {k: sum(s[k] for s in _SEEN.values()) for k in names}
    assert all(v > 0 for v in total.values()), total
    assert sum(s["preemptions"] > 0 for s in _SEEN.values()) >= PRESSURED // 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("seed", range(SCHEDULES + PRESSURED))
def test_random_schedules_equal_the_reference_on_cuda(seed):
    check_schedule(seed, "cuda")


def test_schedules_cover_what_traffic_does():
    """The schedules reach every case they are meant to: waiting rows, reused slots, chunked
    prompts, compaction, early ends of both kinds, mixed modes, every model."""
    seen = {"models": set(), "eos": 0, "abort": 0, "late": 0, "waited": 0, "chunked": 0, "mixed modes": 0,
            "small cache": 0, "lookahead": 0, "shared stems": 0, "repeated": 0, "no prefix caching": 0}
    for seed in range(SCHEDULES):
        s = make_schedule(seed)
        seen["models"].add(s.model)
        seen["eos"] += sum(p.eos_at is not None for p in s.requests)
        seen["abort"] += sum(p.abort_after is not None for p in s.requests)
        seen["late"] += sum(p.arrive > 0 for p in s.requests)
        seen["waited"] += len(s.requests) > s.options.max_slots
        seen["chunked"] += any(len(p.prompt) > 2 * s.options.prefill_chunk for p in s.requests)
        seen["mixed modes"] += len({p.mode for p in s.requests}) == 2
        seen["small cache"] += s.cache_rows is not None
        seen["lookahead"] += s.lookahead
        prompts = [p.prompt for p in s.requests]
        seen["shared stems"] += sum(any(tuple(encode(stem)) == p[:len(stem)] for stem in STEMS) for p in prompts) >= 2
        seen["repeated"] += len(set(prompts)) < len(prompts)
        seen["no prefix caching"] += not s.options.prefix_caching
    assert seen["models"] == set(MODELS)
    assert min(v for k, v in seen.items() if k != "models") >= 3, seen


def test_compaction_keeps_a_sliding_window_row_private(monkeypatch):
    """One long prompt beside three that end after one token: the long row moves from the last
    slot to the first, and decodes what it decodes alone (private pauses under sliding windows
    read each column's position, which moves with the row)."""
    pm = schedule_model("gemma3-private", "cpu")
    long = tuple(encode("the quick brown fox 12"))
    plans = [Planned(tuple(encode("1+2")), 1, "adaptive", Sampling(), 1, 0) for _ in range(3)]
    plans.append(Planned(long, 10, "adaptive", Sampling(), 2, 0))
    sched = Schedule("gemma3-private", EngineOptions(max_slots=4, bucket_min_rows=1), plans)
    wants = [reference_of(pm, sched.model, p) for p in plans]
    moves = []
    original = Engine._compact

    def spy(self):
        before = {t.id: t.slot for t in self.scheduler.decoding.values()}
        original(self)
        moves.extend((before[t.id], t.slot) for t in self.scheduler.decoding.values() if before[t.id] != t.slot)

    monkeypatch.setattr(Engine, "_compact", spy)
    got, _ = drive(pm, sched, wants)
    assert (3, 0) in moves
    assert_same(got[3][:3], wants[3])

"""``cyb bench serve``: the server under load, against the engine offline on the same prompts.

Cases: a model without pauses (``none``, M = 1) and pause models with shared or private pauses,
in fixed or adaptive mode (``shared-fixed``, ``shared-adaptive``, ``private-fixed``,
``private-adaptive``).  By default the models are the benchmark Llama (134 M on CUDA, a tiny
one with ``quick``) with random weights; adaptive rows use a dk prior that makes a given share
of step-1 decisions say dk (:func:`cyb.bench.models.adaptive_fixture`), so pauses are taken as
the model decides.  Each case:

1. ``cyb serve`` runs the case's model (saved to a temporary folder) in a child process on
   127.0.0.1, so that the load client here does not share its interpreter (``server="thread"``
   runs it in a thread of this process instead: quicker to start, for smoke runs).  Its slots
   are the largest concurrency, its rows hold the longest prompt and answer.
2. For each concurrency ``C``: ``C`` warm-up requests of the longest prompt and answer (they
   capture the CUDA graphs the load will use), then ``requests`` streamed requests whose prompts
   (token ids) and answer lengths come from a seeded mix, greedy, EOS ignored so every request
   decodes its whole answer.  Arrivals are closed-loop (``C`` clients, each sending its next
   request when its last one ends) or Poisson (at ``rate`` per second, at most ``C`` in flight).
   The clients run in one process per :data:`~cyb.bench.load.STREAMS_PER_CLIENT` streams
   (:mod:`cyb.bench.load`; closed-loop ones take from one shared list), so that the client is
   never the limit.  Measured by the client
   (:mod:`cyb.serve.client`): new tokens per second (from the first send to the last token),
   time to first token, the gaps between a stream's events (inter-token latency; an event
   carries every token decided since the one before) and the time per output token of each
   request, as p50 / p99.
3. In this process, the same prompts and answers: the engine offline (one
   :class:`cyb.engine.Engine` with ``C`` slots and the server's options, every request submitted
   at once: what the server's engine does with nothing between it and the requests; readied as
   the server is, by :meth:`~cyb.engine.Engine.warm_up` and the same warm-up requests, and the
   time of any graph capture that readying did not make left out), and
   :func:`cyb.generation.generate` in static batches of ``C`` prompts, each batch decoding to its
   longest answer (the tokens counted are the answers'; each call builds its own engine, whose
   graph captures are left out likewise, and reported beside).
4. A ceiling of the offline job: the engine's steady decoding step with ``C`` rows and its
   prefill rate (:func:`cyb.bench.engine_runs.steady_rates`), and from them the job's prompts
   prefilled at that rate plus its decode steps at that step time, as if every slot were busy in
   every step (:func:`cyb.bench.engine_runs.ceiling_tokens_per_s`).

Targets (:func:`serve_targets`), at the largest concurrency: the server's throughput at least 0.9
x the engine's offline throughput, and p99 inter-token latency at most 3 x its p50, in every case;
the engine offline at least 1.7 x static batches without pauses and 1.5 x with shared pauses in
fixed mode, and at least 0.5 x its ceiling without pauses; private pauses in adaptive mode at least
0.85 / E[S] x the throughput without pauses (``E[S]``: the engine's steps per token).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

from ..runtime import resolve_device
from .models import DTYPES, SHAPE_134M, SHAPE_TINY, ModelShape, adaptive_fixture, build_hf_model
from .models import random_ids, real_ids_limit, spread_weights, wrap
from .load import NAME, ServerProbe, client_processes, job, load_from_processes, summarise
from .offline import offline_engine, static_generate
from .timing import Budget, environment, free_memory, guarded, write_json

CASES = ("none", "shared-fixed", "shared-adaptive", "private-fixed", "private-adaptive")
ARRIVALS = ("closed", "poisson")
SERVERS = ("process", "thread")
#: serve throughput / engine offline throughput at the largest concurrency
THROUGHPUT_RATIO = 0.9
#: p99 / p50 of the inter-token latency at the largest concurrency
ITL_RATIO = 3.0
#: engine offline / generate() in static batches at the largest concurrency, by case
STATIC_RATIO = {"none": 1.7, "shared-fixed": 1.5}
#: engine offline / its ceiling at the largest concurrency, without pauses
CEILING_RATIO = 0.5
#: private pauses in adaptive mode: engine offline / (no pauses' engine offline / E[S])
ADAPTIVE_RATIO = 0.85


@dataclass
class ServeBenchConfig:
    """What to measure."""

    shape: ModelShape = SHAPE_134M
    vocab: int = 32768
    num_steps: int = 4
    dtype: str = "bf16"
    cases: tuple = CASES
    concurrency: tuple = (1, 16, 64, 256)
    requests: int | None = None  # per concurrency; None: max(2 C, 8)
    arrivals: str = "closed"
    rate: float | None = None  # Poisson: requests per second
    prompt_lengths: tuple = (16, 512)
    answer_lengths: tuple = (8, 256)
    pause_fraction: float = 0.1
    offline: bool = True
    static: bool = True
    ceiling: bool = True
    steady_steps: int = 50  # timed steps of the ceiling's steady rate
    server: str = "process"
    client_processes: int | None = None  # None: one per STREAMS_PER_CLIENT streams
    http_processes: int | None = None  # cyb serve --http-processes (None: its default; server "process" only)
    model: str | None = None
    seed: int = 0
    device: str | None = None
    budget_s: float | None = None

    @classmethod
    def quick(cls, **overrides) -> "ServeBenchConfig":
        """Tiny shapes on the CPU, the server in a thread (a smoke run)."""
        base = dict(shape=SHAPE_TINY, vocab=256, num_steps=3, dtype="fp32", concurrency=(1, 4), requests=6,
                    prompt_lengths=(2, 12), answer_lengths=(2, 8), pause_fraction=0.5, server="thread",
                    device="cpu", steady_steps=8)
        base.update(overrides)
        return cls(**base)

    def validate(self) -> "ServeBenchConfig":
        bad = [c for c in self.cases if c not in CASES]
        if bad or not self.cases:
            raise ValueError(f"cases: choose one or more of {', '.join(CASES)}, got {list(self.cases)}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError(f"concurrency: integers >= 1, got {list(self.concurrency)}")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"arrivals must be one of {ARRIVALS}, got {self.arrivals!r}")
        if self.arrivals == "poisson" and not (self.rate and self.rate > 0):
            raise ValueError("Poisson arrivals need --rate (requests per second, > 0)")
        if self.server not in SERVERS:
            raise ValueError(f"server must be one of {SERVERS}, got {self.server!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        for name in ("prompt_lengths", "answer_lengths"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must be (low, high) with 1 <= low <= high, got {(lo, hi)}")
        if self.http_processes is not None and self.http_processes < 1:
            raise ValueError(f"http_processes must be >= 1, got {self.http_processes}")
        if (self.http_processes or 1) > 1 and self.server != "process":
            raise ValueError("several HTTP processes need the server in its own process (--server process)")
        if self.client_processes is not None and self.client_processes < 1:
            raise ValueError(f"client_processes must be >= 1, got {self.client_processes}")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"requests must be >= 1, got {self.requests}")
        if self.num_steps < 2:
            raise ValueError(f"num_steps (M) must be >= 2, got {self.num_steps}")
        if self.steady_steps < 1:
            raise ValueError(f"steady_steps must be >= 1, got {self.steady_steps}")
        return self

    def requests_at(self, c: int) -> int:
        return self.requests or max(2 * c, 8)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["shape"] = self.shape.to_dict()
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


# --------------------------------------------------------------------------- the server


class ChildServer:
    """``cyb serve`` in a child process (its standard error kept in :attr:`log`); ``python_args``
    go to its interpreter before ``-m cyb`` (``("-m", "cProfile", "-o", FILE)`` profiles it)."""

    def __init__(self, folder: str, *, slots: int, max_model_len: int, device, dtype: str, cache_bytes: int,
                 mode: str, python_args: tuple = (), http_processes: int | None = None) -> None:
        import cyb

        src = os.path.dirname(os.path.dirname(os.path.abspath(cyb.__file__)))
        env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "PYTHONUNBUFFERED": "1"}
        torch_dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype]
        cmd = [sys.executable, *python_args, "-m", "cyb", "serve", folder, "--port", "0", "--served-model-name", NAME,
               "--slots", str(slots), "--max-model-len", str(max_model_len), "--device", str(device),
               "--dtype", torch_dtype, "--max-concurrency", str(4 * slots + 64),
               "--cache-memory", f"{cache_bytes / 2**30:.4f}", "--grace-period", "5", "--mode", mode]
        if http_processes is not None:
            cmd += ["--http-processes", str(http_processes)]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        self.log: list[str] = []
        self.url = None
        while self.url is None:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError("cyb serve did not start: " + "".join(self.log)[-2000:])
            self.log.append(line)
            m = re.search(r"listening: .* on (http://[^ ]+) ", line)
            if m:
                self.url = m.group(1)
                n = re.search(r"; (\d+) HTTP processes", line)
                self.http_processes = int(n.group(1)) if n else 1
        self._reader = threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True)
        self._reader.start()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ThreadServer:
    def __init__(self, model, *, slots: int, max_model_len: int, cache_bytes: int, mode: str) -> None:
        from ..serve import ServeOptions
        from ..serve.served import ServedModel
        from ..serve.server import start_background

        served = ServedModel(model, NAME, max_model_len=max_model_len, mode=mode)
        self.srv = start_background(served, ServeOptions(port=0, slots=slots, cache_bytes=cache_bytes,
                                                         max_concurrency=4 * slots + 64, grace_s=5))
        self.url = self.srv.url

    def stop(self) -> None:
        self.srv.stop()


# --------------------------------------------------------------------------- the run


def warm_up_items(items, cfg: ServeBenchConfig, c: int) -> list[tuple[list[int], int]]:
    """The requests that ready a server (and the offline engine it is compared with) for a
    concurrency of ``c``: ``c`` of the longest prompt and answer, their ids the job's first."""
    return [([items[0][0][0]] * cfg.prompt_lengths[1], cfg.answer_lengths[1])] * c


def _models(cfg: ServeBenchConfig, device, log) -> tuple[dict, int]:
    """``{case: PauseModel}`` and the real-id limit of the prompts."""
    dtype = DTYPES[cfg.dtype]
    if cfg.model is not None:
        from ..model import PauseModel
        from ..run_models import saved_model_folder

        pm = PauseModel.from_pretrained(saved_model_folder(cfg.model, "--model"), torch_dtype=dtype).to(device).eval()
        limit = min(pm.vocab.special_ids, default=pm.vocab.vocab_size)
        vis = pm.pause_visibility
        return {c: pm for c in cfg.cases if c != "none" and c.startswith(vis)} or {f"{vis}-adaptive": pm}, limit
    m = cfg.num_steps
    longest = cfg.prompt_lengths[1] + cfg.answer_lengths[1] + 8
    hf_model = build_hf_model(cfg.shape, cfg.vocab, dtype=dtype, device=device, max_positions=longest * m + 64,
                              seed=cfg.seed).eval()
    spread_weights(hf_model, cfg.seed)
    limit = real_ids_limit(cfg.vocab, m)
    calib = random_ids(min(64, max(cfg.concurrency)), min(64, cfg.prompt_lengths[1]), limit, seed=cfg.seed).to(device)
    models = {}
    for case in cfg.cases:
        if case == "none":
            models[case] = wrap(hf_model, "baseline", 1)
            continue
        vis = case.split("-")[0]
        same = next((pm for c, pm in models.items() if c.startswith(vis)), None)
        if same is None:
            same, info = adaptive_fixture(hf_model, m, calib, cfg.pause_fraction, vis)
            log(f"{vis} pauses: dk prior psi {info['psi_dk']:.3g}, {info['step1_dk_fraction_on_prompts']:.0%} of "
                "step-1 decisions say dk on the calibration prompts")
        models[case] = same
    return models, limit


def _ceiling(cfg: ServeBenchConfig, model, items, offline: dict, *, slots: int, mode: str, limit: int,
             device) -> dict:
    """The row's ``steady`` rates (``slots`` rows, prompts of the job's middle length), its
    ``ceiling_tok_s`` and ``offline_vs_ceiling``."""
    from .engine_runs import ceiling_tokens_per_s, steady_rates

    prompt_len = sum(cfg.prompt_lengths) // 2
    steady = guarded(lambda: steady_rates(model, rows=slots, mode=mode, prompt_len=prompt_len,
                                          timed=cfg.steady_steps, id_limit=limit), device)
    out = {"steady": steady}
    if steady["status"] == "ok":
        ceiling = ceiling_tokens_per_s(model, [p for p, _ in items], [n for _, n in items], steady,
                                       decode_positions=offline["stats"]["decode_positions"], slots=slots)
        out.update(ceiling_tok_s=ceiling, offline_vs_ceiling=offline["real_tokens_per_s"] / ceiling)
    return out


def _cache_bytes(model, slots: int, capacity: int) -> int:
    from ..engine.cache import bytes_per_column

    return int(slots * (capacity + 2 * model.vocab.num_steps + 256) * bytes_per_column(model) * 1.05) + (1 << 20)


def run(cfg: ServeBenchConfig, *, out=None, log=print) -> dict:
    """Run the serve benchmark; returns (and writes to ``out`` after every row) the result."""
    cfg.validate()
    device = resolve_device(cfg.device, what="--device")
    budget = Budget(cfg.budget_s)
    result = {"kind": "serve", "env": environment(device), "config": cfg.to_dict(), "results": []}
    models, limit = _models(cfg, device, log)
    max_c = max(cfg.concurrency)
    max_len = cfg.prompt_lengths[1] + cfg.answer_lengths[1]
    folders: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="cyb-bench-serve-") as tmp:
        for case, pm in models.items():
            mode = "fixed" if case == "none" else case.split("-")[1]
            from ..engine.layout import RowLayout

            capacity = RowLayout.of(pm.vocab, pm.pause_visibility).columns_needed(1, max_len - 1)
            cache = _cache_bytes(pm, max_c, capacity)
            if not budget.allows(10.0):
                result["results"].append({"case": case, "status": "skipped", "reason": "time budget spent"})
                continue
            server = None
            try:
                if cfg.server == "process":
                    if id(pm) not in folders:
                        folders[id(pm)] = str(pm.save_pretrained(os.path.join(tmp, f"model{len(folders)}")))
                    server = ChildServer(folders[id(pm)], slots=max_c, max_model_len=max_len, device=device,
                                         dtype=cfg.dtype, cache_bytes=cache, mode=mode,
                                         http_processes=cfg.http_processes)
                else:
                    server = ThreadServer(pm, slots=max_c, max_model_len=max_len, cache_bytes=cache, mode=mode)
                rows = []
                for c in cfg.concurrency:
                    row = {"case": case, "mode": mode, "visibility": "none" if case == "none" else pm.pause_visibility,
                           "num_steps": pm.vocab.num_steps, "concurrency": c, "arrivals": cfg.arrivals}
                    if not budget.allows(5.0):
                        row.update(status="skipped", reason="time budget spent")
                        rows.append(row)
                        continue
                    items = job(cfg.requests_at(c), cfg.prompt_lengths, cfg.answer_lengths, limit,
                                seed=cfg.seed + c)
                    warm = warm_up_items(items, cfg, c)
                    procs = client_processes(c, cfg.client_processes)
                    load_from_processes(server.url, warm, concurrency=c, processes=procs, mode=mode)
                    with ServerProbe(server.url) as probe:
                        results, wall = load_from_processes(server.url, items, concurrency=c, processes=procs,
                                                            arrivals=cfg.arrivals, rate=cfg.rate, mode=mode,
                                                            seed=cfg.seed)
                    row.update(status="ok", serve=summarise(results, wall), client_processes=procs,
                               http_processes=getattr(server, "http_processes", 1),
                               server=probe.summary(min(r.start for r in results), max(r.end for r in results)))
                    row["_items"] = items
                    rows.append(row)
                    log(format_row(row))
            except Exception as e:  # noqa: BLE001 - one case failing keeps the others
                rows = [{"case": case, "status": "error", "reason": f"{type(e).__name__}: {e}"[:500]}]
                log(f"{case}: error: {e}")
            finally:
                if server is not None:
                    server.stop()
                free_memory(device)
            for row in rows:  # the same work offline, with the server gone
                items = row.pop("_items", None)
                if items is not None:
                    c = row["concurrency"]
                    if cfg.offline:
                        row["offline_engine"] = guarded(lambda: offline_engine(
                            pm, items, slots=c, mode=mode, capacity=capacity, cache_bytes=cache,
                            warm=warm_up_items(items, cfg, c)), device)
                    if cfg.static:
                        row["static_generate"] = guarded(lambda: static_generate(pm, items, batch=c, mode=mode),
                                                         device)
                    off = row.get("offline_engine") or {}
                    if off.get("status") == "ok" and row["serve"]["real_tokens_per_s"]:
                        row["serve_vs_offline"] = row["serve"]["real_tokens_per_s"] / off["real_tokens_per_s"]
                    if off.get("status") == "ok" and (row.get("static_generate") or {}).get("status") == "ok":
                        row["offline_vs_static"] = off["real_tokens_per_s"] / row["static_generate"]["real_tokens_per_s"]
                    if cfg.ceiling and off.get("status") == "ok":
                        row.update(_ceiling(cfg, pm, items, off, slots=c, mode=mode, limit=limit, device=device))
                    log(format_row(row))
                result["results"].append(row)
                write_json(out, result)
    result["elapsed_s"] = budget.elapsed()
    result["targets"] = serve_targets(result)
    write_json(out, result)
    return result


# --------------------------------------------------------------------------- output


def _fmt(x, spec: str) -> str:
    return "" if x is None else format(x, spec)


def format_row(row: dict) -> str:
    head = f"{row['case']:<17} C={row.get('concurrency', ''):>4}"
    if row.get("status") != "ok":
        return f"{head} {row.get('status')} {row.get('reason', '')}".rstrip()
    s = row["serve"]
    line = (f"{head} serve {_fmt(s['real_tokens_per_s'], ',.0f')} tok/s  "
            f"TTFT p50/p99 {_fmt(s['ttft_ms_p50'], '.1f')}/{_fmt(s['ttft_ms_p99'], '.1f')} ms  "
            f"ITL p50/p99 {_fmt(s['itl_ms_p50'], '.2f')}/{_fmt(s['itl_ms_p99'], '.2f')} ms  "
            f"steps/token {_fmt(s['mean_steps'], '.2f')}  errors {s['errors']}")
    off = row.get("offline_engine") or {}
    if off.get("status") == "ok":
        ratio = _fmt(row.get("serve_vs_offline"), ".2f")
        line += f"  | offline engine {_fmt(off['real_tokens_per_s'], ',.0f')} tok/s ({ratio}x)"
    st = row.get("static_generate") or {}
    if st.get("status") == "ok":
        line += (f"  | generate() static {_fmt(st['real_tokens_per_s'], ',.0f')} tok/s "
                 f"(offline {_fmt(row.get('offline_vs_static'), '.2f')}x)")
    if row.get("ceiling_tok_s") is not None:
        line += (f"  | ceiling {_fmt(row['ceiling_tok_s'], ',.0f')} tok/s "
                 f"(offline {_fmt(row.get('offline_vs_ceiling'), '.2f')}x)")
    return line


def serve_table(result: dict) -> str:
    """The Markdown table of a result: one line per case and concurrency."""
    from .markdown import markdown_table

    headers = ["case", "C", "serve tok/s", "engine offline tok/s", "serve / offline", "generate() static tok/s",
               "offline / static", "ceiling tok/s", "offline / ceiling", "TTFT p50 / p99 ms", "ITL p50 / p99 ms",
               "TPOT p50 / p99 ms", "steps / token", "errors"]
    rows = []
    for r in result.get("results", []):
        if r.get("status") != "ok":
            rows.append([r["case"], r.get("concurrency", ""), r.get("status")] + [""] * 11)
            continue
        s, off, st = r["serve"], r.get("offline_engine") or {}, r.get("static_generate") or {}
        rows.append([r["case"], r["concurrency"], _fmt(s["real_tokens_per_s"], ",.0f"),
                     _fmt(off.get("real_tokens_per_s"), ",.0f"), _fmt(r.get("serve_vs_offline"), ".2f"),
                     _fmt(st.get("real_tokens_per_s"), ",.0f"), _fmt(r.get("offline_vs_static"), ".2f"),
                     _fmt(r.get("ceiling_tok_s"), ",.0f"), _fmt(r.get("offline_vs_ceiling"), ".2f"),
                     f"{_fmt(s['ttft_ms_p50'], '.1f')} / {_fmt(s['ttft_ms_p99'], '.1f')}",
                     f"{_fmt(s['itl_ms_p50'], '.2f')} / {_fmt(s['itl_ms_p99'], '.2f')}",
                     f"{_fmt(s['tpot_ms_p50'], '.2f')} / {_fmt(s['tpot_ms_p99'], '.2f')}",
                     _fmt(s["mean_steps"], ".2f"), s["errors"]])
    return markdown_table(headers, rows)


def serve_targets(result: dict) -> list[dict]:
    """At the largest concurrency of each case: serve >= 0.9 x the engine offline (tokens/s),
    p99 inter-token latency <= 3 x p50 (in adaptive mode also that of the gaps a decoding step,
    beside it); the engine offline against static batches
    (:data:`STATIC_RATIO`), against its ceiling (no pauses) and, with private pauses in adaptive
    mode, against the throughput without pauses over E[S]; and no request failed anywhere."""
    from .targets import _check

    rows = [r for r in result.get("results", []) if r.get("concurrency") is not None]
    tops = {}
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = [r for r in rows if r["case"] == case]
        top = tops[case] = max(mine, key=lambda r: r["concurrency"])
        label = f"{case}, C={top['concurrency']}"
        if top.get("status") != "ok":
            out.append(_check(f"serve vs engine offline ({label})", None, ">=", THROUGHPUT_RATIO, top.get("status")))
            continue
        s = top["serve"]
        out.append(_check(f"serve tokens/s >= {THROUGHPUT_RATIO} x engine offline ({label})",
                          top.get("serve_vs_offline"), ">=", THROUGHPUT_RATIO,
                          "" if top.get("serve_vs_offline") is not None else "offline run missing"))
        ratio = s["itl_ms_p99"] / s["itl_ms_p50"] if s.get("itl_ms_p50") else None
        out.append(_check(f"p99 inter-token latency <= {ITL_RATIO} x p50 ({label})", ratio, "<=", ITL_RATIO))
        if top.get("mode") == "adaptive" and s.get("itl_step_ms_p50"):  # a paused token's gap is several steps
            out.append(_check(f"p99 gap a decoding step <= {ITL_RATIO} x p50 ({label})",
                              s["itl_step_ms_p99"] / s["itl_step_ms_p50"], "<=", ITL_RATIO))
        if case in STATIC_RATIO:
            out.append(_check(f"engine offline tokens/s >= {STATIC_RATIO[case]} x generate() static ({label})",
                              top.get("offline_vs_static"), ">=", STATIC_RATIO[case],
                              "" if top.get("offline_vs_static") is not None else "offline or static run missing"))
        if case == "none":
            out.append(_check(f"engine offline tokens/s >= {CEILING_RATIO} x its ceiling ({label})",
                              top.get("offline_vs_ceiling"), ">=", CEILING_RATIO,
                              "" if top.get("offline_vs_ceiling") is not None else "ceiling not measured"))
        failed = sum(r["serve"]["errors"] for r in mine if r.get("status") == "ok")
        out.append(_check(f"no failed request ({case})", failed, "==", 0))
    if "private-adaptive" in tops and "none" in tops:
        out.append(_adaptive_check(tops["private-adaptive"], tops["none"], _check))
    return out


def _adaptive_check(private: dict, none: dict, check) -> dict:
    """Private pauses in adaptive mode, engine offline: at least 0.85 / E[S] x the engine offline
    without pauses at the same concurrency (E[S]: the private run's steps per token)."""
    label = f"private-adaptive, C={private['concurrency']}"
    name = f"engine offline tokens/s >= {ADAPTIVE_RATIO} / E[S] x no pauses' ({label})"
    mine, base = private.get("offline_engine") or {}, none.get("offline_engine") or {}
    if mine.get("status") != "ok" or base.get("status") != "ok" or private["concurrency"] != none["concurrency"]:
        return check(name, None, ">=", 1.0, "offline runs at the same concurrency missing")
    wanted = ADAPTIVE_RATIO / mine["mean_steps"] * base["real_tokens_per_s"]
    return check(name, mine["real_tokens_per_s"] / wanted, ">=", 1.0)


__all__ = ["CASES", "ServeBenchConfig", "format_row", "load", "run", "serve_table", "serve_targets", "summarise"]

"""The engine at the sizes people serve: real model shapes, long prompts, shared prefixes.

    python benchmarks/serve_sizes.py --out DIR [--models smollm2-1.7b] [--jobs mixed eval fewshot]
        [--cases none shared-fixed private-adaptive] [--requests N] [--cache-gib 48] [--budget-s 420]
        [--no-anchor] [--no-ceiling] [--no-batch1] [--no-check] [--block-size B] [--step-budget N] [--serve]
        [--profile]
    python benchmarks/serve_sizes.py --from DIR [DIR ...]     # the table and goals of earlier runs
    python benchmarks/serve_sizes.py --quick --out DIR        # a tiny model on the CPU, in seconds

Models (:data:`cyb.bench.models.NAMED_CONFIGS`, bf16, random weights at their real shapes): the
134 M benchmark Llama, SmolLM2-360M, SmolLM2-1.7B and Gemma 3 1B (sliding-window layers).  Cases:
no pauses (``none``), and pause models over the same weights (M = 4): shared pauses in fixed mode
and private pauses in adaptive mode (a dk prior that makes 10% of step-1 decisions say dk).
Jobs (:mod:`cyb.bench.jobs`, seeded, EOS ignored, ``max_model_len`` 4,096, C = 256): ``mixed``,
``eval`` and ``fewshot``.  With ``--serve`` the mixed job also goes through ``cyb serve`` in a
child process (:mod:`cyb.bench.size_serve`), after the engine offline.

For each model, in this order (each piece's JSON is written to ``--out`` when it ends):

1. ``MODEL-batch1.json``: the card's copy bandwidth, the weights' bytes and the time to read them
   once, and each case's time per token at batch 1;
2. for each job and case, ``MODEL-JOB-CASE.json``: the job through the engine (C closed-loop
   clients, a cache of ``--cache-gib``): tokens/s, slots in use (peak and mean over steps) against
   the rows one slot of ``max_model_len`` each would allow in the same bytes, inter-token p50/p99
   counted per token, TTFT, preemptions and prefix-cache hits where the engine counts them, and
   its ceiling (:func:`cyb.bench.size_runs.ceiling`); the few-shot job again with prefix caching
   off where the engine has the option.  After the ``none`` case, ``MODEL-JOB-anchor.json``:
   transformers' continuous batching on the same requests.  Each ``--variants`` entry (engine
   options such as ``step_budget=2048`` or ``prefill_chunk=512,prefill_rows=1``) runs the job and
   case again under those options, against the same ceiling: ``MODEL-JOB-CASE--VARIANT.json``
   (file names of letters, digits, ``-`` and ``_`` only);
3. ``MODEL-preemption-CASE.json``: 64 requests of the mixed job with a cache a quarter of what
   they need, against a cache that holds them all (:func:`cyb.bench.size_runs.preemption_check`),
   the model in float32.

With ``--profile`` each job's engine run is profiled (:mod:`cyb.bench.engine_profile`): its record's
``profile`` holds the host and device time of the engine's phases and the costliest operators and
kernels (and its rates carry the profiler's cost).

Then ``summary.json`` (every record and the goals), the table and the goals as MET / MISSED / N/A
lines (:mod:`cyb.bench.size_goals`).  ``--budget-s`` bounds the call: a piece starts only while
enough of it is left, and a job that runs past it aborts its requests (``stopped_early``).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import sys
import tarfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from cyb.bench import size_runs as sr  # noqa: E402
from cyb.bench.engine_features import features, has_option  # noqa: E402
from cyb.bench.engine_profile import profiled  # noqa: E402
from cyb.bench.hf_anchor import continuous_batching  # noqa: E402
from cyb.bench.jobs import make_job  # noqa: E402
from cyb.bench.models import NAMED_CONFIGS, adaptive_fixture, build_named_model, random_ids  # noqa: E402
from cyb.bench.models import real_ids_limit, wrap  # noqa: E402
from cyb.bench.size_goals import goal_lines, size_goals, size_table  # noqa: E402
from cyb.bench.size_serve import served_job  # noqa: E402
from cyb.bench.timing import Budget, environment, free_memory, guarded, write_json  # noqa: E402

CASES = ("none", "shared-fixed", "shared-adaptive", "private-fixed", "private-adaptive")
KINDS = ("serve_sizes_run", "serve_sizes_batch1", "serve_sizes_anchor", "serve_sizes_preemption")
#: seconds a piece needs left in the budget to start
MIN_RUN_S = 20.0
#: seconds kept back at the end of the budget for the table and the files
RESERVE_S = 10.0
#: requests of the mixed job in the preemption check
CHECK_REQUESTS = 64
#: the archive benchmarks/serve_sizes_gpu.sh packs a call's records into (a device call returns 8 files)
RECORDS_ARCHIVE = "records.tar.gz"


def _models(name: str, cases, *, dtype, device, m: int, log):
    """The model ``name`` and ``{case: (pause model, mode)}`` over its weights, and the real-id limit."""
    hf_model = build_named_model(name, dtype=dtype, device=device)
    vocab = int(hf_model.get_output_embeddings().weight.shape[0])
    limit = real_ids_limit(vocab, m)
    calib = random_ids(32, 32, limit, seed=0).to(device)
    by_vis, out = {}, {}
    for case in cases:
        if case == "none":
            out[case] = (wrap(hf_model, "baseline", 1), "fixed")
            continue
        vis, mode = case.split("-")
        if vis not in by_vis:
            by_vis[vis], info = adaptive_fixture(hf_model, m, calib, 0.1, vis)
            log(f"{name}: {vis} pauses, dk prior psi {info['psi_dk']:.3g}, "
                f"{info['step1_dk_fraction_on_prompts']:.0%} of step-1 decisions say dk on the calibration prompts")
        out[case] = (by_vis[vis], mode)
    return hf_model, out, limit


class Call:
    """One call of the script: where records go, the budget, and the log."""

    def __init__(self, a, device) -> None:
        self.a, self.device = a, device
        self.budget = Budget(a.budget_s)
        self.records: list[dict] = []
        self.base = {"env": environment(device), "engine_features": features(), "argv": list(sys.argv)}

    def allows(self) -> bool:
        return self.budget.allows(MIN_RUN_S)

    def deadline(self) -> float | None:
        left = self.budget.remaining()
        return None if left == float("inf") else time.perf_counter() + left - RESERVE_S

    def write(self, name: str, record: dict) -> None:
        record = {**record, **self.base}
        self.records.append(record)
        write_json(os.path.join(self.a.out, name + ".json"), record)

    def log(self, *parts) -> None:
        print(*parts, flush=True)


def _line(r: dict) -> str:
    if r.get("status") != "ok":
        return f"{r.get('status')} {r.get('reason', '')}"
    e = r["engine"]
    parts = [f"{e['real_tokens_per_s']:,.0f} tok/s", f"slots {e['slots_in_use_peak']}/{e['slots']} "
             f"(one slot of max_model_len: {e['today_slots']})",
             f"ITL p50/p99 {e['itl_ms_p50'] or 0:.2f}/{e['itl_ms_p99'] or 0:.2f} ms",
             f"TTFT p50 {e['ttft_ms_p50'] or 0:.0f} ms", f"failed {e['failed']}"]
    if r.get("vs_ceiling") is not None:
        parts.append(f"{r['vs_ceiling']:.2f}x ceiling {r['ceiling_tok_s']:,.0f}")
    return ", ".join(parts)


def run_case(call: Call, name: str, job, case: str, pm, mode: str, limit: int, cache_bytes: int,
             variant: dict | None = None, steady: dict | None = None) -> dict:
    """One model, job and case: the engine, the few-shot job without prefix caching, the ceiling
    (``steady``: the steady rate measured already, for a ``variant`` of the command line's engine
    options)."""
    a, spec = call.a, job.spec
    record = {"kind": "serve_sizes_run", "model": name, "job": job.name, "case": case, "mode": mode,
              "num_steps": pm.vocab.num_steps, "concurrency": spec.concurrency, "job_summary": job.summary(),
              "cache_bytes": cache_bytes}
    if variant:
        record["variant"] = ",".join(f"{k}={v}" for k, v in variant.items())
    if not call.allows():
        return {**record, "status": "skipped", "reason": "time budget spent"}
    options = {**engine_choices(a), **(variant or {})}
    fewshot = job.name == "fewshot" and has_option("prefix_caching")
    kw = dict(mode=mode, max_model_len=spec.max_model_len, slots=spec.concurrency, cache_bytes=cache_bytes,
              clients=spec.concurrency)
    with profiled(call.device) if a.profile else contextlib.nullcontext() as profile:
        engine = guarded(lambda: sr.engine_job(pm, job.items, options={**options, **({"prefix_caching": True}
                                                                                      if fewshot else {})},
                                               deadline=call.deadline(), **kw), call.device)
    record.update(status=engine["status"], engine=engine)
    if profile is not None:  # (under the profiler: its times carry the profiler's cost)
        record["profile"] = {"phases": profile.phases, "text": profile.text}
        call.log(f"{name} {job.name} {case}{' [' + record['variant'] + ']' if variant else ''}: profiled\n"
                 + profile.text.split("\n\n")[0])
    if engine["status"] != "ok":
        record["reason"] = engine.get("reason", engine["status"])
        return record
    if a.serve and job.name == "mixed" and call.allows():
        record["serve"] = guarded(lambda: served_job(pm, job.items, mode=mode, max_model_len=spec.max_model_len,
                                                     slots=spec.concurrency, cache_bytes=cache_bytes,
                                                     dtype="fp32" if a.quick else "bf16", device=call.device),
                                  call.device)
        if record["serve"]["status"] == "ok" and engine["real_tokens_per_s"]:
            record["serve_vs_engine"] = record["serve"]["real_tokens_per_s"] / engine["real_tokens_per_s"]
    if job.name == "fewshot":
        if not fewshot:
            record["prefix_off"] = {"status": "n/a", "reason": "the engine has no prefix_caching option"}
        elif call.allows():
            record["prefix_off"] = guarded(lambda: sr.engine_job(pm, job.items, options={**options,
                                                                                         "prefix_caching": False},
                                                                 deadline=call.deadline(), **kw), call.device)
    if steady is None and not a.no_ceiling and call.budget.allows(MIN_RUN_S / 2):
        rows, length = sr.ceiling_rows(pm, record["job_summary"], concurrency=spec.concurrency,
                                       cache_bytes=cache_bytes)
        length = min(length, spec.max_model_len)
        steady = guarded(lambda: sr.steady(pm, rows=rows, mode=mode, prompt_len=length, id_limit=limit,
                                           timed=a.steady_steps), call.device)
    if steady is not None:
        record["steady"] = steady
        if steady["status"] == "ok":
            record["ceiling_tok_s"] = sr.ceiling(engine, steady)
            record["vs_ceiling"] = engine["real_tokens_per_s"] / record["ceiling_tok_s"]
            if (record.get("serve") or {}).get("status") == "ok":
                record["serve_vs_ceiling"] = record["serve"]["real_tokens_per_s"] / record["ceiling_tok_s"]
    return record


#: engine options a variant may set (integers)
VARIANT_OPTIONS = ("step_budget", "prefill_chunk", "prefill_rows", "block_size")


def parse_variant(spec: str) -> dict:
    """``"step_budget=2048,prefill_rows=1"`` as ``{"step_budget": 2048, "prefill_rows": 1}``."""
    out = {}
    for part in spec.split(","):
        key, eq, value = part.partition("=")
        if key not in VARIANT_OPTIONS or not eq or not value.isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(f"a variant is OPTION=N[,OPTION=N] with OPTION one of "
                                             f"{', '.join(VARIANT_OPTIONS)} and N >= 1, got {spec!r}")
        out[key] = int(value)
    return out


def variant_slug(variant: dict) -> str:
    """A variant as a file-name part: ``step_budget-2048_prefill_rows-1``."""
    return "_".join(f"{k}-{v}" for k, v in variant.items())


def engine_choices(a) -> dict:
    """The :class:`~cyb.engine.EngineOptions` fields the command line chose (None: the default)."""
    return {"block_size": a.block_size, "step_budget": a.step_budget, "prefill_chunk": a.prefill_chunk,
            "prefill_rows": a.prefill_rows}


def run_model(call: Call, name: str) -> None:
    a, device = call.a, call.device
    dtype = torch.float32 if a.quick else torch.bfloat16
    hf_model, models, limit = _models(name, a.cases, dtype=dtype, device=device, m=a.num_steps, log=call.log)
    cache_bytes = int(a.cache_gib * 2**30)
    if not a.no_batch1 and call.allows():
        copy = sr.copy_bandwidth(device)
        weights = sr.weight_bytes(hf_model)
        read_ms = weights / copy["bytes_per_s"] * 1e3 if copy["bytes_per_s"] else None
        cases = {case: guarded(lambda: sr.batch_one(pm, mode=mode, id_limit=limit,
                                                    timed=16 if a.quick else 64), device)
                 for case, (pm, mode) in models.items()}
        call.write(f"{name}-batch1", {"kind": "serve_sizes_batch1", "model": name, "status": "ok", "copy": copy,
                                      "weight_bytes": weights, "weights_read_ms": read_ms, "cases": cases})
        call.log(name, "batch 1:", {c: round(r.get("ms_per_token") or 0, 3) for c, r in cases.items()},
                 "ms a token; weights read once", None if read_ms is None else round(read_ms, 3), "ms")
    for job_name in a.jobs:
        job = make_job(job_name, limit, quick=a.quick, requests=a.requests, seed=a.seed)
        for case, (pm, mode) in models.items():
            record = run_case(call, name, job, case, pm, mode, limit, cache_bytes)
            call.write(f"{name}-{job_name}-{case}", record)
            call.log(name, job_name, case, _line(record))
            for variant in a.variants:
                other = run_case(call, name, job, case, pm, mode, limit, cache_bytes, variant=variant,
                                 steady=record.get("steady"))
                call.write(f"{name}-{job_name}-{case}--{variant_slug(variant)}", other)
                call.log(name, job_name, case, f"[{other['variant']}]", _line(other))
            if case == "none" and not a.no_anchor:
                anchor = {"kind": "serve_sizes_anchor", "model": name, "job": job_name, "status": "skipped",
                          "reason": "time budget spent"}
                if call.allows():
                    timeout = max(call.budget.remaining() - RESERVE_S, 5.0)
                    anchor["anchor"] = guarded(lambda: continuous_batching(
                        hf_model, job.items, concurrency=job.spec.concurrency, cache_bytes=cache_bytes,
                        max_batch_tokens=256 if a.quick else None, flash=a.anchor_flash, timeout_s=timeout), device)
                    anchor.update(status=anchor["anchor"]["status"], reason=anchor["anchor"].get("reason", ""))
                call.write(f"{name}-{job_name}-anchor", anchor)
                got = anchor.get("anchor") or {}
                late = (f", {got['unfinished']} unfinished when its {got['seconds']:.0f} s ran out"
                        if got.get("timed_out") else "")
                call.log(name, job_name, "transformers continuous batching:", anchor["status"],
                         f"{got.get('real_tokens_per_s') or 0:,.0f} tok/s, failed {got.get('failed')}{late}",
                         anchor.get("reason") or "")
    if not a.no_check:
        job = make_job("mixed", limit, quick=a.quick, requests=CHECK_REQUESTS if not a.quick else None, seed=a.seed)
        slots = max(1, min(job.spec.concurrency, len(job.items)) // 2)
        # in float32: in bf16 a different batch alone changes most answers of a model with random
        # weights (its sums depend on the batch, and its logits are full of near ties)
        for pm, _ in models.values():
            pm.float()
        for case, (pm, mode) in models.items():
            record = {"kind": "serve_sizes_preemption", "model": name, "case": case, "status": "skipped",
                      "reason": "time budget spent"}
            if call.allows():
                check = guarded(lambda: sr.preemption_check(pm, job.items, mode=mode, slots=slots,
                                                            options=engine_choices(a)), device)
                record.update(status=check["status"], reason=check.get("reason", ""), check=check)
            call.write(f"{name}-preemption-{case}", record)
            c = record.get("check") or {}
            call.log(name, "preemption", case, record["status"], {k: c.get(k) for k in ("preemptions", "failed",
                                                                                        "changed", "noise")})
    del models, hf_model
    free_memory(device)


def report(records: list[dict], out: str | None) -> None:
    """Print the table and the goal lines; with ``out``, write ``summary.json`` and ``goals.txt``."""
    checks = size_goals(records)
    lines = goal_lines(checks)
    print(size_table(records))
    print()
    print("\n".join(lines))
    if out:
        write_json(os.path.join(out, "summary.json"), {"kind": "serve_sizes_summary", "records": records,
                                                       "goals": checks})
        with open(os.path.join(out, "goals.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


def load_records(folders) -> list[dict]:
    """Every record of :data:`KINDS` in the JSON files of ``folders`` and in their
    ``records.tar.gz`` (benchmarks/serve_sizes_gpu.sh packs them so; summaries left out), by
    folder, then kind, model, job and case (in :data:`CASES` order), each plain run before its
    variants (by name)."""
    records = []
    for rank, folder in enumerate(folders):
        texts = []
        for path in glob.glob(os.path.join(folder, "*.json")):
            with open(path) as f:
                texts.append(f.read())
        packed = os.path.join(folder, RECORDS_ARCHIVE)
        if os.path.exists(packed):
            with tarfile.open(packed) as tar:
                texts += [tar.extractfile(m).read().decode() for m in tar.getmembers()
                          if m.isfile() and m.name.endswith(".json")]
        for text in texts:
            data = json.loads(text)
            if data.get("kind") in KINDS:
                records.append((rank, data))

    def order(item):
        rank, r = item
        case = r.get("case", "")
        return (rank, KINDS.index(r["kind"]), r.get("model", ""), r.get("job", ""),
                CASES.index(case) if case in CASES else len(CASES), r.get("variant") or "")
    return [r for _, r in sorted(records, key=order)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="folder of the JSON files")
    ap.add_argument("--from", dest="from_dirs", nargs="+", help="print the table and goals of these folders' JSON")
    ap.add_argument("--models", nargs="+", default=None, help=f"of {', '.join(NAMED_CONFIGS)}")
    ap.add_argument("--jobs", nargs="+", default=["mixed", "eval", "fewshot"], choices=["mixed", "eval", "fewshot"])
    ap.add_argument("--cases", nargs="+", default=["none", "shared-fixed", "private-adaptive"], choices=CASES)
    ap.add_argument("--requests", type=int, default=None, help="requests of every job (default: each job's own)")
    ap.add_argument("--cache-gib", type=float, default=None,
                    help="the KV cache of every engine and of the anchor (default 48: what an 80 GB card spares "
                         "beside a 1.7 B model and its work)")
    ap.add_argument("--num-steps", type=int, default=None, help="M of the pause cases (default 4, quick 3)")
    ap.add_argument("--block-size", type=int, default=None, help="EngineOptions.block_size, where the engine has it")
    ap.add_argument("--step-budget", type=int, default=None,
                    help="EngineOptions.step_budget (prompts inside the decoding steps), where the engine has it")
    ap.add_argument("--prefill-chunk", type=int, default=None,
                    help="EngineOptions.prefill_chunk: prompt columns a row writes per prefill forward")
    ap.add_argument("--prefill-rows", type=int, default=None,
                    help="EngineOptions.prefill_rows: rows a prefill forward writes at most")
    ap.add_argument("--variants", nargs="+", type=parse_variant, default=[], metavar="OPTION=N[,OPTION=N]",
                    help="run each job and case again under these engine options (of "
                         f"{', '.join(VARIANT_OPTIONS)}), against the same ceiling")
    ap.add_argument("--steady-steps", type=int, default=50, help="timed steps of the ceiling's steady rate")
    ap.add_argument("--budget-s", type=float, default=None, help="wall-clock budget of the call")
    ap.add_argument("--no-anchor", action="store_true", help="leave out transformers' continuous batching")
    ap.add_argument("--anchor-flash", action="store_true",
                    help="let transformers switch its continuous batching to flash attention where installed")
    ap.add_argument("--no-ceiling", action="store_true")
    ap.add_argument("--no-batch1", action="store_true")
    ap.add_argument("--no-check", action="store_true", help="leave out the preemption check")
    ap.add_argument("--serve", action="store_true",
                    help="the mixed job through cyb serve too (needs starlette and uvicorn)")
    ap.add_argument("--profile", action="store_true",
                    help="run each job's engine under torch.profiler with the engine's phases labelled; the "
                         "record's 'profile' holds the tables (its times then carry the profiler's cost)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="tiny models in float32 (a smoke run), on the CPU")
    ap.add_argument("--device", default=None, help="cuda (default) or cpu (default with --quick)")
    a = ap.parse_args(argv)
    if a.from_dirs:
        report(load_records(a.from_dirs), a.out)
        return 0
    if not a.out:
        ap.error("--out is required (or --from)")
    a.models = a.models or (["tiny", "tiny-gemma3"] if a.quick else ["smollm2-1.7b"])
    unknown = [m for m in a.models if m not in NAMED_CONFIGS]
    if unknown:
        ap.error(f"--models: choose from {', '.join(NAMED_CONFIGS)}, got {unknown}")
    a.num_steps = a.num_steps or (3 if a.quick else 4)
    if a.num_steps < 2:
        ap.error(f"--num-steps must be >= 2, got {a.num_steps}")
    device = torch.device(a.device or ("cpu" if a.quick else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("no CUDA device: run with --quick (on the CPU)")
    a.cache_gib = a.cache_gib or (0.01 if a.quick else 48.0)
    os.makedirs(a.out, exist_ok=True)
    call = Call(a, device)
    for name in a.models:
        if not call.allows():
            call.log(name, "skipped: time budget spent")
            continue
        run_model(call, name)
    report(call.records, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

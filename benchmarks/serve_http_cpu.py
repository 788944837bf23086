"""CPU time of ``cyb serve``'s HTTP process per streamed token, under the serve benchmark's load.

    python benchmarks/serve_http_cpu.py [--concurrency 32] [--requests 256] [--answer-lengths 64 128]
        [--repeats 3] [--profile FILE] [--py-spy BINARY --py-spy-out FILE] [--log]

What ``cyb bench serve --quick --cases none --concurrency 32 --requests 256 --answer-lengths 64 128
--no-static --no-ceiling`` runs, with ``cyb serve`` in a child process: the benchmark's tiny Llama
without pauses (random weights, no tokenizer: the streamed text is empty, as in the GPU runs), on
the CPU, ``C`` slots; ``C`` warm-up requests, then each repeat streams ``requests`` seeded
requests (prompts of 2-12 ids, answers of the given lengths, EOS ignored) from ``C`` closed-loop
clients in this process.  Around each repeat it reads the user and system CPU time
(``/proc/PID/stat``) of the HTTP process (``cyb serve``) and of the engine's process (its child),
and prints per repeat: CPU microseconds per streamed token of each (for the HTTP process also
its system share and its event loop's thread alone), the tokens per server-sent event, and the
tokens per second; then each figure's mean, standard deviation, least and greatest.  CPU time,
not wall time: the machine may be shared.

``--profile FILE`` runs the server under :mod:`cProfile` (the whole run, start-up included; the
profile is written when the server exits).  ``--py-spy BINARY`` samples the HTTP process with
py-spy during the timed repeats, native frames included, and writes ``--py-spy-out`` (folded
stacks); py-spy stops the process to sample it, so the figures of such a run are not the ones
to quote.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from cyb.bench.load import job, load_from_processes  # noqa: E402
from cyb.bench.serve import ChildServer, ServeBenchConfig, _cache_bytes, _models  # noqa: E402
from cyb.engine.layout import RowLayout  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_times(pid: int, tid: int | None = None) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid`` (all its threads), or of its thread ``tid``."""
    with open(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS  # utime, stime (fields 14, 15 of stat)


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User plus system CPU seconds (:func:`cpu_times`)."""
    return sum(cpu_times(pid, tid))


def engine_pids(pid: int) -> list[int]:
    """The children of ``pid`` started by multiprocessing's ``spawn`` (not its resource tracker)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            for child in f.read().split():
                with open(f"/proc/{child}/cmdline", "rb") as g:
                    if b"spawn_main" in g.read():
                        out.append(int(child))
    return out


class Server(ChildServer):
    """``cyb serve`` of the tiny model in ``folder`` on the CPU, in a child process (optionally
    under cProfile), with the pid of its engine's process."""

    def __init__(self, folder: str, *, slots: int, max_model_len: int, cache_bytes: int, profile: str | None):
        super().__init__(folder, slots=slots, max_model_len=max_model_len, device="cpu", dtype="fp32",
                         cache_bytes=cache_bytes, mode="fixed",
                         python_args=("-m", "cProfile", "-o", profile) if profile else ())
        self.pid = self.proc.pid
        engines = engine_pids(self.pid)
        if len(engines) != 1:
            self.stop()
            raise RuntimeError(f"expected one engine process under the server, found {engines}")
        self.engine_pid = engines[0]


def measure(server: Server, items, concurrency: int) -> dict:
    """One timed load: CPU of both processes per streamed token, tokens per event, tokens/s."""
    (user0, sys0), loop0 = cpu_times(server.pid), cpu_seconds(server.pid, server.pid)
    engine0 = cpu_seconds(server.engine_pid)
    results, wall = load_from_processes(server.url, items, concurrency=concurrency, processes=1, mode="fixed")
    (user1, sys1), loop1 = cpu_times(server.pid), cpu_seconds(server.pid, server.pid)
    engine1 = cpu_seconds(server.engine_pid)
    bad = [r.error or f"HTTP {r.status}" for r in results if not r.ok]
    if bad:
        raise RuntimeError(f"{len(bad)} requests failed, the first: {bad[0]}")
    tokens = sum(r.tokens for r in results)
    events = sum(len(r.events) for r in results)
    return {"tokens": tokens, "events": events, "tokens_per_event": tokens / events, "tok_s": tokens / wall,
            "http_us_per_token": (user1 + sys1 - user0 - sys0) * 1e6 / tokens,
            "http_sys_us_per_token": (sys1 - sys0) * 1e6 / tokens, "loop_us_per_token": (loop1 - loop0) * 1e6 / tokens,
            "engine_us_per_token": (engine1 - engine0) * 1e6 / tokens}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--prompt-lengths", type=int, nargs=2, default=(2, 12))
    p.add_argument("--answer-lengths", type=int, nargs=2, default=(64, 128))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", help="run the server under cProfile, writing this file when it exits")
    p.add_argument("--py-spy", dest="py_spy", help="a py-spy binary: sample the HTTP process during the repeats")
    p.add_argument("--py-spy-out", default="serve_http.folded", help="where py-spy writes (default %(default)s)")
    p.add_argument("--log", action="store_true", help="print the server's standard error at the end")
    args = p.parse_args(argv)

    cfg = ServeBenchConfig.quick(cases=("none",), concurrency=(args.concurrency,), requests=args.requests,
                                 prompt_lengths=tuple(args.prompt_lengths), answer_lengths=tuple(args.answer_lengths),
                                 seed=args.seed)
    models, limit = _models(cfg, "cpu", print)
    pm = models["none"]
    c = args.concurrency
    max_len = cfg.prompt_lengths[1] + cfg.answer_lengths[1]
    capacity = RowLayout.of(pm.vocab, pm.pause_visibility).columns_needed(1, max_len - 1)
    items = job(args.requests, cfg.prompt_lengths, cfg.answer_lengths, limit, seed=args.seed + c)
    warm = [([items[0][0][0]] * cfg.prompt_lengths[1], cfg.answer_lengths[1])] * c
    with tempfile.TemporaryDirectory(prefix="serve-http-cpu-") as tmp:
        folder = str(pm.save_pretrained(os.path.join(tmp, "model")))
        server = Server(folder, slots=c, max_model_len=max_len, cache_bytes=_cache_bytes(pm, c, capacity),
                        profile=args.profile)
        spy = None
        try:
            print(f"server pid {server.pid}, engine pid {server.engine_pid}, {server.url}", flush=True)
            load_from_processes(server.url, warm, concurrency=c, processes=1, mode="fixed")
            if args.py_spy:
                spy = subprocess.Popen([args.py_spy, "record", "--pid", str(server.pid), "--format", "raw",
                                        "--rate", "200", "--native", "-o", args.py_spy_out],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            rows = []
            for i in range(args.repeats):
                row = measure(server, items, c)
                rows.append(row)
                print(f"repeat {i + 1}: HTTP {row['http_us_per_token']:.2f} us/token (system "
                      f"{row['http_sys_us_per_token']:.2f}; event loop's thread {row['loop_us_per_token']:.2f}), "
                      f"engine "
                      f"{row['engine_us_per_token']:.2f} us/token, {row['tokens_per_event']:.3f} tokens/event, "
                      f"{row['tok_s']:,.0f} tok/s ({row['tokens']} tokens, {row['events']} events)", flush=True)
        finally:
            if spy is not None:
                spy.send_signal(2)
                spy.wait(60)
            server.stop()
            if args.log:
                print("".join(server.log), end="")
    for key, label in (("http_us_per_token", "HTTP us/token"), ("http_sys_us_per_token", "HTTP system us/token"),
                       ("loop_us_per_token", "event loop's thread us/token"),
                       ("engine_us_per_token", "engine us/token"),
                       ("tokens_per_event", "tokens/event"), ("tok_s", "tok/s")):
        values = [r[key] for r in rows]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{label}: mean {statistics.mean(values):.3f}, sd {spread:.3f}, min {min(values):.3f}, "
              f"max {max(values):.3f} over {len(values)} repeats")


if __name__ == "__main__":
    main()

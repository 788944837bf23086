"""The engine's decoding step and its graphed prefill forward with and without fused small
operations (:mod:`cyb.engine.fused`): ms per step at a few batch sizes, and ms per prefill forward
at a few shapes, in one process, on one GPU.

    python benchmarks/engine_fused.py --out FILE.json [--batches 1 8 64 256] [--new-tokens 256]
        [--prefill 1x64 1x512 8x64 8x512 32x128]

The 134 M Llama of the serve benchmark (random weights, bf16, no pauses), prompts of 128 tokens,
every row decoding ``--new-tokens`` tokens (no EOS).  Each engine runs the job twice; the second
run is timed (the first captures the CUDA graphs, compiling the fused kernels where asked).  Also
reports whether both engines gave the same tokens (greedy; bf16 kernels that fuse differently may
round differently, and a random model's near ties then part).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from cyb.engine import Engine, EngineOptions, Request  # noqa: E402
from engine_gaps import prefill_probe  # noqa: E402  (this folder)
from engine_traffic import TrafficJob  # noqa: E402


def run(pm, mode, batch: int, new: int, limit: int, fused: bool) -> dict:
    g = torch.Generator().manual_seed(batch)
    reqs = [Request(tuple(torch.randint(10, limit, (128,), generator=g).tolist()), new, mode=mode)
            for _ in range(batch)]
    engine = Engine.sized_for(pm, reqs, options=EngineOptions(fused=fused))
    for rep in range(2):
        ids = {engine.submit(r): i for i, r in enumerate(reqs)}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tokens = [[] for _ in reqs]
        for e in engine.run():
            tokens[ids[e.request]].append(e.token)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        if rep == 0:
            first = seconds
    assert engine.runner.fused == fused
    return {"batch": batch, "fused": fused, "ms_per_step": seconds * 1e3 / new, "first_run_s": first,
            "tok_s": batch * new / seconds, "tokens": tokens}


def prefill_ms(pm, shapes: list[tuple[int, int]], fused: bool, replays: int = 50) -> dict[str, float]:
    """Median ms of one graphed prefill forward of first chunks of each ``(rows, columns)`` shape
    (:func:`engine_gaps.prefill_probe`)."""
    rows = max(r for r, _ in shapes)
    chunk = max(c for _, c in shapes)
    engine = Engine(pm, capacity=chunk, slots=rows, options=EngineOptions(fused=fused, prefill_chunk=chunk))
    with torch.inference_mode():
        probed = prefill_probe(engine, shapes, replays)
    assert engine.runner.fused == fused
    return {f"{p['rows']}x{p['chunk']}": p["ms"] for p in probed}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prefill", nargs="*", default=["1x64", "1x512", "8x64", "8x512", "32x128"],
                    help="prefill shapes ROWSxCOLUMNS (none: skip)")
    a = ap.parse_args(argv)
    job = TrafficJob(4, 1)
    pm, mode = job.model("none")
    rows = []
    result = {"argv": sys.argv[1:], "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "rows": rows}

    def save() -> None:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)

    if a.prefill:
        shapes = [tuple(int(x) for x in s.split("x")) for s in a.prefill]
        plain, fused = prefill_ms(pm, shapes, False), prefill_ms(pm, shapes, True)
        result["prefill"] = [{"shape": k, "plain_ms": plain[k], "fused_ms": fused[k],
                              "speedup": plain[k] / fused[k]} for k in plain]
        for row in result["prefill"]:
            print(json.dumps(row), flush=True)
        save()
    for batch in a.batches:
        plain = run(pm, mode, batch, a.new_tokens, job.limit, False)
        fused = run(pm, mode, batch, a.new_tokens, job.limit, True)
        same = sum(p == f for p, f in zip(plain.pop("tokens"), fused.pop("tokens")))
        row = {"batch": batch, "plain_ms": plain["ms_per_step"], "fused_ms": fused["ms_per_step"],
               "speedup": plain["ms_per_step"] / fused["ms_per_step"], "fused_first_run_s": fused["first_run_s"],
               "rows_with_the_same_tokens": same}
        rows.append(row)
        print(json.dumps(row), flush=True)
        save()


if __name__ == "__main__":
    main()

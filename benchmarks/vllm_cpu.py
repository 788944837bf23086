"""vLLM's CPU throughput against cyb's engine on the same tiny pause model and prompts.

Run it in the vLLM venv (``bash scripts/setup_vllm.sh`` builds ``.venv-vllm``)::

    .venv-vllm/bin/python benchmarks/vllm_cpu.py                     # both sizes, the table and a JSON
    .venv-vllm/bin/python benchmarks/vllm_cpu.py --size small --repeats 1

For each size (``tiny``: the tests' Llama, hidden 64, 2 layers; ``small``: hidden 256, 4 layers,
head dimension 64), ``M`` = 3, float32, random weights: the same prompts (cut from the tests'
corpus, 5 to 63 tokens) go through ``cyb.generation.generate`` (cyb's engine) and through
``vllm.LLM.generate`` with the plugin, greedy, EOS ignored, in fixed mode with shared positions
and in adaptive mode with advance positions.  cyb generates ``N`` real tokens per prompt; vLLM
``N * M`` positions (its ``max_tokens``: pauses are tokens to vLLM), which in fixed mode are the
same ``N`` tokens and in adaptive mode at least ``N`` (the first ``N`` are cyb's).  vLLM runs as
``vllm serve`` would, its model compiled (``--eager``: without torch.compile).  Each side runs
once untimed, then ``--repeats`` times; the best time counts.  Each side gets ``--threads``
threads (default 1: on a 2-core machine shared with other work, two torch threads ran cyb's
engine 7x slower than one).  Real tokens per second count the
tokens each side generated; positions per second every position its network ran after the
prompt.  Indicative only: a 2-core CPU shared with other work, where both sides mostly measure
their Python overhead; vLLM on a GPU is vLLM's own.
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

SIZES = {"tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1),
         "small": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2)}
CASES = (("shared", "fixed"), ("advance", "adaptive"))


def build(size: str, scheme: str, tok, folder: Path):
    from vllm_helpers import build as build_model

    pm = build_model(tok, scheme=scheme, seed=0, num_steps=3, max_position_embeddings=512, **SIZES[size])
    pm.save_pretrained(folder)
    return pm


def prompts(n: int) -> list[str]:
    from serve_helpers import CORPUS

    text = " ".join(CORPUS)
    return [text[(37 * i) % 200:(37 * i) % 200 + 10 + (13 * i) % 110] for i in range(n)]


def best_of(fn, repeats: int) -> tuple[float, object]:
    fn()  # untimed
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def run_case(size, scheme, mode, tok, folder, texts, new_tokens, repeats, eager):
    import torch
    import vllm

    from cyb.generation import generate
    from cyb.integrations.vllm import real_tokens

    pm = build(size, scheme, tok, folder)
    m = pm.num_steps
    cyb_s, results = best_of(lambda: generate(pm, texts, mode=mode, max_new_tokens=new_tokens, eos_token_ids=()),
                             repeats)
    cyb_tokens = sum(len(r.token_ids) for r in results)
    cyb_positions = sum(sum(r.steps) if mode == "adaptive" else m * len(r.steps) for r in results)
    llm = vllm.LLM(model=str(folder), dtype="float32", enforce_eager=eager, max_model_len=512,
                   gpu_memory_utilization=0.05, kv_cache_memory_bytes=256 << 20, max_num_seqs=len(texts), seed=0)
    params = vllm.SamplingParams(max_tokens=new_tokens * m, temperature=0, ignore_eos=True,
                                 extra_args={"mode": mode})
    vllm_s, outs = best_of(lambda: llm.generate(texts, params, use_tqdm=False), repeats)
    pauses = pm.settings.pause_ids
    vllm_tokens = sum(len(real_tokens(o.outputs[0].token_ids, pauses)) for o in outs)
    vllm_positions = sum(len(o.outputs[0].token_ids) for o in outs)
    same = all(real_tokens(o.outputs[0].token_ids, pauses)[:new_tokens] == r.token_ids for o, r in zip(outs, results))
    llm.llm_engine.engine_core.shutdown()
    del llm
    return {"size": size, "positions": scheme, "mode": mode, "prompts": len(texts), "new_tokens": new_tokens,
            "cyb_s": cyb_s, "cyb_tokens": cyb_tokens, "cyb_positions": cyb_positions,
            "vllm_s": vllm_s, "vllm_tokens": vllm_tokens, "vllm_positions": vllm_positions,
            "same_tokens": same, "torch_threads": torch.get_num_threads()}


def table(rows) -> str:
    lines = ["| model | positions, mode | cyb tok/s | vLLM tok/s | vLLM / cyb | cyb positions/s | vLLM positions/s | same tokens |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c, v = r["cyb_tokens"] / r["cyb_s"], r["vllm_tokens"] / r["vllm_s"]
        lines.append(f"| {r['size']} | {r['positions']}, {r['mode']} | {c:,.0f} | {v:,.0f} | {v / c:.2f} | "
                     f"{r['cyb_positions'] / r['cyb_s']:,.0f} | {r['vllm_positions'] / r['vllm_s']:,.0f} | "
                     f"{'yes' if r['same_tokens'] else 'no'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=[*SIZES, "all"], default="all")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eager", action="store_true", help="vLLM without torch.compile (default: vLLM's default, compiled)")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads of each side: torch's for cyb, the vLLM worker's bound to cores 0..N-1")
    ap.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "vllm" / "cpu.json"))
    ap.add_argument("--work", default="/tmp/cyb-vllm-bench")
    args = ap.parse_args()
    import torch

    from vllm_helpers import tokenizer

    torch.set_num_threads(args.threads)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0" if args.threads == 1 else f"0-{args.threads - 1}")
    work = Path(args.work)
    tok = tokenizer(work / "tok")
    texts = prompts(args.prompts)
    rows = []
    for size in (SIZES if args.size == "all" else [args.size]):
        for scheme, mode in CASES:
            rows.append(run_case(size, scheme, mode, tok, work / f"{size}-{scheme}", texts, args.new_tokens,
                                 args.repeats, args.eager))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    import vllm

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(["benchmarks/vllm_cpu.py", *sys.argv[1:]]),
                               "vllm": vllm.__version__, "torch": torch.__version__, "cpus": os.cpu_count(),
                               "threads": args.threads, "vllm_cpu_omp_threads_bind": os.environ["VLLM_CPU_OMP_THREADS_BIND"],
                               "rows": rows}, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":  # vLLM's engine starts processes that import this module again
    main()

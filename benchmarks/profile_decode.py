"""Profile a few decode steps of each decoder with ``torch.profiler``; top-ops tables to a folder.

    PYTHONPATH=src python benchmarks/profile_decode.py --out OUT/profile [--quick]

For each case -- the eager decoder (fixed M = 1, fixed M = 4, adaptive M = 4), the same eager
decoder with cuDNN attention turned off (fixed M = 4), the plain Hugging Face loop (M = 1) and the
CUDA-graph decoder (fixed M = 1 and 4, adaptive M = 4), and the eager decoder given a 2-D mask that the model expands
itself (what sliding-window models get) -- it runs the prompt and a few untimed steps, then profiles
``--steps`` steps (each read back to the host, as ``cyb generate`` does) and writes
``CASE.txt``: the wall time per step, host reads of device values per step
(``aten::_local_scalar_dense``, ``cudaStreamSynchronize``, ``cudaMemcpyAsync``...), and the
top ops by device time and by host time.  ``summary.json`` holds the per-step numbers of every
case.  The model is the decode benchmark's (Llama 134M shape, V = 32768, bf16, prompt 128).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("cyb") is None:  # a source checkout without an install
    sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from cyb.bench.decode import DecodeBenchConfig  # noqa: E402
from cyb.bench.models import DTYPES, build_hf_model, random_ids, real_ids_limit, wrap  # noqa: E402
from cyb.bench.models import spread_weights  # noqa: E402
from cyb.generation.registry import make_decoder  # noqa: E402

SYNC_EVENTS = ("aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "cudaStreamSynchronize",
               "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync")


def no_cudnn_attention():
    """SDPA without the cuDNN backend (flash, memory-efficient and math stay)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def profile_steps(step, steps: int, device) -> tuple[profile, float]:
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        wall = (time.perf_counter() - t0) * 1e3 / steps
    return prof, wall


def report(name: str, prof, wall_ms: float, steps: int, device, out: Path) -> dict:
    ev = prof.key_averages()
    counts = {e.key: e.count / steps for e in ev if e.key in SYNC_EVENTS}
    dev_key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    lines = [f"# {name}", f"wall ms per step (under the profiler): {wall_ms:.3f}",
             f"host reads / syncs per step: {json.dumps(counts)}", "",
             f"## top ops by {dev_key}", ev.table(sort_by=dev_key, row_limit=25), "",
             "## top ops by cpu_time_total", ev.table(sort_by="cpu_time_total", row_limit=25)]
    (out / f"{name}.txt").write_text("\n".join(lines))
    return {"wall_ms_per_step": wall_ms, "syncs_per_step": counts}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the tables")
    p.add_argument("--steps", type=int, default=10, help="profiled steps per case")
    p.add_argument("--quick", action="store_true", help="tiny model on the CPU (a smoke run)")
    args = p.parse_args(argv)
    cfg = DecodeBenchConfig.quick() if args.quick else DecodeBenchConfig()
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    args.out.mkdir(parents=True, exist_ok=True)
    m = cfg.num_steps
    warm, steps = 3, args.steps
    n_new = warm + steps + 4
    hf_model = build_hf_model(cfg.shape, cfg.vocab, dtype=DTYPES[cfg.dtype], device=device,
                              max_positions=(cfg.prompt_len + n_new + 2) * m + 16).eval()
    spread_weights(hf_model)
    ids = random_ids(1, cfg.prompt_len, real_ids_limit(cfg.vocab, m)).to(device)
    mask = torch.ones_like(ids)
    models = {1: wrap(hf_model, "baseline", 1), m: wrap(hf_model, "cyb", m)}
    cases = [("eager_fixed_M1", 1, "fixed", False, None),
             (f"eager_fixed_M{m}", m, "fixed", False, None),
             (f"eager_fixed_M{m}_no_cudnn_sdpa", m, "fixed", False, "no_cudnn"),
             (f"eager_fixed_M{m}_hf_masks", m, "fixed", False, "hf_masks"),
             (f"eager_adaptive_M{m}", m, "adaptive", False, None),
             ("graph_fixed_M1", 1, "fixed", True, None),
             (f"graph_fixed_M{m}", m, "fixed", True, None),
             (f"graph_adaptive_M{m}", m, "adaptive", True, None)]
    summary = {"device": str(device), "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
               "torch": torch.__version__, "cases": {}}
    for name, mm, mode, graph, ctx in cases:
        if ctx == "no_cudnn" and device.type != "cuda":
            continue
        cudnn_off = ctx == "no_cudnn"
        with torch.inference_mode(), (no_cudnn_attention() if cudnn_off else contextlib.nullcontext()):
            name = ("graph" if device.type == "cuda" else "static") if graph else "eager"
            dec = make_decoder(name, models[mm], ids, mask, mode=mode, max_new_tokens=n_new * m,
                               one_position=False)
            if ctx == "hf_masks":  # the 2-D mask, expanded by the model's own mask code per step
                dec.four_d = False
            dec.start()

            def step(dec=dec):
                return dec.step().token.tolist()
            for _ in range(warm):
                step()
            prof, wall = profile_steps(step, steps, device)
        summary["cases"][name] = report(name, prof, wall, steps, device, args.out)
        print(name, json.dumps(summary["cases"][name]))
    # the plain Hugging Face loop, M = 1: the causal LM's forward on a DynamicCache
    with torch.inference_mode():
        from cyb.model import hf

        arg = hf.cache_arg_name(hf_model)
        state = {"cache": models[1].new_cache()}
        out = hf_model(input_ids=ids, use_cache=True, **{arg: state["cache"]})
        state["token"] = out.logits[:, -1].argmax(-1)

        def hf_step():
            o = hf_model(input_ids=state["token"].unsqueeze(1), use_cache=True, **{arg: state["cache"]})
            state["token"] = o.logits[:, -1].argmax(-1)
            return state["token"].tolist()
        for _ in range(warm):
            hf_step()
        prof, wall = profile_steps(hf_step, steps, device)
    summary["cases"]["hf_eager_M1"] = report("hf_eager_M1", prof, wall, steps, device, args.out)
    print("hf_eager_M1", json.dumps(summary["cases"]["hf_eager_M1"]))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

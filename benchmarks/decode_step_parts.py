"""Where the graph decoder's time per step goes, fixed mode M = 1 against M = 4 (one GPU).

    PYTHONPATH=src python benchmarks/decode_step_parts.py --out OUT/parts.json [--quick]

The decode benchmark's model (Llama 134M shape, V = 32768, bf16, prompt 128, batch 1) on the
static decoder with its step captured as a CUDA graph.  For M = 1 and M = 4 and each attention
backend that scaled-dot-product attention may use under an explicit 4-D mask (``default``: what
torch picks, ``cudnn``, ``efficient``, ``math``), and with either the library's sequential
readout or a bare ``argmax`` of the last step's logits (what a no-pause model needs), it times
``--steps`` graph replays: device time per replay (CUDA events, no host read in between) and
host time per step with the decision read back (as ``cyb generate`` does).  The differences
say how much of the M = 4 step is attention over M times the keys and how much is the readout.
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

from cyb.bench.decode import DecodeBenchConfig  # noqa: E402
from cyb.bench.models import DTYPES, build_hf_model, random_ids, real_ids_limit, wrap  # noqa: E402
from cyb.bench.models import spread_weights  # noqa: E402
from cyb.generation.decoders import StepOutput  # noqa: E402
from cyb.generation.registry import make_decoder  # noqa: E402

BACKENDS = ("default", "cudnn", "efficient", "math")


def backend_context(name: str):
    if name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    pick = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH}[name]
    return sdpa_kernel([pick])


def argmax_readout(dec):
    """Replace the decoder's block readout with an argmax of the last step's logits."""
    def decide(block_hidden):
        token = dec.model.logits(block_hidden[:, -1]).argmax(-1)
        ones = torch.ones_like(token)
        return StepOutput(ones.bool(), token, ones, torch.zeros(token.shape[0], dec.m, device=token.device))
    dec._decide = decide


def time_case(model, ids, steps: int, readout: str, device) -> dict:
    mask = torch.ones_like(ids)
    name = "graph" if device.type == "cuda" else "static"
    dec = make_decoder(name, model, ids, mask, mode="fixed", max_new_tokens=2 * steps + 8)
    if readout == "argmax":
        argmax_readout(dec)
    out = dec.start()
    for _ in range(3):  # capture and warm up
        out = dec.step()
    out.token.tolist()
    on_cuda = device.type == "cuda"
    if on_cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    for _ in range(steps):
        dec.step()
    if on_cuda:
        end.record()
        end.synchronize()
        device_ms = start.elapsed_time(end) / steps
    else:
        device_ms = (time.perf_counter() - t0) * 1e3 / steps
    t0 = time.perf_counter()
    for _ in range(steps):
        dec.step().token.tolist()
    host_ms = (time.perf_counter() - t0) * 1e3 / steps
    return {"device_ms_per_step": device_ms, "host_ms_per_step_read_back": host_ms,
            "capacity": dec.capacity}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    p.add_argument("--steps", type=int, default=48, help="timed steps per case")
    p.add_argument("--quick", action="store_true", help="tiny model on the CPU (a smoke run)")
    args = p.parse_args(argv)
    cfg = DecodeBenchConfig.quick() if args.quick else DecodeBenchConfig()
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    m = cfg.num_steps
    hf_model = build_hf_model(cfg.shape, cfg.vocab, dtype=DTYPES[cfg.dtype], device=device,
                              max_positions=(cfg.prompt_len + 2 * args.steps + 16) * m + 16).eval()
    spread_weights(hf_model)
    ids = random_ids(1, cfg.prompt_len, real_ids_limit(cfg.vocab, m)).to(device)
    models = {1: wrap(hf_model, "baseline", 1), m: wrap(hf_model, "cyb", m)}
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "prompt_len": cfg.prompt_len, "steps": args.steps,
              "cases": []}
    backends = BACKENDS if device.type == "cuda" else ("default", "math")
    for backend in backends:
        for mm in (1, m):
            for readout in ("sequential", "argmax"):
                row = {"backend": backend, "num_steps": mm, "readout": readout}
                try:
                    with torch.inference_mode(), backend_context(backend):
                        row.update(time_case(models[mm], ids, args.steps, readout, device))
                    row["status"] = "ok"
                except Exception as e:  # a backend that cannot run this mask
                    row.update(status="error", reason=f"{type(e).__name__}: {str(e)[:200]}")
                result["cases"].append(row)
                print(json.dumps(row), flush=True)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

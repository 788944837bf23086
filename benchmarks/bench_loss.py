"""Forward+backward time and peak extra memory of the readout + loss, fused and not.

Methods (per vocabulary size V and number of positions N, hidden H, rows in blocks of M):

* ``naive_cyb``: full logits, :func:`cyb.readout.readout_reference`, CYB loss.
* ``logits_readout_cyb``: full logits, the chunked logits-level :func:`cyb.readout.readout`.
* ``fused_readout_cyb``: :func:`cyb.kernels.fused_readout` (recomputes logits in backward).
* ``fused_torch`` / ``fused_triton``: :func:`cyb.kernels.fused_linear_loss` with that backend.
* ``ce_full``: plain ``torch.nn.functional.cross_entropy`` on full (float32) logits, no dk.
* ``liger_flce``: Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss`` (no dk), if importable.

Also checks fused == naive (values and gradients) at a moderate size and records the max
errors.  Results go to ``--out`` as JSON and are printed as a table.

    python benchmarks/bench_loss.py --out runs/bench_loss.json        # on a GPU
    python benchmarks/bench_loss.py --quick                           # tiny CPU smoke run
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from cyb.kernels import chunked, fused_linear_loss, fused_readout, triton_available
from cyb.layout import IGNORE_INDEX
from cyb.losses import cyb_loss, discount
from cyb.readout import dk_logit_bias, readout, readout_reference

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ALL_METHODS = ("naive_cyb", "logits_readout_cyb", "fused_readout_cyb", "fused_torch",
               "fused_triton", "ce_full", "liger_flce")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="write results as JSON here")
    p.add_argument("--quick", action="store_true", help="tiny CPU run (smoke test)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--vocab", type=int, nargs="+", default=[32768, 131072, 262144])
    p.add_argument("--positions", type=int, nargs="+", default=[8192, 16384, 32768, 65536])
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--num-steps", type=int, default=4, help="M, rows per block")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per row (after a warm-up)")
    p.add_argument("--methods", nargs="+", choices=ALL_METHODS, default=list(ALL_METHODS))
    p.add_argument("--chunk-blocks", type=int, default=None, help="fused_linear_loss chunk_blocks")
    p.add_argument("--check-size", type=int, nargs=3, default=[4096, 32768, 768],
                   metavar=("N", "V", "H"), help="size of the fused == naive check")
    p.add_argument("--skip-check", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.device = args.device or "cpu"
        args.vocab, args.positions, args.hidden = [512, 2048], [256, 1024], 32
        args.dtype, args.repeats, args.check_size = "fp32", 2, [256, 1024, 32]
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.num_steps < 1:
        p.error("--num-steps must be >= 1")
    return args


# ---------------------------------------------------------------------------- problem


def make_problem(n, v, h, m, dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).to(device=device, dtype=dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g) * h ** -0.5).to(device=device, dtype=dtype)
    weight.requires_grad_()
    block_t = torch.randint(0, v - 1, (n // m,), generator=g)
    block_t[::20] = IGNORE_INDEX  # a few ignored blocks, as at document ends
    targets = block_t.repeat_interleave(m).to(device)
    return hidden, weight, targets


def make_methods(v, m, chunk_blocks):
    dk = v - 1
    bias = dk_logit_bias(v)
    gamma = discount(0.95, m)

    def loss_fn(lt, ld, lnd):
        return cyb_loss(lt, ld, lnd, gamma=gamma)

    def block_sum(rows, targets):
        lt, ld, lnd = (x.view(-1, m) for x in rows)
        valid = targets.view(-1, m)[:, 0] != IGNORE_INDEX
        per = loss_fn(lt, ld, lnd)
        return torch.where(valid, per, torch.zeros_like(per)).sum()

    def naive_cyb(hidden, weight, targets):
        logits = hidden @ weight.t()
        return block_sum(readout_reference(logits, targets, dk_id=dk, dk_bias=bias), targets)

    def logits_readout_cyb(hidden, weight, targets):
        logits = hidden @ weight.t()
        return block_sum(readout(logits, targets, dk_id=dk, dk_bias=bias), targets)

    def fused_readout_cyb(hidden, weight, targets):
        rows = fused_readout(hidden, weight, targets, dk_id=dk, dk_bias=bias)
        return block_sum(rows, targets)

    def fused(backend):
        def run(hidden, weight, targets):
            loss, _ = fused_linear_loss(hidden, weight, targets, loss_fn, m, dk_id=dk,
                                        dk_bias=bias, backend=backend, chunk_blocks=chunk_blocks)
            return loss
        return run

    def ce_full(hidden, weight, targets):
        logits = (hidden @ weight.t()).float()
        return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")

    methods = {
        "naive_cyb": naive_cyb,
        "logits_readout_cyb": logits_readout_cyb,
        "fused_readout_cyb": fused_readout_cyb,
        "fused_torch": fused("torch"),
        "fused_triton": fused("triton"),
        "ce_full": ce_full,
    }
    liger = _liger_loss()
    if liger is not None:
        methods["liger_flce"] = lambda hidden, weight, targets: liger(weight, hidden, targets)
    return methods


def _liger_loss():
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except Exception:
        return None
    return LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")


def unavailable(name, device):
    """Why a method cannot run here, or None."""
    if name in ("fused_triton",) and (device.type != "cuda" or not triton_available()):
        return "needs CUDA and triton"
    if name == "liger_flce":
        if device.type != "cuda":
            return "needs CUDA"
        if _liger_loss() is None:
            return "liger_kernel not importable"
    return None


# ----------------------------------------------------------------------------- timing


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


def _free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure(fn, hidden, weight, targets, repeats, device):
    """``{"ms": median fwd+bwd ms, "ms_all": [...], "peak_extra_gib": ...}`` (memory: CUDA only)."""

    def step():
        hidden.grad = weight.grad = None
        loss = fn(hidden, weight, targets)
        loss.backward()
        return loss

    step()  # warm-up: kernel compilation, allocator
    _sync(device)
    hidden.grad = weight.grad = None
    _free(device)
    peak = None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        _sync(device)
        peak = (torch.cuda.max_memory_allocated(device) - base) / 2**30
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = step()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            loss = step()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {"ms": times[len(times) // 2], "ms_all": times, "peak_extra_gib": peak,
            "loss": float(loss.detach())}


def run_grid(args, on_row=None):
    """Measure every (vocab, positions, method); ``on_row(rows)`` after each one."""
    dtype = DTYPES[args.dtype]
    rows = []
    for v in args.vocab:
        methods = make_methods(v, args.num_steps, args.chunk_blocks)
        for n in args.positions:
            n = n - n % args.num_steps
            hidden, weight, targets = make_problem(n, v, args.hidden, args.num_steps, dtype,
                                                   args.device)
            for name in args.methods:
                row = {"method": name, "vocab": v, "positions": n}
                why = unavailable(name, args.device)
                if why is not None:
                    row.update(status="skipped", reason=why)
                else:
                    try:
                        row.update(status="ok", **measure(methods[name], hidden, weight, targets,
                                                          args.repeats, args.device))
                    except Exception as err:  # noqa: BLE001  (record and go on)
                        if not _is_oom(err):
                            row.update(status="error", reason=f"{type(err).__name__}: {err}"[:300])
                        else:
                            row.update(status="oom")
                    hidden.grad = weight.grad = None
                    _free(args.device)
                rows.append(row)
                print(_row_line(row), flush=True)
                if on_row is not None:
                    on_row(rows)
            del hidden, weight, targets
            _free(args.device)
    return rows


# ----------------------------------------------------------------------- correctness


def check_fused(args):
    """Max errors of the fused paths against the naive one, in float32 and the bench dtype."""
    n, v, h = args.check_size
    m = args.num_steps
    n -= n % m
    methods = make_methods(v, m, args.chunk_blocks)
    out = {"size": {"N": n, "V": v, "H": h, "M": m}}
    dtypes = {"fp32": torch.float32, args.dtype: DTYPES[args.dtype]}
    for dname, dtype in dtypes.items():
        hidden, weight, targets = make_problem(n, v, h, m, dtype, args.device, seed=1)
        try:
            ref = _loss_and_grads(methods["naive_cyb"], hidden, weight, targets)
        except Exception as err:  # noqa: BLE001
            out[dname] = {"status": "oom" if _is_oom(err) else f"error: {err}"[:300]}
            continue
        for name in ("fused_torch", "fused_triton", "fused_readout_cyb"):
            if unavailable(name, args.device):
                continue
            try:
                got = _loss_and_grads(methods[name], hidden, weight, targets)
            except Exception as err:  # noqa: BLE001
                why = "oom" if _is_oom(err) else f"error: {err}"[:300]
                out.setdefault(dname, {})[name] = {"status": why}
                continue
            errs = {}
            for key, a, b in zip(("loss", "grad_hidden", "grad_weight"), got, ref):
                diff = (a.double() - b.double()).abs().max().item()
                scale = b.double().abs().max().item()
                errs[key] = {"max_abs": diff, "max_rel_to_max": diff / max(scale, 1e-30)}
            out.setdefault(dname, {})[name] = errs
        out[dname]["readout_rows"] = _check_rows(hidden, weight, targets, v, args.device)
        del hidden, weight, targets, ref
        _free(args.device)
    return out


def _check_rows(hidden, weight, targets, v, device):
    """Max abs error of fused_readout's per-row log_t, log_d, log_not_d per backend."""
    dk, bias = v - 1, dk_logit_bias(v)
    with torch.no_grad():
        want = readout_reference(hidden @ weight.t(), targets, dk_id=dk, dk_bias=bias)
        res = {}
        for backend in ("torch", "triton"):
            if backend == "triton" and unavailable("fused_triton", device):
                continue
            got = fused_readout(hidden, weight, targets, dk_id=dk, dk_bias=bias, backend=backend)
            res[backend] = {k: (a.double() - b.double()).abs().max().item()
                            for k, a, b in zip(("log_t", "log_d", "log_not_d"), got, want)}
    return res


def _loss_and_grads(fn, hidden, weight, targets):
    hidden.grad = weight.grad = None
    loss = fn(hidden, weight, targets)
    loss.backward()
    res = (loss.detach().clone(), hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    return res


# ----------------------------------------------------------------------------- output


def _row_line(row):
    head = f"V={row['vocab']:>7} N={row['positions']:>6} {row['method']:<20}"
    if row["status"] != "ok":
        return f"{head} {row['status']} {row.get('reason', '')}"
    mem = "" if row["peak_extra_gib"] is None else f" {row['peak_extra_gib']:8.3f} GiB"
    return f"{head} {row['ms']:9.2f} ms{mem}"


def table(rows, methods):
    keys = sorted({(r["vocab"], r["positions"]) for r in rows})
    cell = {(r["vocab"], r["positions"], r["method"]): r for r in rows}
    present = [m for m in methods if any(r["method"] == m for r in rows)]
    lines = ["| V | N | " + " | ".join(present) + " |",
             "|---|---|" + "---|" * len(present)]
    for v, n in keys:
        parts = []
        for m in present:
            r = cell.get((v, n, m))
            if r is None or r["status"] != "ok":
                parts.append("-" if r is None else r["status"])
            elif r["peak_extra_gib"] is None:
                parts.append(f"{r['ms']:.1f} ms")
            else:
                parts.append(f"{r['ms']:.1f} ms / {r['peak_extra_gib']:.2f} GiB")
        lines.append(f"| {v} | {n} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def environment(device):
    env = {"python": platform.python_version(), "torch": torch.__version__,
           "device": str(device), "argv": sys.argv}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    if triton_available():
        import triton

        env["triton"] = triton.__version__
    try:
        import liger_kernel  # noqa: F401
        from importlib.metadata import version

        env["liger_kernel"] = version("liger-kernel")
    except Exception:
        pass
    return env


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(0)
    result = {"env": environment(args.device),
              "config": {"hidden": args.hidden, "num_steps": args.num_steps, "dtype": args.dtype,
                         "repeats": args.repeats, "chunk_blocks": args.chunk_blocks,
                         "default_chunk_elements": {"triton": chunked.TRITON_CHUNK_ELEMENTS,
                                                    "torch": chunked.TORCH_CHUNK_ELEMENTS}}}
    if not args.skip_check:
        result["check"] = check_fused(args)
        print(json.dumps(result["check"], indent=1), flush=True)

    def save(rows):  # after every row, so a killed run keeps what it measured
        result["results"] = rows
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.out.with_suffix(args.out.suffix + ".tmp")
            tmp.write_text(json.dumps(result, indent=1))
            tmp.replace(args.out)

    save(run_grid(args, on_row=save))
    print()
    print(table(result["results"], args.methods))
    if args.out is not None:
        print(f"\nwrote {args.out}")
    return result


if __name__ == "__main__":
    main()

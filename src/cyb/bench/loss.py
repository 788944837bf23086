"""``cyb bench loss``: forward+backward time and peak extra memory of the readout and loss.

Methods (per vocabulary size V and number of positions N, hidden H, rows in blocks of M):

* ``naive_cyb``: full logits, :func:`cyb.readout.readout_reference`, CYB loss.
* ``logits_readout_cyb``: full logits, the chunked logits-level :func:`cyb.readout.readout`.
* ``fused_readout_cyb``: :func:`cyb.kernels.fused_readout` (recomputes logits in backward).
* ``fused_torch`` / ``fused_triton``: :func:`cyb.kernels.fused_linear_loss` with that backend.
* ``ce_full``: plain ``torch.nn.functional.cross_entropy`` on full (float32) logits, no dk.
* ``liger_flce``: Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss`` (no dk), if importable.

Also checks fused == naive (values and gradients) at a moderate size and records the max
errors. Sizes default to a GPU grid on CUDA (up to 65,536 positions at vocabulary 262,144) and
to a small grid on the CPU (:meth:`LossBenchConfig.for_device`).
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..kernels import chunked, fused_linear_loss, fused_readout, triton_available
from ..layout import IGNORE_INDEX
from ..losses import cyb_loss, discount
from ..readout import dk_logit_bias, readout, readout_reference
from ..runtime import resolve_device
from .timing import environment, free_memory, guarded, time_calls, write_json

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
METHODS = ("naive_cyb", "logits_readout_cyb", "fused_readout_cyb", "fused_torch", "fused_triton", "ce_full",
           "liger_flce")

#: Sizes (and repeats) by device type, for the fields left None.
GPU_SIZES = dict(vocab=(32768, 131072, 262144), positions=(8192, 16384, 32768, 65536), hidden=768,
                 check_size=(4096, 32768, 768), dtype="bf16", repeats=5)
CPU_SIZES = dict(vocab=(8192, 32768), positions=(1024, 4096), hidden=256, check_size=(512, 8192, 64),
                 dtype="fp32", repeats=2)


@dataclass
class LossBenchConfig:
    """What to measure (None sizes: :data:`GPU_SIZES` on CUDA, :data:`CPU_SIZES` elsewhere)."""

    vocab: tuple | None = None
    positions: tuple | None = None
    hidden: int | None = None
    num_steps: int = 4
    dtype: str | None = None
    repeats: int | None = None
    warmup: int = 1
    methods: tuple = METHODS
    chunk_blocks: int | None = None
    check_size: tuple | None = None
    skip_check: bool = False
    device: str | None = None
    seed: int = 0

    @classmethod
    def quick(cls, **overrides) -> "LossBenchConfig":
        """Tiny float32 shapes on the CPU, one timed run (a smoke run of every code path)."""
        base = dict(device="cpu", dtype="fp32", vocab=(256,), positions=(64, 128), hidden=16, repeats=1,
                    check_size=(64, 256, 16))
        base.update(overrides)
        return cls(**base)

    def resolved(self, device: torch.device) -> "LossBenchConfig":
        """A copy with the sizes left None filled in for ``device``, checked."""
        sizes = GPU_SIZES if device.type == "cuda" else CPU_SIZES
        out = LossBenchConfig(**{**asdict(self), **{k: v for k, v in sizes.items() if getattr(self, k) is None}})
        bad = [m for m in out.methods if m not in METHODS]
        if bad:
            raise ValueError(f"methods: unknown {bad}; choose from {', '.join(METHODS)}")
        if out.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {out.dtype!r}")
        if out.num_steps < 1 or out.repeats < 1 or out.hidden < 1:
            raise ValueError("num_steps, repeats and hidden must be >= 1")
        return out


# ---------------------------------------------------------------------------- problem


def make_problem(n: int, v: int, h: int, m: int, dtype, device, seed: int = 0):
    """Random hidden states ``[n, h]``, an output matrix ``[v, h]`` and block targets (every
    20th block ignored, as at document ends)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).to(device=device, dtype=dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g) * h ** -0.5).to(device=device, dtype=dtype)
    weight.requires_grad_()
    block_t = torch.randint(0, v - 1, (n // m,), generator=g)
    block_t[::20] = IGNORE_INDEX
    return hidden, weight, block_t.repeat_interleave(m).to(device)


def _liger_loss():
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except Exception:  # noqa: BLE001 (absent or broken: the row is skipped)
        return None
    return LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")


def make_methods(v: int, m: int, chunk_blocks: int | None) -> dict:
    """``{name: f(hidden, weight, targets) -> loss}`` for every method that can be built."""
    dk, bias = v - 1, dk_logit_bias(v)
    gamma = discount(0.95, m)

    def loss_fn(lt, ld, lnd):
        return cyb_loss(lt, ld, lnd, gamma=gamma)

    def block_sum(rows, targets):
        lt, ld, lnd = (x.view(-1, m) for x in rows)
        valid = targets.view(-1, m)[:, 0] != IGNORE_INDEX
        per = loss_fn(lt, ld, lnd)
        return torch.where(valid, per, torch.zeros_like(per)).sum()

    def fused(backend):
        def run(hidden, weight, targets):
            return fused_linear_loss(hidden, weight, targets, loss_fn, m, dk_id=dk, dk_bias=bias,
                                     backend=backend, chunk_blocks=chunk_blocks)[0]
        return run

    methods = {
        "naive_cyb": lambda h, w, t: block_sum(readout_reference(h @ w.t(), t, dk_id=dk, dk_bias=bias), t),
        "logits_readout_cyb": lambda h, w, t: block_sum(readout(h @ w.t(), t, dk_id=dk, dk_bias=bias), t),
        "fused_readout_cyb": lambda h, w, t: block_sum(fused_readout(h, w, t, dk_id=dk, dk_bias=bias), t),
        "fused_torch": fused("torch"),
        "fused_triton": fused("triton"),
        "ce_full": lambda h, w, t: F.cross_entropy((h @ w.t()).float(), t, ignore_index=IGNORE_INDEX,
                                                    reduction="sum"),
    }
    liger = _liger_loss()
    if liger is not None:
        methods["liger_flce"] = lambda h, w, t: liger(w, h, t)
    return methods


def unavailable(name: str, device: torch.device) -> str | None:
    """Why a method cannot run here, or None."""
    if name == "fused_triton" and (device.type != "cuda" or not triton_available()):
        return "needs CUDA and triton"
    if name == "liger_flce":
        if device.type != "cuda":
            return "needs CUDA"
        if _liger_loss() is None:
            return "liger_kernel not importable"
    return None


# ----------------------------------------------------------------------------- measuring


def _step(fn, hidden, weight, targets):
    hidden.grad = weight.grad = None
    loss = fn(hidden, weight, targets)
    loss.backward()
    return loss


def measure(fn, hidden, weight, targets, cfg: LossBenchConfig, device: torch.device) -> dict:
    """``{"ms", "ms_all", "peak_extra_gib", "loss"}``: median forward+backward time and the
    peak memory beyond the inputs (CUDA only)."""
    base = torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else None
    t = time_calls(lambda: _step(fn, hidden, weight, targets), device=device, warmup=cfg.warmup,
                   repeats=cfg.repeats)
    loss = _step(fn, hidden, weight, targets)
    hidden.grad = weight.grad = None
    peak = None if t["peak_gib"] is None else t["peak_gib"] - base
    return {"ms": t["ms"], "ms_all": t["ms_all"], "peak_extra_gib": peak, "loss": float(loss.detach())}


def run_grid(cfg: LossBenchConfig, device: torch.device, on_row=None) -> list[dict]:
    """Measure every (vocab, positions, method), printing each row's line (``[k/total]`` first)
    as it is measured; ``on_row(rows)`` after each one."""
    dtype = DTYPES[cfg.dtype]
    rows = []
    total = len(cfg.vocab) * len(cfg.positions) * len(cfg.methods)
    for v in cfg.vocab:
        methods = make_methods(v, cfg.num_steps, cfg.chunk_blocks)
        for n in cfg.positions:
            n -= n % cfg.num_steps
            hidden, weight, targets = make_problem(n, v, cfg.hidden, cfg.num_steps, dtype, device, cfg.seed)
            for name in cfg.methods:
                row = {"method": name, "vocab": v, "positions": n}
                why = unavailable(name, device)
                if why is not None:
                    row.update(status="skipped", reason=why)
                else:
                    row.update(guarded(lambda: measure(methods[name], hidden, weight, targets, cfg, device),
                                       device))
                    hidden.grad = weight.grad = None
                rows.append(row)
                print(f"[{len(rows)}/{total}] {row_line(row)}", flush=True)
                if on_row is not None:
                    on_row(rows)
            del hidden, weight, targets
            free_memory(device)
    return rows


# ----------------------------------------------------------------------- correctness


def _loss_and_grads(fn, hidden, weight, targets):
    loss = _step(fn, hidden, weight, targets)
    res = (loss.detach().clone(), hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    return res


def _errors(got, ref) -> dict:
    errs = {}
    for key, a, b in zip(("loss", "grad_hidden", "grad_weight"), got, ref):
        diff = (a.double() - b.double()).abs().max().item()
        errs[key] = {"max_abs": diff, "max_rel_to_max": diff / max(b.double().abs().max().item(), 1e-30)}
    return errs


def _check_rows(hidden, weight, targets, v: int, device: torch.device) -> dict:
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


def check_fused(cfg: LossBenchConfig, device: torch.device) -> dict:
    """Max errors of the fused paths against the naive one, in float32 and the bench dtype."""
    n, v, h = cfg.check_size
    m = cfg.num_steps
    n -= n % m
    methods = make_methods(v, m, cfg.chunk_blocks)
    out: dict = {"size": {"N": n, "V": v, "H": h, "M": m}}
    for dname in dict.fromkeys(("fp32", cfg.dtype)):
        hidden, weight, targets = make_problem(n, v, h, m, DTYPES[dname], device, seed=1)
        ref = guarded(lambda: {"value": _loss_and_grads(methods["naive_cyb"], hidden, weight, targets)}, device)
        if ref["status"] != "ok":
            out[dname] = {"status": ref["status"], "reason": ref.get("reason")}
            continue
        res = {}
        for name in ("fused_torch", "fused_triton", "fused_readout_cyb"):
            if unavailable(name, device):
                continue
            got = guarded(lambda: {"value": _loss_and_grads(methods[name], hidden, weight, targets)}, device)
            res[name] = _errors(got["value"], ref["value"]) if got["status"] == "ok" else {"status": got["status"]}
        res["readout_rows"] = _check_rows(hidden, weight, targets, v, device)
        out[dname] = res
        del hidden, weight, targets, ref
        free_memory(device)
    return out


# ----------------------------------------------------------------------------- output

#: N x V x H summed over the grid's rows above which a CPU takes minutes: one forward and
#: backward at V = 8192, N = 1024, H = 256 (2.1e9) took 0.4-0.5 s on a core of the 2-core CPU
#: here, and every row runs its method warmup + repeats + 1 times
SLOW_ON_CPU = 1e9


def start_lines(cfg: LossBenchConfig, device: torch.device) -> list[str]:
    """What a run says before it starts (on standard error): the rows it will measure, the check
    before them, and on a CPU with sizes that take minutes, that it does."""
    def count(n: int, what: str) -> str:
        return f"{n} {what}{'' if n == 1 else 's'}"

    rows = len(cfg.vocab) * len(cfg.positions) * len(cfg.methods)
    lines = [f"cyb bench loss: {count(rows, 'row')} ({count(len(cfg.methods), 'method')} x "
             f"{count(len(cfg.vocab), 'vocabulary size')} x {count(len(cfg.positions), 'position count')}), "
             f"{count(cfg.repeats, 'timed run')} each, {cfg.dtype} on {device}; a line per row as it is measured"]
    if not cfg.skip_check:
        n, v, h = cfg.check_size
        lines.append(f"first the check of the fused paths against the naive one (N={n}, V={v}, H={h})")
    work = sum(v * n for v in cfg.vocab for n in cfg.positions) * cfg.hidden
    if device.type == "cpu" and work > SLOW_ON_CPU:
        lines.append("on a CPU these sizes take minutes (--quick runs every path in seconds)")
    return lines



def row_line(row: dict) -> str:
    head = f"V={row['vocab']:>7} N={row['positions']:>6} {row['method']:<20}"
    if row["status"] != "ok":
        return f"{head} {row['status']} {row.get('reason', '')}"
    mem = "" if row["peak_extra_gib"] is None else f" {row['peak_extra_gib']:8.3f} GiB"
    return f"{head} {row['ms']:9.2f} ms{mem}"


def run(cfg: LossBenchConfig, *, out: str | None = None) -> dict:
    """Check and measure as ``cfg`` says; the result (written to ``out`` after every row, so
    a killed run keeps what it measured) has ``kind = "loss"``, ``env``, ``config``, ``check``
    and ``results``."""
    device = resolve_device(cfg.device, what="--device")
    cfg = cfg.resolved(device)
    torch.manual_seed(cfg.seed)
    result = {"kind": "loss", "env": environment(device),
              "config": {**asdict(cfg), "default_chunk_elements": {"triton": chunked.TRITON_CHUNK_ELEMENTS,
                                                                   "torch": chunked.TORCH_CHUNK_ELEMENTS}}}
    for line in start_lines(cfg, device):
        print(line, file=sys.stderr, flush=True)
    if not cfg.skip_check:
        result["check"] = check_fused(cfg, device)

    def save(rows):
        result["results"] = rows
        write_json(out, result)

    save(run_grid(cfg, device, on_row=save))
    return result


__all__ = ["CPU_SIZES", "GPU_SIZES", "LossBenchConfig", "METHODS", "check_fused", "make_methods",
           "make_problem", "measure", "run", "run_grid"]

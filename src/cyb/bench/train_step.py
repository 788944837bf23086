"""Training-step benchmark: one optimiser step of each method on the same model.

Variants (rows of ``L`` real tokens, batch ``B``, ``M`` steps per token):

* ``baseline_hf``: no pauses (``L`` positions), the Hugging Face model's own loss.
* ``tbys_hf``: Recipe 1 pauses (``L * M`` positions), the Hugging Face model's own loss with
  labels only at the last step of each block (full logits at every position, as a plain
  Hugging Face loop computes them).
* ``tbys_liger``: the decoder's last hidden states at the last step of each block through
  Liger-Kernel's fused linear cross-entropy (CUDA and liger-kernel only).
* ``cyb_naive`` / ``cyb_fused``: :class:`cyb.objective.Objective` with the CYB loss, full logits
  or the fused readout (:func:`cyb.kernels.fused_linear_loss`), as ``cyb train`` runs it.
* ``cyb_fused_lowmem``: ``cyb_fused`` with logits chunks of at most ``2**27`` elements (the
  default allows up to ``2**29``): less memory, more chunks (more host work per step).
* ``cyb_private`` / ``tbys_private``: ``cyb_fused`` and TBYS (fused readout) with private
  pauses (:mod:`cyb.visibility`), through the kernel ``auto`` picks (block-sparse FlexAttention
  on CUDA, a dense mask on the CPU); ``cyb_private_split``: the same through the split
  attention (:mod:`cyb.kernels.split_attention`: causal FlashAttention calls on CUDA).
* ``cyb_gated``: ``cyb_fused`` with gated pauses (the kernel ``auto`` picks: on CUDA
  FlexAttention with the gate in its scores on rows of up to 4,096 positions, the split attention
  beyond); ``cyb_gated_dense``: the same through the dense ``[B, heads, T, T]`` additive mask;
  ``cyb_gated_flex``: through FlexAttention (``pause_kernel="flex"``; CUDA only, where
  FlexAttention has a backward); ``cyb_gated_split``: through the split attention.

Each in mode ``eager`` or ``compile`` (every decoder layer compiled with ``module.compile()``,
as ``train.compile`` does).  A step is forward, backward, AdamW (fused on CUDA) and zeroing the
gradients, with bf16 parameters (``precision="bf16"``, as the reference measurements and
``cyb train`` with ``model.dtype: bfloat16``), or float32 parameters under bf16 autocast
(``"autocast"``: the ``cyb train`` default on GPU), or float32.  Every variant starts from the
same weights; the data layout is prepared once, outside the timed step.  On CUDA each row also
has the GPU's kernel time per step (``kernel_ms``: two more steps under the torch profiler) and
its share of the step (``gpu_busy``): the figure to compare across machines, as the step time
also moves with the speed of the host.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field

import torch

from ..runtime import autocast
from . import flops as flops_mod
from .models import SHAPE_134M, SHAPE_TINY, ModelShape, build_hf_model, num_params
from .models import random_ids, real_ids_limit, wrap
from .timing import Budget, device_name, environment, free_memory, guarded, kernel_ms, time_calls, write_json

VARIANTS = ("baseline_hf", "tbys_hf", "tbys_liger", "cyb_naive", "cyb_fused", "cyb_fused_lowmem",
            "cyb_private", "tbys_private", "cyb_private_split", "cyb_gated", "cyb_gated_dense", "cyb_gated_flex",
            "cyb_gated_split")
MODES = ("eager", "compile")
PRECISIONS = ("autocast", "bf16", "fp32")
_METHOD = {"baseline_hf": "baseline", "tbys_hf": "tbys", "tbys_liger": "tbys",
           "cyb_naive": "cyb", "cyb_fused": "cyb", "cyb_fused_lowmem": "cyb",
           "cyb_private": "cyb_private", "tbys_private": "tbys_private", "cyb_private_split": "cyb_private_split",
           "cyb_gated": "cyb_gated", "cyb_gated_dense": "cyb_gated_dense", "cyb_gated_flex": "cyb_gated_flex",
           "cyb_gated_split": "cyb_gated_split"}
#: the method of each model key (its visibility and pause kernel: :func:`_model_kind`)
_BASE = {"baseline": "baseline", "tbys": "tbys", "cyb": "cyb", "cyb_private": "cyb", "tbys_private": "tbys",
         "cyb_private_split": "cyb", "cyb_gated": "cyb", "cyb_gated_dense": "cyb", "cyb_gated_flex": "cyb",
         "cyb_gated_split": "cyb"}


def _model_kind(key: str) -> tuple[str, str]:
    """``(visibility, pause kernel)`` of a model key."""
    visibility = "private" if "_private" in key else "gated" if "_gated" in key else "shared"
    kernel = next((k for k in ("split", "dense", "flex") if key.endswith("_" + k)), "auto")
    return visibility, kernel
#: Logits per chunk of ``cyb_fused_lowmem`` (bf16: 256 MiB).
LOWMEM_CHUNK_ELEMENTS = 1 << 27
# Seconds a compiled row is assumed to need at least (compilation); rows that would not fit in
# the remaining budget are skipped rather than cut off.
COMPILE_RESERVE_S = 45.0
EAGER_RESERVE_S = 5.0


@dataclass
class TrainBenchConfig:
    """What to measure.  ``cases`` are ``(vocab_size, batch)`` pairs, run in order."""

    shape: ModelShape = SHAPE_134M
    cases: list = field(default_factory=lambda: [(32768, 4), (262144, 8)])
    real_tokens: int = 2048
    num_steps: int = 4
    variants: tuple = VARIANTS
    modes: tuple = MODES
    precision: str = "bf16"
    warmup: int = 2
    compile_warmup: int = 3
    repeats: int = 5
    lr: float = 1e-4
    device: str | None = None
    budget_s: float | None = None
    seed: int = 0

    @classmethod
    def quick(cls, **overrides) -> "TrainBenchConfig":
        """Tiny shapes on CPU, eager only, one timed step (a smoke run)."""
        base = dict(shape=SHAPE_TINY, cases=[(256, 2)], real_tokens=16, modes=("eager",),
                    precision="fp32", warmup=1, compile_warmup=1, repeats=1, device="cpu")
        base.update(overrides)
        return cls(**base)

    def validate(self) -> "TrainBenchConfig":
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad:
            raise ValueError(f"variants: unknown {bad}; choose from {VARIANTS}")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ValueError(f"modes: unknown {bad}; choose from {MODES}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.num_steps < 2:
            raise ValueError(f"num_steps (M) must be >= 2, got {self.num_steps}")
        if self.real_tokens < 2:
            raise ValueError(f"real_tokens must be >= 2, got {self.real_tokens}")
        for v, b in self.cases:
            if b < 1 or v <= self.num_steps + 1:
                raise ValueError(f"cases: (vocab, batch) = ({v}, {b}) needs batch >= 1 and "
                                 f"vocab > M + 1")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        return self

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["shape"] = self.shape.to_dict()
        d["cases"] = [list(c) for c in self.cases]
        d["variants"], d["modes"] = list(self.variants), list(self.modes)
        return d


# ------------------------------------------------------------------------------ pieces


def liger_loss_or_none():
    """Liger-Kernel's fused linear cross-entropy module (mean over targets), or None."""
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except Exception:  # noqa: BLE001 (not installed or not importable here)
        return None
    from ..layout import IGNORE_INDEX

    return LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="mean")


def unavailable(variant: str, device: torch.device) -> str | None:
    """Why ``variant`` cannot run here, or None."""
    if variant == "tbys_liger":
        if device.type != "cuda":
            return "needs CUDA"
        if liger_loss_or_none() is None:
            return "liger_kernel not importable"
    if variant == "cyb_gated_flex" and device.type != "cuda":
        return "needs CUDA (FlexAttention has no backward on the CPU)"
    return None


def hf_last_step_labels(labels: torch.Tensor, num_steps: int) -> torch.Tensor:
    """Labels for a Hugging Face causal-LM loss that reads out only at the last step of a block.

    ``labels [B, T]`` is the per-step target (:class:`cyb.objective.Prepared`); Hugging Face
    shifts labels left by one, so the label at ``j + 1`` is the target of the output at ``j``.
    Returns ``[B, T]`` with the target of every block's last step at the next index and
    ``IGNORE_INDEX`` elsewhere (with ``M = 1``: the plain next-token labels).
    """
    from ..layout import IGNORE_INDEX

    t = labels.shape[1]
    out = torch.full_like(labels, IGNORE_INDEX)
    last = (torch.arange(t, device=labels.device) % num_steps) == num_steps - 1
    out[:, 1:] = torch.where(last[:-1], labels[:, :-1], torch.full_like(labels[:, :-1], IGNORE_INDEX))
    return out


def _autocast(precision: str, device: torch.device):
    """``"autocast"``: float32 parameters under bf16 autocast; bf16 and fp32 need none."""
    return autocast(device, "bf16" if precision == "autocast" else "fp32")


def _param_dtype(precision: str) -> torch.dtype:
    return torch.bfloat16 if precision == "bf16" else torch.float32


def _objective(method: str, model, impl: str):
    from ..config import MethodConfig
    from ..objective import Objective

    cfg = MethodConfig(name=method, num_steps=model.num_steps)
    return Objective(cfg, model.vocab, model.dk_bias, impl)


class _Case:
    """One ``(vocab, batch)`` case: a model, the prepared data of each method, the variants."""

    def __init__(self, cfg: TrainBenchConfig, vocab: int, batch: int, device: torch.device):
        self.cfg, self.vocab, self.batch, self.device = cfg, vocab, batch, device
        m = cfg.num_steps
        self.hf_model = build_hf_model(cfg.shape, vocab, dtype=_param_dtype(cfg.precision),
                                       device=device, max_positions=max(8192, cfg.real_tokens * m),
                                       seed=cfg.seed)
        self.hf_model.train()
        keys = {_METHOD[v] for v in cfg.variants} | {"cyb"}
        self.models = {}
        for key in [k for k in _BASE if k in keys]:
            visibility, kernel = _model_kind(key)
            self.models[key] = wrap(self.hf_model, _BASE[key], m, visibility)
            self.models[key].pause_kernel = kernel
        ids = random_ids(batch, cfg.real_tokens, real_ids_limit(vocab, m), seed=cfg.seed)
        self.preps = {}
        for key, model in self.models.items():
            prep = _objective(_BASE[key], model, "naive").prepare({"ids": ids})
            self.preps[key] = prep.to(device)
        self.hf_labels = {me: hf_last_step_labels(p.labels, self.models[me].num_steps)
                          for me, p in self.preps.items()}
        self.params_count = num_params(self.hf_model)
        self.compiled = False
        # every variant starts from the same weights (kept on the host), so the loss of its
        # first step can be compared across variants
        self.params = [p for p in self.hf_model.parameters() if p.requires_grad]
        self.initial = [p.detach().to("cpu", copy=True) for p in self.params]

    @torch.no_grad()
    def restore(self) -> None:
        for p, saved in zip(self.params, self.initial):
            p.copy_(saved)

    def compile_layers(self) -> None:
        """Compile every decoder layer in place (what ``train.compile`` does)."""
        if not self.compiled:
            for layer in self.models["cyb"].decoder_layers():
                layer.compile()
            self.compiled = True

    def loss_fn(self, variant: str):
        """A closure computing the (mean) training loss of ``variant`` on this case's batch."""
        method = _METHOD[variant]
        model, prep = self.models[method], self.preps[method]
        if variant.endswith("_hf"):
            labels = self.hf_labels[method]

            def hf_loss():
                out = self.hf_model(input_ids=prep.input_ids, position_ids=prep.position_ids,
                                    attention_mask=prep.attention_mask, labels=labels,
                                    use_cache=False)
                return out.loss
            return hf_loss
        if variant == "tbys_liger":
            liger = liger_loss_or_none()
            m = model.num_steps
            targets = prep.labels[:, m - 1::m].reshape(-1)

            def liger_loss():
                hidden, _ = model.hidden_states(prep.input_ids, prep.position_ids,
                                                prep.attention_mask)
                last = hidden[:, m - 1::m].reshape(-1, hidden.shape[-1])
                weight, _ = model.output_projection()
                return liger(weight, last, targets)
            return liger_loss
        objective = _objective(_BASE[method], model, "naive" if variant == "cyb_naive" else "fused")
        chunks = _small_chunks() if variant == "cyb_fused_lowmem" else contextlib.nullcontext

        def cyb_loss():
            with chunks():
                out = objective.loss(model, prep)  # with metrics, as the trainer runs it
            return out.loss_sum / max(out.num_targets, 1)
        return cyb_loss

    def measure(self, variant: str, mode: str) -> dict:
        cfg, device = self.cfg, self.device
        self.restore()
        loss_fn = self.loss_fn(variant)
        kw = {"fused": True} if device.type == "cuda" else {}
        optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, **kw)
        losses = []

        def step():
            with _autocast(cfg.precision, device):
                loss = loss_fn()
                loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.detach())

        try:
            warmup = cfg.compile_warmup if mode == "compile" else cfg.warmup
            res = time_calls(step, device=device, warmup=warmup, repeats=cfg.repeats)
            res["first_loss"] = float(losses[0].float())
            res["loss"] = float(losses[-1].float())
            res["kernel_ms"] = kernel_ms(step, device=device)
            res["gpu_busy"] = res["kernel_ms"] / res["ms"] if res["kernel_ms"] else None
        finally:  # (the optimiser state goes with this frame)
            optimizer.zero_grad(set_to_none=True)
        return res | self._rates(variant, res["ms"])

    def _rates(self, variant: str, ms: float) -> dict:
        method = _METHOD[variant]
        prep, m = self.preps[method], self.models[method].num_steps
        positions = int(prep.input_ids.numel())
        seq = int(prep.input_ids.shape[1])
        real = self.batch * self.cfg.real_tokens
        shape = self.cfg.shape
        step_flops = flops_mod.train_step_flops(params=self.params_count,
                                                layers=shape.layers, hidden=shape.hidden,
                                                positions=positions, seq=seq)
        s = ms / 1e3
        peak = flops_mod.peak_tflops(device_name(self.device))
        return {"num_steps": m, "seq": seq, "positions_per_step": positions,
                "real_tokens_per_step": real, "real_tokens_per_s": real / s,
                "positions_per_s": positions / s, "tflop_per_step": step_flops / 1e12,
                "tflops": step_flops / s / 1e12, "mfu": flops_mod.mfu(step_flops, s, peak)}

    def close(self) -> None:
        self.models.clear()
        self.preps.clear()
        self.params.clear()
        self.initial.clear()
        del self.hf_model


def _small_chunks():
    """A context in which the fused loss uses chunks of at most LOWMEM_CHUNK_ELEMENTS logits."""
    from ..kernels import chunked

    names = ("TRITON_CHUNK_ELEMENTS", "TRITON_LOSS_MAX_CHUNK_ELEMENTS")

    @contextlib.contextmanager
    def ctx():
        saved = {n: getattr(chunked, n) for n in names}
        saved_torch = dict(chunked.TORCH_CHUNK_ELEMENTS)
        try:
            for n in names:
                setattr(chunked, n, min(saved[n], LOWMEM_CHUNK_ELEMENTS))
            for k, v in saved_torch.items():
                chunked.TORCH_CHUNK_ELEMENTS[k] = min(v, LOWMEM_CHUNK_ELEMENTS)
            yield
        finally:
            for n, v in saved.items():
                setattr(chunked, n, v)
            chunked.TORCH_CHUNK_ELEMENTS.update(saved_torch)
    return ctx


@contextlib.contextmanager
def _static_compile_settings():
    """Recompile per shape (no automatic dynamic shapes) and allow enough recompilations."""
    import torch._dynamo as dynamo

    cfg = dynamo.config
    saved = {}
    wanted = {"automatic_dynamic_shapes": False, "cache_size_limit": 64, "recompile_limit": 64,
              "accumulated_cache_size_limit": 512, "accumulated_recompile_limit": 512}
    for key, value in wanted.items():
        if hasattr(cfg, key):
            saved[key] = getattr(cfg, key)
            setattr(cfg, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(cfg, key, value)


#: Run order of the variants: the target rows first, the one that compiles another shape last.
PRIORITY = ("cyb_fused", "cyb_private", "cyb_gated", "tbys_liger", "tbys_private", "cyb_private_split",
            "cyb_gated_flex", "cyb_gated_split", "cyb_gated_dense", "cyb_fused_lowmem", "cyb_naive", "tbys_hf",
            "baseline_hf")


#: Compiled rows of the targets run for every case before the other compiled rows.
TARGET_VARIANTS = ("cyb_fused", "cyb_private", "cyb_gated", "tbys_liger", "tbys_private", "cyb_private_split",
                   "cyb_gated_flex", "cyb_gated_split", "cyb_gated_dense", "cyb_fused_lowmem")


def _order(cfg: TrainBenchConfig):
    """``(vocab, batch, mode, variant)`` in run order: every case eager; then every case
    compiled, the target variants first (so that a spent budget cuts the others).  Compiling
    changes a model's layers in place, so a case is rebuilt for its compiled rows."""
    variants = sorted(set(cfg.variants), key=PRIORITY.index)
    if "eager" in cfg.modes:
        for vocab, batch in cfg.cases:
            for variant in variants:
                yield vocab, batch, "eager", variant
    if "compile" in cfg.modes:
        groups = ([v for v in variants if v in TARGET_VARIANTS],
                  [v for v in variants if v not in TARGET_VARIANTS])
        for group in groups:
            for vocab, batch in cfg.cases:
                for variant in group:
                    yield vocab, batch, "compile", variant


class _CurrentCase:
    """The case being measured; replaced (and the old one freed) when the rows move on."""

    def __init__(self, cfg: TrainBenchConfig, device: torch.device):
        self.cfg, self.device, self.case = cfg, device, None

    def get(self, vocab: int, batch: int) -> tuple[_Case | None, dict]:
        """``(case, {})``, or ``(None, failed row fields)`` when it cannot be built."""
        if self.case is not None and (self.case.vocab, self.case.batch) == (vocab, batch):
            return self.case, {}
        self.close()
        made = guarded(lambda: {"case": _Case(self.cfg, vocab, batch, self.device)}, self.device)
        if made["status"] != "ok":
            return None, made
        self.case = made["case"]
        return self.case, {}

    def close(self) -> None:
        if self.case is not None:
            self.case.close()
            self.case = None
        free_memory(self.device)


def _measure_row(current: _CurrentCase, vocab: int, batch: int, mode: str, variant: str) -> dict:
    """The measured fields of one row (``status`` and the numbers, or why not)."""
    case, failed = current.get(vocab, batch)
    if case is None:
        return failed
    if mode == "eager" and case.compiled:
        return {"status": "skipped", "reason": "layers already compiled (eager rows run first)"}
    if mode == "compile":
        case.compile_layers()
    return guarded(lambda: case.measure(variant, mode), current.device)


def _model_info(case: _Case) -> dict:
    return {"parameters": case.params_count}


def run(cfg: TrainBenchConfig, *, out=None, log=print) -> dict:
    """Run the benchmark; returns (and writes to ``out`` after every row) the result dict.

    Result: ``{"kind": "train", "env", "config", "flop_formula", "models", "results": [row,
    ...]}``; a row has its case (``vocab``, ``batch``, ``mode``, ``variant``), ``status`` (ok /
    oom / error / skipped) and, when ok, ``ms`` (median step), ``peak_gib``,
    ``real_tokens_per_s``, ``positions_per_s``, ``mfu``, ``first_loss``, ``loss``...
    """
    from ..runtime import resolve_device

    cfg.validate()
    device = resolve_device(cfg.device, what="--device")
    budget = Budget(cfg.budget_s)
    result = {"kind": "train", "env": environment(device), "config": cfg.to_dict(),
              "flop_formula": flops_mod.FORMULA, "models": {}, "results": []}
    current = _CurrentCase(cfg, device)
    compiling = "compile" in cfg.modes  # (importing torch._dynamo also imports triton)
    with _static_compile_settings() if compiling else contextlib.nullcontext():
        for vocab, batch, mode, variant in _order(cfg):
            row = {"vocab": vocab, "batch": batch, "mode": mode, "variant": variant,
                   "real_tokens": cfg.real_tokens}
            why = unavailable(variant, device)
            need = COMPILE_RESERVE_S if mode == "compile" else EAGER_RESERVE_S
            if why is None and not budget.allows(need):
                why = f"time budget ({cfg.budget_s} s) spent"
            if why is not None:
                row.update(status="skipped", reason=why)
            else:
                row.update(_measure_row(current, vocab, batch, mode, variant))
                if current.case is not None:
                    result["models"][str(vocab)] = _model_info(current.case)
            result["results"].append(row)
            log(format_row(row))
            write_json(out, result)
    current.close()
    result["elapsed_s"] = budget.elapsed()
    write_json(out, result)
    return result


def format_row(row: dict) -> str:
    """One line per row for the log."""
    head = f"V={row['vocab']:>7} B={row['batch']:>2} {row['mode']:<8} {row['variant']:<12}"
    if row.get("status") != "ok":
        return f"{head} {row.get('status')} {row.get('reason', '')}".rstrip()
    mem = "" if row.get("peak_gib") is None else f" {row['peak_gib']:7.2f} GiB"
    mfu = "" if row.get("mfu") is None else f" MFU {row['mfu']:.3f}"
    kernels = "" if row.get("kernel_ms") is None else f" (kernels {row['kernel_ms']:.1f} ms)"
    return (f"{head} {row['ms']:9.1f} ms{kernels}  {row['real_tokens_per_s'] / 1e3:8.1f}k real tok/s  "
            f"{row['positions_per_s'] / 1e3:8.1f}k pos/s{mfu}{mem}  loss {row['loss']:.3f}")

"""Memory plan benchmark: peak GPU memory and real tokens/s of real-size fine-tuning.

For each model shape (:data:`SHAPES`: Gemma 1 2B, Gemma 3 4B text and a Llama 3 8B, random
weights built from their sizes) and each configuration (:data:`CONFIGS`: full fine-tuning or
LoRA, with or without gradient checkpointing), one fresh process builds the run exactly as
``cyb train`` does (:class:`cyb.train.Trainer` with configuration overrides: CYB, M = 4, rows of
2048 real tokens, micro-batch 1, bf16 parameters under bf16 autocast as ``configs/paper/``),
runs ``warmup`` optimiser steps, then ``steps`` timed ones, and reports
``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` over the timed steps, real tokens
per second, and the estimate of :mod:`cyb.memory_estimate` that ``cyb train`` checks. A configuration
that runs out of memory is recorded as ``oom`` (the process ends, so the next one starts
clean).

The data are random words of a word-level tokenizer as large as the model's vocabulary
(written to a temporary folder); the weights are built directly on the GPU (random weights:
only their size matters here).  LoRA configurations need the ``lora`` configuration section;
without it they are recorded as ``skipped``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

#: Model shapes (``model.*`` fields of a from-scratch run, plus the vocabulary with the pause
#: and dk rows).  Sizes of the released models' configurations.
SHAPES = {
    "gemma1-2b": dict(arch="gemma", hidden_size=2048, num_layers=18, num_heads=8, num_kv_heads=1,
                      head_dim=256, intermediate_size=16384, tie_embeddings=True, vocab=256000),
    "gemma3-4b": dict(arch="gemma3", hidden_size=2560, num_layers=34, num_heads=8, num_kv_heads=4,
                      head_dim=256, intermediate_size=10240, tie_embeddings=True, vocab=262208),
    "llama3-8b": dict(arch="llama", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                      intermediate_size=14336, tie_embeddings=False, vocab=128256),
    "tiny": dict(arch="llama", hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                 intermediate_size=64, tie_embeddings=True, vocab=300),
}
#: Configurations: ``--set`` overrides on top of the base run.
CONFIGS = {
    "full": [],
    "full-ckpt": ["model.gradient_checkpointing=true"],
    "lora": ["lora.rank=16"],
    "lora-ckpt": ["lora.rank=16", "model.gradient_checkpointing=true"],
}
GPU_SHAPES = ("gemma1-2b", "gemma3-4b", "llama3-8b")
ROW_PREFIX = "MEMORY-ROW "
GIB = float(2**30)


@dataclass
class MemoryBenchConfig:
    """What to measure: every (shape, configuration) pair, each in its own process."""

    shapes: tuple = GPU_SHAPES
    configs: tuple = tuple(CONFIGS)
    real_tokens: int = 2048
    num_steps: int = 4
    micro_batch: int = 1
    warmup: int = 3
    steps: int = 3
    device: str | None = None
    timeout_s: float = 300.0
    extra: tuple = ()
    seed: int = 0
    quick: bool = False

    @classmethod
    def quick_config(cls, **overrides) -> "MemoryBenchConfig":
        """The tiny shape on the CPU, one warm-up and one timed step (a smoke run)."""
        base = dict(shapes=("tiny",), configs=("full", "full-ckpt"), real_tokens=16, warmup=1,
                    steps=1, device="cpu", quick=True)
        base.update(overrides)
        return cls(**base)

    def validate(self) -> "MemoryBenchConfig":
        bad = [s for s in self.shapes if s not in SHAPES]
        if bad:
            raise ValueError(f"shapes: unknown {bad}; choose from {', '.join(SHAPES)}")
        bad = [c for c in self.configs if c not in CONFIGS]
        if bad:
            raise ValueError(f"configs: unknown {bad}; choose from {', '.join(CONFIGS)}")
        for name in ("real_tokens", "micro_batch", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_steps < 2:
            raise ValueError(f"num_steps (M) must be >= 2, got {self.num_steps}")
        return self

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(shapes=list(self.shapes), configs=list(self.configs), extra=list(self.extra))
        return d


def has_lora() -> bool:
    """Whether this version's run configuration has a ``lora`` section."""
    from ..config import SECTIONS

    return "lora" in SECTIONS


# ------------------------------------------------------------------------ one configuration


def _write_inputs(folder: Path, vocab_words: int, words: int, seed: int) -> None:
    """A word-level tokenizer of ``vocab_words`` words plus 4 specials, and training and
    held-out JSON lines of random words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(vocab_words)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(names)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                  eos_token="<eos>", unk_token="<unk>")
    tok.save_pretrained(folder / "tokenizer")
    rng = random.Random(seed)
    for name, n in (("train.jsonl", words), ("valid.jsonl", words // 4 + 64)):
        with open(folder / name, "w") as f:
            for _ in range(4):
                text = " ".join(f"w{rng.randrange(vocab_words)}" for _ in range(n // 4 + 1))
                f.write(json.dumps({"text": text}) + "\n")


def run_config(spec: dict, folder: Path):
    """The :class:`~cyb.config.RunConfig` of one benchmark row (``spec``: shape, config, ...)."""
    from ..config import RunConfig, apply_overrides

    shape = dict(SHAPES[spec["shape"]])
    shape.pop("vocab")
    data = {
        "model": {**shape, "max_position_embeddings": 8192, "dtype": "bfloat16"},
        "method": {"name": "cyb", "num_steps": spec["num_steps"]},
        "data": {"source": str(folder / "train.jsonl"), "valid_source": str(folder / "valid.jsonl"),
                 "tokenizer": str(folder / "tokenizer"), "block_len": spec["real_tokens"],
                 "shuffle": "none"},
        "optim": {"lr": 1e-5, "warmup_steps": 0},
        "train": {"out_dir": str(folder / "run"), "steps": 1000, "batch_size": spec["micro_batch"],
                  "micro_batch_size": spec["micro_batch"], "eval_every": 0, "eval_batches": 1,
                  "save_every": 0, "progress": False, "memory_check": False, "distributed": "none",
                  "device": spec["device"], "seed": spec["seed"]},
    }
    if spec.get("quick"):
        data["model"]["dtype"] = "auto"
    cfg = RunConfig.from_dict(data)
    apply_overrides(cfg, list(CONFIGS[spec["config"]]) + list(spec.get("extra", ())))
    with _random_base_allowed():
        return cfg.validate()


@contextlib.contextmanager
def _random_base_allowed():
    """LoRA on a randomly initialised base passes validation (users are refused one: its frozen
    weights would stay random; here only the sizes matter)."""
    from .. import config

    original = config._validate_lora
    config._validate_lora = lambda lo, m: original(
        lo, dataclasses.replace(m, name_or_path=m.name_or_path or "random base"))
    try:
        yield
    finally:
        config._validate_lora = original


@contextlib.contextmanager
def _build_on(device):
    """``cyb.train`` builds its model directly on ``device`` (random weights: initialising an
    8 B model on the host first would take minutes)."""
    import torch

    from .. import train as train_mod

    original = train_mod.build_model

    def build_here(cfg, tokenizer):
        try:
            with torch.device(device):
                return original(cfg, tokenizer)
        except Exception as err:  # noqa: BLE001
            from .timing import free_memory, is_oom

            if is_oom(err):
                raise
            free_memory(torch.device(device))
            print(f"note: building on {device} failed ({type(err).__name__}: {err}); building on the "
                  "host", file=sys.stderr, flush=True)
            return original(cfg, tokenizer)

    train_mod.build_model = build_here
    try:
        yield
    finally:
        train_mod.build_model = original


def measure(spec: dict) -> dict:
    """Build one configuration as ``cyb train`` would and measure it (run in a fresh process).

    Returns the row: ``status`` (ok / oom / error), the estimate (``estimate_gib`` and its
    ``estimate`` breakdown), and when ok ``peak_allocated_gib``, ``peak_reserved_gib``,
    ``real_tokens_per_s``, ``params``, ``trainable``, ``loss``.
    """
    import torch

    from .. import memory_estimate as memory
    from ..runtime import resolve_device
    from ..train import Trainer
    from .timing import environment, is_oom, peak_gib, reset_peak, sync

    device = resolve_device(spec["device"], what="--device")
    row = {k: spec[k] for k in ("shape", "config", "real_tokens", "num_steps", "micro_batch")}
    env = environment(device)
    row.update(device_name=env["device_name"], gpu_memory_gib=env.get("gpu_memory_gib"),
               torch=env["torch"], transformers=env["transformers"])
    vocab = SHAPES[spec["shape"]]["vocab"]
    m = spec["num_steps"]
    with tempfile.TemporaryDirectory(prefix="cyb-membench-") as tmp:
        folder = Path(tmp)
        words = (spec["warmup"] + spec["steps"] + 2) * spec["micro_batch"] * spec["real_tokens"] + 64
        _write_inputs(folder, vocab - m - 4, words, spec["seed"])
        cfg = run_config(spec, folder)
        shape = memory.run_shape(cfg, vocab - m)
        est = memory.estimate(cfg, shape, device_type=device.type)
        capacity = memory.device_capacity(device)
        row.update(estimate_gib=est.peak / GIB, estimate=est.to_dict(),
                   free_gib=None if capacity is None else capacity / GIB,
                   check_refuses=None if capacity is None else est.peak > capacity)
        trainer = None
        try:
            t0 = time.perf_counter()
            with _build_on(device), _random_base_allowed():
                trainer = Trainer(cfg)
            row["build_s"] = time.perf_counter() - t0
            row.update(params=trainer.model.num_parameters(),
                       trainable=trainer.model.num_parameters(only_trainable=True))
            exact = memory.estimate(cfg, shape, device_type=device.type, params=row["params"],
                                    trainable=row["trainable"])
            row["estimate_exact_counts_gib"] = exact.peak / GIB
            trainer.model.train()
            for _ in range(spec["warmup"]):
                trainer.train_step()
            sync(device)
            reset_peak(device)
            real, losses = 0, []
            t0 = time.perf_counter()
            for _ in range(spec["steps"]):
                sums, _ = trainer.train_step()
                real += int(sums["real"])
                losses.append(sums["objective"])
            sync(device)
            elapsed = time.perf_counter() - t0
            row.update(status="ok", steps=spec["steps"], step_s=elapsed / spec["steps"],
                       real_tokens_per_s=real / elapsed, loss=float(losses[-1]) / max(sums["targets"], 1),
                       peak_allocated_gib=peak_gib(device),
                       peak_reserved_gib=(torch.cuda.max_memory_reserved(device) / GIB
                                          if device.type == "cuda" else None))
        except Exception as err:  # noqa: BLE001 (the row records what happened)
            if is_oom(err):
                row.update(status="oom", reason=str(err).splitlines()[0][:300])
            else:
                row.update(status="error", reason=f"{type(err).__name__}: {err}"[:500])
            if device.type == "cuda":
                row["peak_allocated_gib"] = peak_gib(device)
        finally:
            del trainer
    return row


# ------------------------------------------------------------------------------ the grid


def _child_command(spec: dict) -> list[str]:
    return [sys.executable, "-m", "cyb.bench.memory", json.dumps(spec)]


def _run_child(spec: dict, timeout_s: float) -> dict:
    """One row in a fresh process; a crash or a timeout becomes an error row."""
    head = {k: spec[k] for k in ("shape", "config", "real_tokens", "num_steps", "micro_batch")}
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        done = subprocess.run(_child_command(spec), capture_output=True, text=True, timeout=timeout_s,
                              env=env)
    except subprocess.TimeoutExpired:
        return {**head, "status": "timeout", "reason": f"over {timeout_s:.0f} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(ROW_PREFIX):
            return json.loads(line[len(ROW_PREFIX):])
    tail = (done.stderr or done.stdout or "").strip().splitlines()[-5:]
    oom = any("out of memory" in t.lower() for t in tail)
    return {**head, "status": "oom" if oom else "error",
            "reason": f"exit {done.returncode}: " + " | ".join(tail)[-600:]}


def run(cfg: MemoryBenchConfig, *, out=None, markdown=None, log=print) -> dict:
    """Measure every (shape, configuration) of ``cfg``; returns ``{"kind": "memory", "env",
    "config", "results": [row, ...]}``.  ``out``: JSON lines, one row per configuration,
    appended as each finishes; ``markdown``: the table (:func:`memory_table`) at the end."""
    from ..runtime import resolve_device
    from .timing import environment

    cfg.validate()
    device = resolve_device(cfg.device if not cfg.quick else (cfg.device or "cpu"), what="--device")
    # (this process never touches the GPU: a CUDA context here would take memory from the rows)
    result = {"kind": "memory", "env": {**environment(resolve_device("cpu")), "device": str(device)},
              "config": cfg.to_dict(), "results": []}
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text("")
    start = time.monotonic()
    for shape in cfg.shapes:
        for config in cfg.configs:
            spec = {"shape": shape, "config": config, "real_tokens": cfg.real_tokens,
                    "num_steps": cfg.num_steps, "micro_batch": cfg.micro_batch, "warmup": cfg.warmup,
                    "steps": cfg.steps, "device": str(device), "seed": cfg.seed,
                    "extra": list(cfg.extra), "quick": cfg.quick}
            if config.startswith("lora") and not has_lora():
                row = {k: spec[k] for k in ("shape", "config", "real_tokens", "num_steps", "micro_batch")}
                row.update(status="skipped", reason="no lora section in this version's configuration")
            else:
                row = _run_child(spec, cfg.timeout_s)
            row["elapsed_s"] = round(time.monotonic() - start, 1)
            result["results"].append(row)
            log(format_row(row))
            if out is not None:
                with open(out, "a") as f:
                    f.write(json.dumps(row) + "\n")
    if markdown is not None:
        Path(markdown).write_text(memory_markdown(result["results"]) + "\n")
    return result


def format_row(row: dict) -> str:
    """One line per row for the log."""
    head = f"{row['shape']:<10} {row['config']:<10}"
    est = f"estimate {row['estimate_gib']:6.1f} GiB" if row.get("estimate_gib") is not None else ""
    if row.get("status") != "ok":
        return f"{head} {row.get('status')} {est} {row.get('reason', '')}".rstrip()
    peak = row.get("peak_allocated_gib")
    mem = "" if peak is None else f" peak {peak:6.1f} GiB (reserved {row['peak_reserved_gib']:.1f})"
    return f"{head} {est}{mem}  {row['real_tokens_per_s']:,.0f} real tok/s"


def _gib(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def memory_table(rows: list[dict]) -> str:
    """Markdown: one line per (shape, configuration) with the estimate, the measured peaks,
    real tokens/s and whether it ran on the GPU (``OOM``: out of memory)."""
    from .markdown import markdown_table

    order = {s: i for i, s in enumerate(SHAPES)}
    corder = {c: i for i, c in enumerate(CONFIGS)}
    out = []
    for r in sorted(rows, key=lambda r: (order.get(r["shape"], 99), corder.get(r["config"], 99))):
        est = r.get("estimate") or {}
        params = r.get("params") or est.get("params")
        trainable = r.get("trainable") or est.get("trainable")
        lora = r["config"].startswith("lora")
        ckpt = "on" if r["config"].endswith("ckpt") else "off"
        status = r.get("status")
        if status == "ok":
            peak, reserved = r.get("peak_allocated_gib"), r.get("peak_reserved_gib")
            cells = [_gib(peak), _gib(reserved), f"{r['real_tokens_per_s']:,.0f}", "yes"]
        else:
            word = {"oom": "OOM", "skipped": "not run", "timeout": "timeout"}.get(status, "error")
            cells = [word, word, "-", "no" if status == "oom" else "-"]
        out.append([r["shape"], "-" if params is None else f"{params / 1e9:.2f} B",
                    "LoRA r16" if lora else "full",
                    "-" if trainable is None else f"{trainable / 1e6:,.1f} M", ckpt,
                    _gib(r.get("estimate_gib"))] + cells)
    headers = ["model", "params", "fine-tuning", "trainable", "grad. ckpt", "estimate GiB",
               "peak allocated GiB", "peak reserved GiB", "real tok/s", "fits one GPU"]
    return markdown_table(headers, out)


def memory_markdown(rows: list[dict], command: str = "bash benchmarks/memory_plan.sh") -> str:
    """The table with a line saying where and how it was measured."""
    devices = sorted({f"{r['device_name']} ({r['gpu_memory_gib']} GiB)" for r in rows
                      if r.get("device_name") and r.get("gpu_memory_gib")})
    versions = sorted({f"torch {r['torch']}, transformers {r['transformers']}" for r in rows if r.get("torch")})
    where = ", ".join(devices) or "-"
    head = (f"Measured on {where}" + (f" with {'; '.join(versions)}" if versions else "") +
            f" by `{command}`: peak = `torch.cuda.max_memory_allocated` / `max_memory_reserved` over "
            "the timed steps, estimate = `cyb.memory_estimate` as `cyb train` checks it.")
    return head + "\n\n" + memory_table(rows)


def fill_doc(doc, text: str, key: str = "memory") -> None:
    """Put ``text`` between ``<!-- table:KEY -->`` and ``<!-- end table -->`` in ``doc``
    (ValueError when the markers are missing)."""
    import re

    path = Path(doc)
    old = path.read_text()
    pattern = rf"(<!-- table:{key} -->\n).*?(?=<!-- end table -->)"
    if not re.search(pattern, old, flags=re.S):
        raise ValueError(f"{path} has no <!-- table:{key} --> ... <!-- end table --> markers")
    path.write_text(re.sub(pattern, lambda m: m.group(1) + text.rstrip("\n") + "\n", old, flags=re.S))


def read_rows(path) -> list[dict]:
    """The rows of a JSON lines file written by :func:`run` (several files may be concatenated)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _child_main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    try:
        row = measure(spec)
    except Exception as err:  # noqa: BLE001 (set-up failed before measuring: say why)
        row = {k: spec.get(k) for k in ("shape", "config", "real_tokens", "num_steps", "micro_batch")}
        row.update(status="error", reason=f"{type(err).__name__}: {err}"[:500])
    print(ROW_PREFIX + json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1:]))

"""Typed, validated run configuration: YAML in, ``--set key=value`` overrides, JSON out.

A run is described by :class:`RunConfig` with five sections: ``model``, ``method``, ``data``,
``optim`` and ``train``.  Every field has a docstring (the attribute docstring below it) that
``cyb train --help-config`` prints.  Validation errors name the field and the allowed values.
"""

from __future__ import annotations

import ast
import dataclasses
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import yaml

METHODS = ("baseline", "baseline_nx", "tbys", "tbys_original", "cyb", "cyb_va", "cyb_dp")
PAUSE_METHODS = ("tbys", "tbys_original", "cyb", "cyb_va", "cyb_dp")
DK_METHODS = ("cyb", "cyb_va", "cyb_dp")
ARCHES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3")


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


@dataclass
class ModelConfig:
    name_or_path: str | None = None
    """Hugging Face hub name or local folder of a pretrained causal LM (or a saved cyb model).
    None: build a model from scratch with the fields below."""
    arch: str = "llama"
    """Family for from-scratch models: llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3."""
    hidden_size: int = 128
    """From scratch: width d_model."""
    num_layers: int = 4
    """From scratch: number of transformer blocks."""
    num_heads: int = 4
    """From scratch: attention heads."""
    num_kv_heads: int | None = None
    """From scratch: key/value heads (grouped-query attention); None = num_heads."""
    intermediate_size: int | None = None
    """From scratch: MLP width; None = 4 x hidden_size."""
    max_position_embeddings: int = 8192
    """From scratch: longest position the rotary embedding is set up for."""
    tie_embeddings: bool = True
    """From scratch: share the input embedding and the output projection."""
    dtype: str = "auto"
    """Parameter dtype: float32, bfloat16 or auto (float32; bf16 autocast on GPU)."""
    attn_implementation: str = "sdpa"
    """Attention kernel: sdpa or eager (flash attention cannot keep repeated pause positions)."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""


@dataclass
class MethodConfig:
    name: str = "cyb"
    """Training method: baseline (no pauses), baseline_nx (no pauses, seq_multiplier x longer
    context), tbys (Recipe 1 pauses, cross-entropy at the world's stop), tbys_original (random
    pauses, advancing positions, one shared pause id), cyb, cyb_va, cyb_dp."""
    num_steps: int = 4
    """M: steps per real token (the token and M-1 pauses). Baselines use 1."""
    position_scheme: str = "shared"
    """shared (a pause takes its real token's position; one id per pause index) or advance."""
    omega: list[float] | None = None
    """World stop distribution over steps 1..M (ratios); None = one-hot on M."""
    gamma: list[float] | None = None
    """Discount per step, each in [0, 1]; None = no discount (or gamma0 if set)."""
    gamma0: float | None = None
    """Exponential discount gamma_i = gamma0^(i-1), in [0, 1]; excludes gamma."""
    rho: list[float] | None = None
    """Desired stop distribution for cyb_va / cyb_dp (ratios over steps 1..M)."""
    alpha: float = 0.01
    """cyb_dp: weight of KL(rho || s)."""
    psi_dk: float | None = 0.9
    """Prior probability of <don't know> (paper appendix); None = no prior offset."""
    recipe: int = 1
    """1: M-1 pauses after every token. 2: W-1 pauses with W ~ omega, sampled per token."""
    seq_multiplier: int = 1
    """baseline_nx: real context is seq_multiplier x data.block_len (compute-matched baseline)."""
    random_pause_fraction: float = 0.1
    """tbys_original: pauses inserted per real token at random places (as a fraction of L)."""

    @property
    def uses_pauses(self) -> bool:
        return self.name in PAUSE_METHODS

    @property
    def uses_dk(self) -> bool:
        return self.name in DK_METHODS

    @property
    def steps(self) -> int:
        """Steps per real token in the Recipe 1 layout (1 for methods without it)."""
        return self.num_steps if self.name in ("tbys", "cyb", "cyb_va", "cyb_dp") else 1


@dataclass
class DataConfig:
    source: str = "../shared/data/techdocs/train.jsonl.gz"
    """Training text: JSON lines (.jsonl/.jsonl.gz), .txt, parquet, a datasets folder, a hub
    dataset name, a folder or a glob. Ignored when task is set."""
    valid_source: str | None = None
    """Held-out text; None = hold out valid_fraction of the training documents."""
    text_field: str = "text"
    """Field holding the text in JSON lines / parquet / datasets sources."""
    valid_fraction: float = 0.02
    """Fraction of documents held out when valid_source is None."""
    tokenizer: str | None = None
    """Hugging Face tokenizer name/folder. None: the pretrained model's, or a byte-level BPE
    trained on the corpus (saved with the run)."""
    bpe_vocab_size: int = 4096
    """Vocabulary of the BPE trained when no tokenizer is given."""
    bpe_train_docs: int = 2000
    """Documents used to train that BPE."""
    block_len: int = 256
    """L: real tokens per training sequence (pauses come on top)."""
    shuffle_buffer: int = 0
    """Blocks held in a seeded shuffle buffer (0 = corpus order)."""
    task: str | None = None
    """A synthetic task (addition, multiplication, three_sum, parity, variable_lookup ...)
    instead of text."""
    task_kwargs: dict = field(default_factory=dict)
    """Size parameters of the synthetic task (e.g. {digits: 4})."""
    num_train_examples: int = 20000
    """Synthetic task: training examples."""
    num_valid_examples: int = 500
    """Synthetic task: held-out examples."""


@dataclass
class OptimConfig:
    lr: float | None = None
    """Peak learning rate; None = lr_alpha / sqrt(d_model) as in the paper."""
    lr_alpha: float = 1e-4
    """alpha of the paper's peak LR alpha / sqrt(d_model) (1e-4 was best for fine-tuning)."""
    min_lr_ratio: float = 1e-2
    """Final LR of the cosine decay as a fraction of the peak."""
    warmup_steps: int = 100
    """Linear warmup steps."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay (not applied to norms and biases)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.95
    """AdamW beta2."""
    eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 = off)."""


@dataclass
class TrainConfig:
    out_dir: str = "runs/default"
    """Run folder: checkpoints, metrics.jsonl, run.json, tokenizer."""
    steps: int = 1000
    """Optimiser steps."""
    batch_size: int = 16
    """Sequences per optimiser step, over all micro-batches and processes."""
    micro_batch_size: int | None = None
    """Sequences per forward/backward per process; None = batch_size / world size."""
    seed: int = 0
    """Seed of model init, data order and pause sampling."""
    device: str = "auto"
    """auto, cpu, cuda or cuda:N."""
    precision: str = "auto"
    """auto (bf16 autocast on CUDA, float32 on CPU), bf16 or fp32."""
    loss_impl: str = "auto"
    """auto (fused on CUDA), fused (chunked readout, no full logits) or naive (full logits)."""
    compile: bool = False
    """torch.compile the model."""
    eval_every: int = 200
    """Evaluate on held-out data every this many steps (0 = only at the end)."""
    eval_batches: int = 20
    """Held-out batches per evaluation."""
    save_every: int = 200
    """Checkpoint every this many steps (0 = only at the end)."""
    keep_last: int = 2
    """Checkpoints kept (older ones are deleted)."""
    log_every: int = 10
    """Write a metrics line every this many steps."""
    resume: bool = True
    """Resume from the newest complete checkpoint in out_dir if there is one."""
    distributed: str = "auto"
    """auto (DDP when started by torchrun), ddp, fsdp or none."""
    tensorboard: bool = False
    """Also log to TensorBoard (needs the tensorboard package)."""
    progress: bool = True
    """Show a progress bar."""


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    # ------------------------------------------------------------------ validation
    def validate(self) -> "RunConfig":
        """Raise :class:`ConfigError` naming the first bad field; return self."""
        m, me, d, o, t = self.model, self.method, self.data, self.optim, self.train

        def need(cond: bool, name: str, msg: str) -> None:
            if not cond:
                raise ConfigError(f"{name}: {msg}")

        need(m.arch in ARCHES, "model.arch", f"must be one of {ARCHES}, got {m.arch!r}")
        for name in ("hidden_size", "num_layers", "num_heads", "max_position_embeddings"):
            need(getattr(m, name) >= 1, f"model.{name}", f"must be >= 1, got {getattr(m, name)}")
        need(m.hidden_size % m.num_heads == 0, "model.hidden_size",
             f"must be a multiple of model.num_heads ({m.num_heads}), got {m.hidden_size}")
        if m.num_kv_heads is not None:
            need(m.num_kv_heads >= 1 and m.num_heads % m.num_kv_heads == 0, "model.num_kv_heads",
                 f"must divide model.num_heads ({m.num_heads}), got {m.num_kv_heads}")
        need(m.dtype in ("auto", "float32", "bfloat16", "float16"), "model.dtype",
             f"must be auto, float32, bfloat16 or float16, got {m.dtype!r}")
        need(m.attn_implementation in ("sdpa", "eager"), "model.attn_implementation",
             f"must be sdpa or eager (flash attention derives documents from position ids and "
             f"breaks repeated pause positions), got {m.attn_implementation!r}")

        need(me.name in METHODS, "method.name", f"must be one of {METHODS}, got {me.name!r}")
        need(me.num_steps >= 1, "method.num_steps", f"M must be >= 1, got {me.num_steps}")
        if me.name in ("tbys", "cyb", "cyb_va", "cyb_dp", "tbys_original"):
            need(me.num_steps >= 2, "method.num_steps",
                 f"{me.name} needs M >= 2 (at least one pause), got {me.num_steps}")
        need(me.position_scheme in ("shared", "advance"), "method.position_scheme",
             f"must be shared or advance, got {me.position_scheme!r}")
        for name in ("omega", "rho", "gamma"):
            vec = getattr(me, name)
            if vec is None:
                continue
            need(len(vec) == me.num_steps, f"method.{name}",
                 f"must have M = {me.num_steps} entries, got {len(vec)}")
            need(all(math.isfinite(float(x)) and float(x) >= 0 for x in vec), f"method.{name}",
                 f"entries must be finite and >= 0, got {vec}")
            if name == "gamma":
                need(all(float(x) <= 1 for x in vec), "method.gamma", f"entries must lie in [0, 1], got {vec}")
            need(sum(float(x) for x in vec) > 0, f"method.{name}", f"must have a positive entry, got {vec}")
        if me.gamma0 is not None:
            need(0.0 <= me.gamma0 <= 1.0, "method.gamma0", f"must lie in [0, 1], got {me.gamma0}")
            need(me.gamma is None, "method.gamma0", "set either gamma or gamma0, not both")
        if me.name in ("cyb_va", "cyb_dp"):
            need(me.rho is not None, "method.rho", f"{me.name} needs rho (desired stop distribution)")
        if me.name == "cyb_va":
            need(all(float(x) > 0 for x in me.rho), "method.rho",
                 "cyb_va needs rho > 0 everywhere (KL(s||rho) is infinite at zeros)")
        need(me.alpha >= 0, "method.alpha", f"must be >= 0, got {me.alpha}")
        if me.psi_dk is not None:
            need(0.0 < me.psi_dk < 1.0, "method.psi_dk", f"must lie in (0, 1), got {me.psi_dk}")
        need(me.recipe in (1, 2), "method.recipe", f"must be 1 or 2, got {me.recipe}")
        if me.recipe == 2:
            need(me.name in ("tbys", "cyb"), "method.recipe",
                 f"Recipe 2 (variable pauses) applies to tbys and cyb, not {me.name}")
        need(me.seq_multiplier >= 1, "method.seq_multiplier", f"must be >= 1, got {me.seq_multiplier}")
        need(0.0 < me.random_pause_fraction <= 4.0, "method.random_pause_fraction",
             f"must lie in (0, 4], got {me.random_pause_fraction}")

        need(d.block_len >= 2, "data.block_len", f"must be >= 2, got {d.block_len}")
        need(0.0 <= d.valid_fraction < 1.0, "data.valid_fraction", f"must lie in [0, 1), got {d.valid_fraction}")
        need(d.bpe_vocab_size >= 64, "data.bpe_vocab_size", f"must be >= 64, got {d.bpe_vocab_size}")
        need(d.num_train_examples >= 1 and d.num_valid_examples >= 1, "data.num_train_examples",
             "synthetic example counts must be >= 1")

        if o.lr is not None:
            need(o.lr > 0, "optim.lr", f"must be > 0, got {o.lr}")
        need(o.lr_alpha > 0, "optim.lr_alpha", f"must be > 0, got {o.lr_alpha}")
        need(0.0 <= o.min_lr_ratio <= 1.0, "optim.min_lr_ratio", f"must lie in [0, 1], got {o.min_lr_ratio}")
        need(o.warmup_steps >= 0, "optim.warmup_steps", f"must be >= 0, got {o.warmup_steps}")
        need(0 <= o.beta1 < 1 and 0 <= o.beta2 < 1, "optim.beta1", "betas must lie in [0, 1)")
        need(o.weight_decay >= 0, "optim.weight_decay", f"must be >= 0, got {o.weight_decay}")
        need(o.grad_clip >= 0, "optim.grad_clip", f"must be >= 0, got {o.grad_clip}")

        need(t.steps >= 1, "train.steps", f"must be >= 1, got {t.steps}")
        need(t.batch_size >= 1, "train.batch_size", f"must be >= 1, got {t.batch_size}")
        if t.micro_batch_size is not None:
            need(1 <= t.micro_batch_size <= t.batch_size, "train.micro_batch_size",
                 f"must lie in [1, batch_size={t.batch_size}], got {t.micro_batch_size}")
        need(t.precision in ("auto", "bf16", "fp32"), "train.precision",
             f"must be auto, bf16 or fp32, got {t.precision!r}")
        need(t.loss_impl in ("auto", "fused", "naive"), "train.loss_impl",
             f"must be auto, fused or naive, got {t.loss_impl!r}")
        need(t.distributed in ("auto", "ddp", "fsdp", "none"), "train.distributed",
             f"must be auto, ddp, fsdp or none, got {t.distributed!r}")
        for name in ("eval_every", "save_every", "log_every", "eval_batches"):
            need(getattr(t, name) >= 0, f"train.{name}", f"must be >= 0, got {getattr(t, name)}")
        need(t.keep_last >= 1, "train.keep_last", f"must be >= 1, got {t.keep_last}")
        return self

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> "RunConfig":
        return _build(cls, data or {}, "")

    @classmethod
    def load(cls, path: str | Path, overrides: list[str] | None = None) -> "RunConfig":
        """Read a YAML file, apply ``key=value`` overrides, validate."""
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        with p.open() as f:
            data = yaml.safe_load(f) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections")
        cfg = cls.from_dict(data)
        apply_overrides(cfg, overrides or [])
        return cfg.validate()

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def _field_types(cls) -> dict[str, Any]:
    return get_type_hints(cls)


def _coerce(value: Any, typ: Any, name: str) -> Any:
    origin = get_origin(typ)
    args = get_args(typ)
    if origin is not None and type(None) in args:  # Optional[X]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], name)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ConfigError(f"{name}: expected true/false, got {value!r}")
    if typ is int:
        if isinstance(value, bool):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected an integer, got {value!r}") from None
        if not f.is_integer():
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        return int(f)
    if typ is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    if typ is str:
        if not isinstance(value, (str, int, float)):
            raise ConfigError(f"{name}: expected a string, got {value!r}")
        return str(value)
    if origin is list:
        if isinstance(value, str):
            value = _parse_literal(value, name)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        return [_coerce(v, args[0], f"{name}[{i}]") for i, v in enumerate(value)]
    if typ is dict or origin is dict:
        if isinstance(value, str):
            value = _parse_literal(value, name)
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a mapping, got {value!r}")
        return dict(value)
    return value


def _parse_literal(text: str, name: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise ConfigError(f"{name}: cannot parse {text!r}") from None


def _build(cls, data: dict, prefix: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    types = _field_types(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        where = prefix.rstrip(".") or "top level"
        raise ConfigError(f"unknown field(s) {unknown} in {where}; known: {sorted(known)}")
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        typ = types[f.name]
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(typ):
            kwargs[f.name] = _build(typ, data[f.name] or {}, name + ".")
        else:
            kwargs[f.name] = _coerce(data[f.name], typ, name)
    return cls(**kwargs)


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply ``section.field=value`` strings (values parsed as YAML) in place."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.field=value")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if len(parts) != 2:
            raise ConfigError(f"override key {key!r} must be section.field (e.g. train.steps)")
        section, name = parts
        if not hasattr(cfg, section) or not dataclasses.is_dataclass(getattr(cfg, section)):
            raise ConfigError(f"unknown section {section!r} in {key!r}; sections: model, method, data, optim, train")
        sec = getattr(cfg, section)
        types = _field_types(type(sec))
        if name not in types:
            raise ConfigError(f"unknown field {key!r}; {section} has {sorted(types)}")
        value = _parse_literal(raw, key) if raw.strip() != "" else ""
        setattr(sec, name, _coerce(value, types[name], key))
    return cfg


def field_docs() -> dict[str, str]:
    """``{"section.field": docstring}`` read from this module's source (for --help-config)."""
    import inspect

    docs: dict[str, str] = {}
    for section, cls in (("model", ModelConfig), ("method", MethodConfig), ("data", DataConfig),
                         ("optim", OptimConfig), ("train", TrainConfig)):
        src = inspect.getsource(cls)
        tree = ast.parse(src)
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:] + [None]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                doc = ""
                if isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant):
                    doc = " ".join(str(nxt.value.value).split())
                docs[f"{section}.{node.target.id}"] = doc
    return docs

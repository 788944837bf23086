"""Typed, validated run configuration: YAML in, ``--set key=value`` overrides, JSON out.

A run is described by :class:`RunConfig` with six sections: ``model``, ``method``, ``lora``,
``data``, ``optim`` and ``train``.  Every field has a docstring (the attribute docstring below it) that
``cyb train --help-config`` prints.  Validation errors name the field and the allowed values.
Turning YAML, ``--set`` strings and docstrings into these classes is :mod:`cyb.config_parsing`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import config_parsing, extras, families, methods, paths
from .config_data import DataConfig, validate_data
from .config_parsing import ConfigError, apply_overrides, need as _need, one_of as _one_of
from .vectors import step_vector_problem
from .config_method import MethodConfig
from .visibility import VISIBILITIES

METHODS = methods.NAMES


@dataclass
class ModelConfig:
    name_or_path: str | None = None
    """Hugging Face hub name or local folder of a pretrained causal LM (or a saved cyb model).
    None: build a model from scratch with the fields below."""
    arch: str = "llama"
    """Family for from-scratch models"""
    hidden_size: int = 128
    """From scratch: width d_model."""
    num_layers: int = 4
    """From scratch: number of transformer blocks."""
    num_heads: int = 4
    """From scratch: attention heads."""
    num_kv_heads: int | None = None
    """From scratch: key/value heads (grouped-query attention); None = num_heads."""
    head_dim: int | None = None
    """From scratch: width of each attention head; None = hidden_size / num_heads (Gemma 3
    4B, for one, has 8 heads of 256 at hidden size 2560)."""
    intermediate_size: int | None = None
    """From scratch: MLP width; None = 4 x hidden_size."""
    max_position_embeddings: int = 8192
    """From scratch: longest position the rotary embedding is set up for."""
    tie_embeddings: bool = True
    """From scratch: share the input embedding and the output projection."""
    pause_init: str = "mean"
    """From scratch: embedding rows of the pause and dk tokens: mean (the mean of the other
    rows, near zero; lower perplexity when pretraining on text) or random (drawn like every
    other row, so distinct pauses start distinct)."""
    dtype: str = "auto"
    """Parameter dtype: float32, bfloat16 or auto (float32; bf16 autocast on GPU)."""
    attn_implementation: str = "sdpa"
    """Attention kernel: sdpa or eager (flash attention cannot keep repeated pause positions)."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""


@dataclass
class LoraConfig:
    rank: int = 0
    """LoRA rank r: 0 = off (full fine-tuning); r > 0 freezes the pretrained weights of
    model.name_or_path and trains rank-r adapters on lora.target_modules plus the embedding
    rows of the pause and dk tokens (and their output rows when the model does not tie them);
    needs peft (the lora extra: .venv/bin/pip install -e '.[lora]' in the cyb clone)."""
    alpha: float = 16.0
    """LoRA scaling: an adapter adds (alpha / rank) B A x to a projection's output (> 0)."""
    dropout: float = 0.0
    """Dropout on the adapters' input, in [0, 1)."""
    target_modules: list[str] = field(default_factory=lambda: list(families.PROJECTIONS))
    """Modules that get adapters, by name (matched at the end of each module's path, as in
    peft): the attention and MLP projections of Llama, Mistral, Qwen and Gemma."""


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
    """Optimiser steps (unless train.epochs is set)."""
    epochs: float = 0.0
    """Passes over the training data instead of train.steps (> 0): the run takes epochs x rows
    per pass / batch_size optimiser steps (rounded down), so the LR schedule ends with the last pass. A
    pass is the training text (data.fraction of it) cut into rows of data.block_len real tokens
    (x method.seq_multiplier), or the data.num_train_examples rows of a task; counting it costs
    nothing with data.shuffle corpus, one more reading of the text otherwise. 0 = train.steps."""
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
    """Held-out batches of batch_size rows per evaluation (the same rows every time, whatever
    the number of processes); 0 = the whole held-out set."""
    save_every: int = 200
    """Checkpoint every this many steps (0 = only at the end)."""
    keep_last: int = 2
    """Checkpoints kept (older ones are deleted), >= 1."""
    checkpoint_format: str = "full"
    """full (rank 0 gathers the whole model and optimiser into one file) or sharded (every
    process writes its own shards with torch.distributed.checkpoint; for models too large to
    gather).  Either resumes at any world size; final/ is always a full Hugging Face folder."""
    log_every: int = 10
    """Write a metrics line (means over the steps since the last one) every this many steps."""
    resume: bool = True
    """Resume from the newest complete checkpoint in out_dir if there is one. false refuses to
    start in an out_dir that holds checkpoints (nothing written is overwritten)."""
    distributed: str = "auto"
    """auto (DDP when started by torchrun), ddp, fsdp (FSDP2: weights, gradients and AdamW state
    sharded over every process), hsdp (FSDP2 sharded within each node, one replica per node:
    all-gathers stay inside a node) or none."""
    tensorboard: bool = False
    """Also log to TensorBoard (needs the tensorboard package: the tensorboard extra)."""
    wandb: bool = False
    """Also log to Weights & Biases: every metric, the configuration and the final model card
    (needs the wandb package: the wandb extra). WANDB_MODE=offline keeps the run in
    out_dir/wandb (wandb sync uploads it later)."""
    wandb_project: str = "cyb"
    """train.wandb: the W&B project (WANDB_ENTITY picks the team)."""
    wandb_name: str | None = None
    """train.wandb: the W&B run's name; None = the name of train.out_dir."""
    progress: bool = True
    """Show progress: a bar on a terminal, else one line per log step; false hides both (the
    run's header, held-out results and notes are still printed)."""
    memory_check: bool = True
    """On a GPU, estimate the peak memory per process before building the model (cyb.memory_estimate:
    weights, gradients, AdamW state, activations, readout, FSDP sharding) and refuse to start
    when it exceeds the GPU's free memory, printing the breakdown and ways to fit; false starts
    anyway (the estimate may be off). `cyb train CONFIG --estimate-memory` prints it."""


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    # ------------------------------------------------------------------ validation
    def validate(self) -> "RunConfig":
        """Raise :class:`ConfigError` naming the first bad field; return self.

        Checking a configuration that has not changed since it last passed is free, so
        :meth:`load` and the trainer can both call it.
        """
        state = repr(self.to_dict())
        if getattr(self, "_valid_state", None) == state:
            return self
        _validate_model(self.model)
        _validate_method(self.method, self.data)
        _validate_lora(self.lora, self.model)
        _need(not (self.lora.rank and self.method.pause_visibility == "gated"), "method.pause_visibility",
              "gated pauses train their gates with the whole model: set lora.rank = 0, or use shared or private")
        _need(self.model.attn_implementation != "eager" or self.method.pause_visibility != "gated",
              "method.pause_visibility", "gated pauses need model.attn_implementation sdpa")
        _validate_pause_adapters(self)
        validate_data(self.data)
        _validate_optim(self.optim)
        _validate_train(self.train)
        self._valid_state = state
        return self

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict:
        """Plain nested dict (YAML/JSON-ready)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> "RunConfig":
        """Build from a nested dict (unvalidated); unknown fields and wrong types raise."""
        return config_parsing.build(cls, data or {})

    @classmethod
    def load(cls, path: str | Path, overrides: list[str] | None = None) -> "RunConfig":
        """Read a YAML file, apply ``key=value`` overrides, validate.

        Errors are :class:`ConfigError` prefixed with the file name.
        """
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"{p} is a folder; give a YAML file (see configs/)")
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        data = config_parsing.read_yaml(p)
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: the top level must be a mapping of sections "
                              f"(model, method, lora, data, optim, train)")
        try:
            cfg = cls.from_dict(data)
        except ConfigError as e:
            raise ConfigError(f"{p}: {e}") from None
        apply_overrides(cfg, overrides or [])
        return cfg.validate()

    def dump(self, path: str | Path) -> None:
        """Write as YAML (loads back with :meth:`load`)."""
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    # ------------------------------------------------------------------ paths
    def with_local_paths(self, base: str | Path | None = None) -> "RunConfig":
        """A copy fit to be written into a run folder: every field of :data:`PATH_FIELDS` that
        names something local (relative to ``base``, default the working folder) made absolute,
        and ``train.out_dir`` absolute; hub ids and ``hf:``/``builtin:`` sources unchanged."""
        return type(self).from_dict(local_paths(self.to_dict(), base)).validate()

    @classmethod
    def load_run(cls, folder: str | Path) -> "RunConfig":
        """The ``config.yaml`` of a run folder, its relative paths taken relative to the folder
        where they exist there (:func:`cyb.paths.in_folder`)."""
        cfg = cls.load(Path(folder) / "config.yaml")
        for section, name in PATH_FIELDS:
            part = getattr(cfg, section)
            setattr(part, name, paths.in_folder(getattr(part, name), folder))
        return cfg.validate()


#: The fields that name local files or folders (or, where they are not local, hub ids and data
#: set specs): made absolute in what a run folder writes down.
PATH_FIELDS = (("model", "name_or_path"), ("data", "source"), ("data", "valid_source"), ("data", "tokenizer"))


def local_paths(config: dict, base: str | Path | None = None) -> dict:
    """A configuration dict (:meth:`RunConfig.to_dict`) with :data:`PATH_FIELDS` made absolute
    where they name something local (:func:`cyb.paths.local`) and ``train.out_dir`` absolute."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}
    for section, name in PATH_FIELDS:
        if isinstance(out.get(section), dict) and out[section].get(name) is not None:
            out[section][name] = paths.local(out[section][name], base)
    train = out.get("train")
    if isinstance(train, dict) and train.get("out_dir"):
        where = train["out_dir"] if base is None else Path(base) / train["out_dir"]
        train["out_dir"] = paths.absolute(where)
    return out


def _validate_model(m: ModelConfig) -> None:
    _one_of(m.arch, families.NAMES, "model.arch")
    for name in ("hidden_size", "num_layers", "num_heads", "max_position_embeddings"):
        _need(getattr(m, name) >= 1, f"model.{name}", f"must be >= 1, got {getattr(m, name)}")
    if m.head_dim is None:
        _need(m.hidden_size % m.num_heads == 0, "model.hidden_size",
              f"must be a multiple of model.num_heads ({m.num_heads}) unless model.head_dim is set, "
              f"got {m.hidden_size}")
    else:
        _need(m.head_dim >= 2 and m.head_dim % 2 == 0, "model.head_dim",
              f"must be an even number >= 2 (rotary halves) or null, got {m.head_dim}")
    if m.num_kv_heads is not None:
        _need(m.num_kv_heads >= 1 and m.num_heads % m.num_kv_heads == 0, "model.num_kv_heads",
              f"must divide model.num_heads ({m.num_heads}), got {m.num_kv_heads}")
    if m.intermediate_size is not None:
        _need(m.intermediate_size >= 1, "model.intermediate_size",
              f"must be >= 1 or null, got {m.intermediate_size}")
    _one_of(m.dtype, ("auto", "float32", "bfloat16", "float16"), "model.dtype")
    _one_of(m.pause_init, ("mean", "random"), "model.pause_init")
    _need(m.attn_implementation in ("sdpa", "eager"), "model.attn_implementation",
          f"must be sdpa or eager (flash attention derives documents from position ids and "
          f"breaks repeated pause positions), got {m.attn_implementation!r}")


def _validate_method(me: MethodConfig, d: DataConfig) -> None:
    _one_of(me.name, METHODS, "method.name")
    spec = me.spec
    _need(me.num_steps >= 1, "method.num_steps", f"M must be >= 1, got {me.num_steps}")
    if spec.uses_pauses:
        _need(me.num_steps >= 2, "method.num_steps",
              f"{me.name} needs M >= 2 (at least one pause), got {me.num_steps}")
    _one_of(me.position_scheme, ("shared", "advance"), "method.position_scheme")
    _one_of(me.pause_visibility, VISIBILITIES, "method.pause_visibility")
    _need(math.isfinite(me.pause_gate_lr) and me.pause_gate_lr >= 0, "method.pause_gate_lr",
          f"must be finite and >= 0, got {me.pause_gate_lr}")
    _need(math.isfinite(me.pause_gate_init), "method.pause_gate_init", f"must be finite, got {me.pause_gate_init}")
    _need(me.pause_gate_anneal_steps >= 0, "method.pause_gate_anneal_steps",
          f"must be >= 0, got {me.pause_gate_anneal_steps}")
    for name in ("omega", "rho", "gamma"):
        vec = getattr(me, name)
        if vec is not None:
            problem = step_vector_problem(vec, me.num_steps, discount=name == "gamma")
            _need(problem is None, f"method.{name}", f"{problem} (M = method.num_steps)")
    if me.gamma0 is not None:
        _need(0.0 <= me.gamma0 <= 1.0, "method.gamma0", f"must lie in [0, 1], got {me.gamma0}")
        _need(me.gamma is None, "method.gamma0", "set either method.gamma or method.gamma0, not both")
    _need(me.gamma0_anneal_steps >= 0, "method.gamma0_anneal_steps", f"must be >= 0, got {me.gamma0_anneal_steps}")
    if me.gamma0_anneal_steps > 0:
        _need(me.gamma0 is not None, "method.gamma0_anneal_steps",
              "anneals towards method.gamma0: set method.gamma0 (e.g. 0.9) too")
    if spec.needs_rho:
        _need(me.rho is not None, "method.rho",
              f"{me.name} needs rho, the desired stop distribution over the M steps (e.g. [1, 1, 1, 1])")
    if spec.rho_positive:
        _need(all(x > 0 for x in me.rho), "method.rho",
              f"{me.name} needs rho > 0 everywhere (KL(s || rho) is infinite at zeros; cyb_dp allows them)")
    _need(math.isfinite(me.alpha) and me.alpha >= 0, "method.alpha", f"must be finite and >= 0, got {me.alpha}")
    _need(math.isfinite(me.aux_weight) and me.aux_weight >= 0, "method.aux_weight",
          f"must be finite and >= 0, got {me.aux_weight}")
    _need(math.isfinite(me.ponder_cost), "method.ponder_cost", f"must be finite, got {me.ponder_cost}")
    if me.psi_dk is not None:
        _need(0.0 < me.psi_dk < 1.0, "method.psi_dk", f"must lie in (0, 1) or be null, got {me.psi_dk}")
    _need(me.recipe in (1, 2), "method.recipe", f"must be 1 or 2, got {me.recipe}")
    if me.recipe == 2:
        allowed = [n for n in METHODS if methods.spec(n).recipe2]
        _need(spec.recipe2, "method.recipe",
              f"Recipe 2 (variable pauses) applies to {', '.join(allowed)}, not {me.name}")
    _need(me.seq_multiplier >= 1, "method.seq_multiplier", f"must be >= 1, got {me.seq_multiplier}")
    if spec.lengthens_context:
        _need(d.task is None, "method.name",
              f"{me.name} lengthens packed text blocks (data.block_len x method.seq_multiplier); "
              "synthetic tasks have fixed rows: use baseline")
    _need(0.0 < me.random_pause_fraction <= 4.0, "method.random_pause_fraction",
          f"must lie in (0, 4], got {me.random_pause_fraction}")
    _one_of(me.tbys_scheme, ("random", "append"), "method.tbys_scheme")
    if spec.layout == "inserted" and me.tbys_scheme == "append":
        _need(d.task is not None, "method.tbys_scheme",
              "append puts the pauses after a prompt; it needs a synthetic task (data.task), "
              "text has no prompt: use random")


def _validate_pause_adapters(cfg: "RunConfig") -> None:
    from .model import pause_adapters, pause_rows  # the fields' rules live with what they set up

    try:
        pause_adapters.check_settings(cfg.method, cfg.model, cfg.lora, cfg.train)
        pause_rows.check_settings(cfg.method, cfg.lora, cfg.train)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _validate_lora(lo: LoraConfig, m: ModelConfig) -> None:
    _need(lo.rank >= 0, "lora.rank", f"must be >= 0 (0 = full fine-tuning), got {lo.rank}")
    _need(math.isfinite(lo.alpha) and lo.alpha > 0, "lora.alpha", f"must be finite and > 0, got {lo.alpha}")
    _need(0.0 <= lo.dropout < 1.0, "lora.dropout", f"must lie in [0, 1), got {lo.dropout}")
    _need(bool(lo.target_modules) and all(isinstance(t, str) and t.strip() for t in lo.target_modules),
          "lora.target_modules", f"must list module names (e.g. {', '.join(families.PROJECTIONS[:2])}), "
          f"got {lo.target_modules!r}")
    if lo.rank == 0:
        return
    _need(m.name_or_path is not None, "lora.rank",
          "LoRA adapts a pretrained model: set model.name_or_path (a randomly initialised model "
          "would keep its random weights frozen), or set lora.rank = 0")
    _need(extras.available("peft"), "lora.rank",
          f"LoRA needs the peft package, which is not installed: {extras.install_hint('peft')}")


def _validate_optim(o: OptimConfig) -> None:
    if o.lr is not None:
        _need(math.isfinite(o.lr) and o.lr > 0, "optim.lr", f"must be > 0 (or null for lr_alpha/sqrt(d_model)), got {o.lr}")
    _need(math.isfinite(o.lr_alpha) and o.lr_alpha > 0, "optim.lr_alpha", f"must be > 0, got {o.lr_alpha}")
    _need(0.0 <= o.min_lr_ratio <= 1.0, "optim.min_lr_ratio", f"must lie in [0, 1], got {o.min_lr_ratio}")
    _need(o.warmup_steps >= 0, "optim.warmup_steps", f"must be >= 0, got {o.warmup_steps}")
    _need(0.0 <= o.beta1 < 1.0, "optim.beta1", f"must lie in [0, 1), got {o.beta1}")
    _need(0.0 <= o.beta2 < 1.0, "optim.beta2", f"must lie in [0, 1), got {o.beta2}")
    _need(math.isfinite(o.eps) and o.eps > 0, "optim.eps", f"must be > 0, got {o.eps}")
    _need(math.isfinite(o.weight_decay) and o.weight_decay >= 0, "optim.weight_decay",
          f"must be >= 0, got {o.weight_decay}")
    _need(math.isfinite(o.grad_clip) and o.grad_clip >= 0, "optim.grad_clip",
          f"must be >= 0 (0 = no clipping), got {o.grad_clip}")


def _validate_train(t: TrainConfig) -> None:
    _need(bool(str(t.out_dir).strip()), "train.out_dir", "must name a folder")
    _need(t.steps >= 1, "train.steps", f"must be >= 1, got {t.steps}")
    _need(math.isfinite(t.epochs) and t.epochs >= 0, "train.epochs",
          f"must be >= 0 (passes over the training data; 0 = train.steps decides), got {t.epochs}")
    _need(t.batch_size >= 1, "train.batch_size", f"must be >= 1, got {t.batch_size}")
    if t.micro_batch_size is not None:
        _need(1 <= t.micro_batch_size <= t.batch_size, "train.micro_batch_size",
              f"must lie in [1, train.batch_size = {t.batch_size}], got {t.micro_batch_size}")
        _need(t.batch_size % t.micro_batch_size == 0, "train.micro_batch_size",
              f"must divide train.batch_size = {t.batch_size}, got {t.micro_batch_size}")
    _need(re.fullmatch(r"auto|cpu|cuda(:\d+)?", t.device) is not None, "train.device",
          f"must be auto, cpu, cuda or cuda:N, got {t.device!r}")
    _one_of(t.precision, ("auto", "bf16", "fp32"), "train.precision")
    _one_of(t.loss_impl, ("auto", "fused", "naive"), "train.loss_impl")
    _one_of(t.distributed, ("auto", "ddp", "fsdp", "hsdp", "none"), "train.distributed")
    for name in ("eval_every", "save_every", "log_every", "eval_batches"):
        _need(getattr(t, name) >= 0, f"train.{name}", f"must be >= 0, got {getattr(t, name)}")
    _need(t.keep_last >= 1, "train.keep_last", f"must be >= 1, got {t.keep_last}")
    _one_of(t.checkpoint_format, ("full", "sharded"), "train.checkpoint_format")
    if t.tensorboard:
        _need(extras.available("tensorboard"), "train.tensorboard",
              f"true needs the tensorboard package, which is not installed: {extras.install_hint('tensorboard')}")
    if t.wandb:
        _need(extras.available("wandb"), "train.wandb",
              f"true needs the wandb package, which is not installed: {extras.install_hint('wandb')}")
        _need(bool(t.wandb_project.strip()), "train.wandb_project", "must name a project")


# ---------------------------------------------------------------------- sections and their docs

SECTIONS = {"model": ModelConfig, "method": MethodConfig, "lora": LoraConfig, "data": DataConfig,
            "optim": OptimConfig, "train": TrainConfig}


def field_docs() -> dict[str, str]:
    """``{"section.field": docstring}`` of every field (for --help-config); the text of
    ``model.arch`` ends with the family names of :mod:`cyb.families`."""
    docs = config_parsing.field_docs(SECTIONS)
    docs["model.arch"] += f": {', '.join(families.NAMES)}."
    return docs

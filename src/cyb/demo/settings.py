"""What a demo run is: its settings (:class:`DemoSettings`), the task presets and ``--quick``,
and the run configuration that trains each method (:func:`run_config`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from .. import methods

DEMO_METHODS = ("baseline", "tbys", "cyb")
#: The default demo's methods: the paper's three and the recipe that paid most in the search
#: of docs/record/demo.md.
DEFAULT_METHODS = (*DEMO_METHODS, "cyb_decoupled")

#: Method fields a demo may set per method (``DemoSettings.method_options``); the rest of a run's
#: method section follows from the demo settings.
METHOD_OPTIONS = ("omega", "gamma", "gamma0", "gamma0_anneal_steps", "psi_dk", "recipe", "aux_weight", "ponder_cost",
                  "rho", "alpha", "pause_visibility", "pause_gate_init", "pause_gate_lr",
                  "pause_gate_anneal_steps")


def demo_method(name: str) -> bool:
    """Whether the demo can train and score ``name``: a registered method that reads out blocks
    of steps (or none) over the task's own rows (not the original TBYS's inserted pauses nor a
    lengthened context)."""
    s = methods.REGISTRY.get(name)
    return s is not None and s.layout in ("none", "blocks") and not s.lengthens_context


#: Task sizes per task name.  The default, 3-digit addition written most-significant digit
#: first, is where pauses helped on average over seeds at this scale (docs/record/demo.md): TBYS and CYB
#: learned the carries in about 4 and 3 of 10 seeds, the no-pause baseline in about 2.
TASK_PRESETS: dict[str, dict] = {
    "addition": {"digits": 3},
    "multiplication": {"digits": 3, "digits_b": 1},
    "3sum": {"n": 6, "d": 2},
    "parity": {"length": 8},
    "lookup": {"hops": 2, "distractor_chains": 2},
}
DEFAULT_TASK = "addition"

#: What ``--quick`` changes: a run of seconds that exercises every piece (not a result).
QUICK = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "train_steps": 30, "batch_size": 16,
         "warmup_steps": 5, "num_train_examples": 512, "num_test_examples": 64, "num_examples_shown": 8}


@dataclass
class DemoSettings:
    """Everything a demo run depends on (saved as ``settings.json``)."""

    task: str = DEFAULT_TASK
    """Synthetic task name (see ``cyb.data.synthetic.TASKS``)."""
    task_kwargs: dict = field(default_factory=lambda: dict(TASK_PRESETS[DEFAULT_TASK]))
    """Task size parameters, e.g. {digits: 3}."""
    methods: list = field(default_factory=lambda: list(DEFAULT_METHODS))
    """Methods to train and compare: baseline, tbys, cyb, or another method of the registry with
    blocks of steps (cyb_ponder, cyb_anytime, cyb_decoupled, cyb_va, cyb_dp)."""
    method_options: dict = field(default_factory=dict)
    """Per method, method fields beyond the shared settings, e.g. {cyb_ponder: {ponder_cost:
    -0.05}} or {cyb: {recipe: 2, omega: [1, 1, 1, 1]}}; psi_dk and gamma0 here override the
    shared ones for that method."""
    num_steps: int = 4
    """M: steps per real token for TBYS and CYB (the baseline uses 1)."""
    hidden_size: int = 32
    """Model width (a from-scratch Llama)."""
    num_layers: int = 2
    """Transformer blocks."""
    num_heads: int = 2
    """Attention heads."""
    arch: str = "llama"
    """Model family of the from-scratch model."""
    train_steps: int = 3000
    """Optimiser steps, the same for every method."""
    batch_size: int = 32
    """Examples per optimiser step."""
    lr: float = 3e-3
    """Peak learning rate (linear warmup, cosine decay)."""
    warmup_steps: int = 50
    """Linear warmup steps."""
    psi_dk: float = 0.5
    """The dk prior probability psi'_dk of every method with dk (the library's default is 0.9;
    0.5 let cyb_decoupled learn in the demo's search)."""
    gamma0: float | None = None
    """CYB's discount gamma_i = gamma0^(i-1) (None: no discount)."""
    pause_visibility: str = "shared"
    """What later tokens see of a token's pauses, for every method with pauses: shared (the
    paper's layout) or private (cyb.visibility); method_options may set it per method."""
    num_train_examples: int = 20000
    """Training examples drawn (disjoint from the test prompts)."""
    num_test_examples: int = 1000
    """Held-out examples scored."""
    seed: int = 0
    """Seed of model init, data draw and order."""
    device: str = "auto"
    """auto (GPU if present), cpu or cuda."""
    precision: str = "auto"
    """auto (bf16 autocast on CUDA, float32 on CPU), bf16 or fp32."""
    out_dir: str = "runs/demo"
    """Report folder; the training runs go to out_dir/runs/<method> (a run that finished is
    reused, one that was interrupted resumes from its last checkpoint; --fresh starts afresh)."""
    num_examples_shown: int = 24
    """Test examples shaded in examples.html."""
    progress: bool = True
    """Progress bars while training."""

    def validate(self) -> "DemoSettings":
        from ..data.synthetic import make_task

        make_task(self.task, **self.task_kwargs)  # raises on an unknown task or a bad size
        if not self.methods:
            raise ValueError("methods: give at least one of " + ", ".join(DEMO_METHODS))
        bad = [m for m in self.methods if not demo_method(m)]
        if bad or len(set(self.methods)) != len(self.methods):
            known = [n for n in methods.NAMES if demo_method(n)]
            raise ValueError(f"methods must be distinct names from {known}, got {self.methods}")
        if not isinstance(self.method_options, dict):
            raise ValueError(f"method_options must map method names to fields, got {self.method_options!r}")
        for name, options in self.method_options.items():
            if name not in self.methods:
                raise ValueError(f"method_options names {name!r}, which is not in methods {self.methods}")
            allowed = [f for f in METHOD_OPTIONS if f in methods.spec(name).fields]
            unknown = sorted(set(options or {}) - set(allowed))
            if unknown:
                raise ValueError(f"method_options.{name}: {unknown} not settable for {name}; "
                                 f"allowed: {allowed}")
        for name in ("num_steps", "hidden_size", "num_layers", "num_heads", "train_steps",
                     "batch_size", "num_train_examples", "num_test_examples"):
            if getattr(self, name) < (2 if name == "num_steps" else 1):
                label = {"num_steps": "num_steps (M, --M)", "train_steps": "train_steps (--steps)"}.get(name, name)
                raise ValueError(f"{label} must be >= {2 if name == 'num_steps' else 1}, "
                                 f"got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0.0 < self.psi_dk < 1.0:
            raise ValueError(f"psi_dk must lie in (0, 1), got {self.psi_dk}")
        if self.gamma0 is not None and not 0.0 < self.gamma0 <= 1.0:
            raise ValueError(f"gamma0 must lie in (0, 1] or be None, got {self.gamma0}")
        for method in self.methods:  # the run configuration checks the method fields
            run_config(self, method)
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DemoSettings":
        """The settings ``data`` names; an unknown name or a value of the wrong type raises a
        ValueError naming the setting."""
        from typing import get_type_hints

        from ..config_parsing import coerce

        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown demo setting(s) {unknown}; known: {sorted(known)}")
        types = get_type_hints(cls)
        return cls(**{name: coerce(value, types[name], name) for name, value in data.items()})


def demo_settings(task: str | None = None, *, quick: bool = False, config: str | Path | None = None,
                  **overrides) -> DemoSettings:
    """The demo's settings: defaults, then a YAML ``config``, the ``task`` preset, ``--quick``,
    then explicit ``overrides`` (fields of :class:`DemoSettings`; None values are ignored)."""
    data: dict = {}
    if config is not None:
        from ..config_parsing import read_yaml

        path = Path(config)
        if not path.is_file():
            raise FileNotFoundError(f"demo config not found: {path}")
        data = read_yaml(path)
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of demo settings")
    if task is not None:
        from ..data.synthetic import TASKS

        if task not in TASKS:
            raise ValueError(f"--task must be one of {sorted(TASKS)}, got {task!r}")
        data["task"] = task
        data["task_kwargs"] = dict(TASK_PRESETS.get(task, {}))
    if quick:
        data.update(QUICK)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return DemoSettings.from_dict(data).validate()


def run_config(s: DemoSettings, method: str):
    """The :class:`~cyb.config.RunConfig` that trains ``method`` for the demo.

    The model fields describe the from-scratch architecture; :func:`~cyb.demo.run.run_demo`
    points ``model.name_or_path`` at the shared initial weights
    (:func:`~cyb.demo.run.write_initial_models`).
    """
    from ..config import RunConfig

    run_dir = Path(s.out_dir) / "runs" / method
    me = {"name": method, "num_steps": s.num_steps, "psi_dk": s.psi_dk,
          "pause_visibility": s.pause_visibility}
    if methods.spec(method).has_dk and s.gamma0 is not None:
        me["gamma0"] = s.gamma0
    me.update(s.method_options.get(method) or {})
    return RunConfig.from_dict({
        "model": {"arch": s.arch, "hidden_size": s.hidden_size, "num_layers": s.num_layers,
                  "num_heads": s.num_heads, "max_position_embeddings": 1024},
        "method": me,
        "data": {"task": s.task, "task_kwargs": dict(s.task_kwargs),
                 "num_train_examples": s.num_train_examples,
                 "num_valid_examples": s.num_test_examples},
        "optim": {"lr": s.lr, "warmup_steps": min(s.warmup_steps, s.train_steps - 1)},
        "train": {"out_dir": str(run_dir), "steps": s.train_steps, "batch_size": s.batch_size,
                  # the held-out evaluation at the end covers the whole test set, as the demo's
                  # scoring does, so final_metrics.json (cyb report) and the table agree
                  "seed": s.seed, "device": s.device, "precision": s.precision, "eval_every": 0, "eval_batches": 0,
                  "save_every": max(1, s.train_steps // 10), "keep_last": 1,
                  "log_every": max(1, s.train_steps // 50), "resume": True, "progress": s.progress},
    }).validate()

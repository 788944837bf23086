"""The embedded demo: no-pause baseline, TBYS, CYB and CYB-decoupled trained alike on a synthetic task.

:func:`run_demo` trains each method with :func:`cyb.train.train` on the same data, the same
number of optimiser steps and the same ``M``, scores greedy answers on held-out test examples
(:func:`score_model`), prints a comparison table and writes a report folder::

    out_dir/
      metrics.json     per method: accuracy, perplexity, steps per answer token, timings
      settings.json    the demo settings and the exact RunConfig of every run
      table.md         the comparison table (Markdown)
      latency.png      mean E[S] per answer position: CYB against TBYS's fixed M and baseline
      examples.html    test answers shaded by CYB's expected pauses (white 0 .. dark blue M-1)
      runs/<method>/   each training run (metrics.jsonl, config.yaml, final/ PauseModel, ...)

Accuracy is measured under teacher forcing with the greedy sequential readout of each answer
token's block of ``M`` steps (:func:`cyb.decision.greedy_decision`: dk included for CYB, step
``M`` for TBYS, ``M = 1`` for the baseline).  While the prefix is correct this is exactly what
greedy generation emits, so an answer is exact under teacher forcing if and only if free greedy
decoding produces it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from . import methods
from .files import write_json_atomic, write_text_atomic

DEMO_METHODS = ("baseline", "tbys", "cyb")
#: The default demo's methods: the paper's three and the recipe that paid most in the search
#: of docs/demo.md.
DEFAULT_METHODS = (*DEMO_METHODS, "cyb_decoupled")

#: Method fields a demo may set per method (``DemoSettings.method_options``); the rest of a run's
#: method section follows from the demo settings.
METHOD_OPTIONS = ("omega", "gamma", "gamma0", "gamma0_anneal_steps", "psi_dk", "recipe", "aux_weight", "ponder_cost",
                  "rho", "alpha", "pause_visibility")


def demo_method(name: str) -> bool:
    """Whether the demo can train and score ``name``: a registered method that reads out blocks
    of steps (or none) over the task's own rows (not the original TBYS's inserted pauses nor a
    lengthened context)."""
    s = methods.REGISTRY.get(name)
    return s is not None and s.layout in ("none", "blocks") and not s.lengthens_context


#: Task sizes per task name.  The default, 3-digit addition written most-significant digit
#: first, is where pauses helped on average over seeds at this scale (docs/demo.md): TBYS and CYB
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
    paper's layout), private or last (cyb.visibility); method_options may set it per method."""
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
    """Report folder; the training runs go to out_dir/runs/<method>."""
    num_examples_shown: int = 24
    """Test examples shaded in examples.html."""
    progress: bool = True
    """Progress bars while training."""

    def validate(self) -> "DemoSettings":
        from .data.synthetic import make_task

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
                label = "num_steps (M, --M)" if name == "num_steps" else name
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
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown demo setting(s) {unknown}; known: {sorted(known)}")
        return cls(**data)


def demo_settings(task: str | None = None, *, quick: bool = False, config: str | Path | None = None,
                  **overrides) -> DemoSettings:
    """The demo's settings: defaults, then a YAML ``config``, the ``task`` preset, ``--quick``,
    then explicit ``overrides`` (fields of :class:`DemoSettings`; None values are ignored)."""
    data: dict = {}
    if config is not None:
        import yaml

        path = Path(config)
        if not path.is_file():
            raise FileNotFoundError(f"demo config not found: {path}")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of demo settings")
    if task is not None:
        from .data.synthetic import TASKS

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

    The model fields describe the from-scratch architecture; :func:`run_demo` points
    ``model.name_or_path`` at the shared initial weights (:func:`write_initial_models`).
    """
    from .config import RunConfig

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
                  "seed": s.seed, "device": s.device, "precision": s.precision, "eval_every": 0, "eval_batches": 2,
                  "save_every": 0, "keep_last": 1, "log_every": max(1, s.train_steps // 50),
                  "resume": False, "progress": s.progress},
    }).validate()


def write_initial_models(s: DemoSettings, directory: Path) -> dict[str, Path]:
    """Save one randomly initialised model per method, all with the same weights.

    One from-scratch Hugging Face model is drawn (seeded by ``s.seed``) with rows for the
    characters, the ``M-1`` pauses and ``<don't know>``, every row drawn by the model's own
    initialiser (so the pauses start as distinct random vectors).  Each method wraps it with
    its own pause settings (the baseline and TBYS simply never use the rows they do not need)
    and saves it under ``directory/<method>``, so the runs differ only in the method, not in
    their starting point.
    """
    from transformers import AutoModelForCausalLM

    from .build import hf_config_for
    from .data.synthetic import CharTokenizer
    from .model import PauseModel, PauseSettings

    tokenizer = CharTokenizer().to_hf()
    first = len(tokenizer)
    m = s.num_steps
    pause_ids = tuple(range(first, first + m - 1))
    dk_id = first + m - 1
    rows = first + m
    hf_config = hf_config_for(run_config(s, "cyb"), rows, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(s.seed)
        hf_model = AutoModelForCausalLM.from_config(hf_config, attn_implementation="sdpa")
    paths = {}
    for method in s.methods:
        spec = methods.spec(method)
        psi_dk = (s.method_options.get(method) or {}).get("psi_dk", s.psi_dk)
        settings = PauseSettings(
            num_steps=spec.model_steps(m), pause_ids=pause_ids if spec.uses_pauses else (), vocab_size=rows,
            dk_id=dk_id if spec.has_dk else None,
            psi_dk=psi_dk if spec.has_dk else None, position_scheme="shared", method=method)
        paths[method] = PauseModel(hf_model, settings).save_pretrained(directory / method)
    return paths


# ------------------------------------------------------------------------------- scoring


def _answer_aligned(x: torch.Tensor, fill) -> torch.Tensor:
    """``[N, L]`` per-block values moved to the column of the token each block predicts."""
    out = torch.full_like(x, fill)
    out[:, 1:] = x[:, :-1]
    return out


@torch.no_grad()
def score_model(model, dataset, *, batch_size: int = 256) -> dict:
    """Greedy answers of ``model`` (a :class:`~cyb.model.PauseModel`) on ``dataset``.

    ``dataset`` is a :class:`~cyb.data.synthetic.SyntheticDataset`; its scored tokens are the
    answer characters and ``<eos>`` (``loss_mask``).  Returns a dict of Python numbers/lists:

    * ``exact_match``: fraction of examples whose whole answer (and ``<eos>``) is right.
    * ``token_accuracy``: fraction of answer tokens right.
    * ``ppl``: exp of the mean per-answer-token loss (CYB with gamma=1 and its own stopping,
      TBYS cross-entropy at step M, baseline plain cross-entropy).
    * ``mean_steps``: mean ``E[S]`` per answer token (1..M; M for TBYS, 1 for the baseline).
    * ``greedy_steps``: mean steps the greedy decision used per answer token.
    * ``per_position_accuracy``, ``per_position_steps``: by answer position (``<eos>`` last).
    * ``expected_steps``: ``[N, L]`` float tensor of ``E[S]`` aligned with ``dataset.ids``
      (0 where nothing is scored), and ``predictions``: ``[N, L]`` long greedy ids, aligned.
    """
    from .decision import greedy_decision
    from .losses import cross_entropy_loss, cyb_loss, expected_stop_step

    was_training = model.training
    model.eval()
    device = model.device
    dk_id = model.settings.dk_id
    preds, greedy, expected, nll = [], [], [], []
    for batch in dataset.batches(batch_size, device=device):
        out = model(batch["ids"], batch["attention_mask"], batch["loss_mask"], return_logits=True)
        token, steps = greedy_decision(out.logits, dk_id=dk_id, dk_bias=model.dk_bias)
        if dk_id is not None:
            e_s = expected_stop_step(out.log_d, out.log_not_d)
            loss = cyb_loss(out.log_t, out.log_d, out.log_not_d)
        else:
            e_s = torch.full(token.shape, float(model.num_steps), device=device)
            loss = cross_entropy_loss(out.log_t[..., -1])
        preds.append(_answer_aligned(token, -1).cpu())
        greedy.append(_answer_aligned(steps.float(), 0.0).cpu())
        expected.append(_answer_aligned(e_s.float(), 0.0).cpu())
        nll.append(_answer_aligned(loss.float(), 0.0).cpu())
    model.train(was_training)

    pred = torch.cat(preds)
    mask = dataset.loss_mask.bool()
    hit = (pred == dataset.ids) & mask
    position = mask.long().cumsum(1) - 1  # k-th scored token of its row
    width = int(position[mask].max()) + 1
    count = torch.bincount(position[mask], minlength=width).clamp(min=1).double()

    def by_position(values: torch.Tensor) -> list:
        sums = torch.zeros(width, dtype=torch.float64).index_add_(0, position[mask], values[mask].double())
        return (sums / count).tolist()

    e_s = torch.cat(expected)
    return {
        "exact_match": float((hit.sum(1) == mask.sum(1)).double().mean()),
        "token_accuracy": float(hit.sum()) / float(mask.sum()),
        "ppl": math.exp(min(float(torch.cat(nll)[mask].double().mean()), 50.0)),
        "mean_steps": float(e_s[mask].double().mean()),
        "greedy_steps": float(torch.cat(greedy)[mask].double().mean()),
        "per_position_accuracy": by_position(hit.double()),
        "per_position_steps": by_position(e_s),
        "expected_steps": e_s.masked_fill(~mask, 0.0),
        "predictions": pred,
    }


def decoding_cost(model, dataset, *, limit: int = 512, batch_size: int = 128) -> dict:
    """Free-running greedy answers to the first ``limit`` prompts of ``dataset``, in fixed and
    in adaptive mode (:mod:`cyb.generation`).

    Returns ``{mode: {"exact_match", "positions_per_token", "seconds"}}``, where positions per
    token counts the positions of the generated tokens that went through the network: ``M`` in
    fixed mode, the steps actually taken in adaptive mode (``<eos>`` included, the prompt not).
    """
    from .generation import generate

    prompts = dataset.prompts[:limit]
    answers = dataset.answers[:limit]
    longest = max(len(a) for a in answers) + 1
    out = {}
    for mode in ("fixed", "adaptive"):
        t0 = time.perf_counter()
        results = []
        for s in range(0, len(prompts), batch_size):
            results += generate(model, prompts[s:s + batch_size], mode=mode, max_new_tokens=longest)
        seconds = time.perf_counter() - t0
        tokens = sum(len(r.steps) for r in results)
        used = sum(len(r.steps) * model.num_steps if mode == "fixed" else sum(r.steps) for r in results)
        right = sum(r.text.strip() == a for r, a in zip(results, answers))
        out[mode] = {"exact_match": right / max(len(results), 1), "positions_per_token": used / max(tokens, 1),
                     "seconds": seconds}
    return out


# ------------------------------------------------------------------------------ pipeline


def _quiet_transformers() -> None:
    """No weight-loading/saving bars from transformers inside the demo's own bars."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - very old transformers
        pass


def run_demo(s: DemoSettings, *, echo: Callable[[str], None] = print) -> dict:
    """Train, score and report every method of ``s``; returns the metrics written to
    ``metrics.json`` (``{"methods": {name: {...}}, "total_seconds": ..., ...}``)."""
    from .data.streams import synthetic_sets
    from .model import PauseModel
    from .train import train

    s.validate()
    _quiet_transformers()
    out = Path(s.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from .data.synthetic import make_task

    task = make_task(s.task, **s.task_kwargs)
    echo(f"cyb demo: {task.describe()}")
    echo(f"model: {s.arch}, hidden {s.hidden_size}, {s.num_layers} layer(s), {s.num_heads} head(s); "
         f"M = {s.num_steps}; {s.train_steps} steps of {s.batch_size} examples per method")
    start = time.perf_counter()
    initial = write_initial_models(s, out / "init")
    results: dict = {}
    details: dict = {}
    configs = {}
    test = None
    for i, method in enumerate(s.methods, 1):
        cfg = run_config(s, method)
        cfg.model.name_or_path = str(initial[method])
        configs[method] = cfg.to_dict()
        echo(f"[{i}/{len(s.methods)}] training {method}")
        t0 = time.perf_counter()
        train(cfg)
        train_s = time.perf_counter() - t0
        model = PauseModel.from_pretrained(Path(cfg.train.out_dir) / "final")
        if s.device != "cpu" and torch.cuda.is_available():
            model = model.to("cuda")
        if test is None:
            _, test = synthetic_sets(cfg)
        score = score_model(model, test)
        details[method] = {k: score.pop(k) for k in ("expected_steps", "predictions")}
        results[method] = {**score, "train_seconds": train_s,
                           "num_parameters": model.num_parameters(),
                           "num_steps": model.num_steps, "recipe": cfg.method.recipe,
                           "pause_visibility": model.pause_visibility, "run_dir": cfg.train.out_dir}
        echo(f"    {method}: exact match {score['exact_match']:.1%}, token accuracy "
             f"{score['token_accuracy']:.1%}, steps/token {score['mean_steps']:.2f} "
             f"({train_s:.0f} s)")
        if methods.spec(method).has_dk and model.pause_visibility != "last":  # (no decoder for last)
            results[method]["decoding"] = decoding_cost(model, test)
    metrics = {"task": s.task, "task_kwargs": s.task_kwargs, "task_description": task.describe(),
               "num_test_examples": len(test), "methods": results,
               "total_seconds": time.perf_counter() - start}
    write_report(out, s, metrics, configs, test, details)
    echo("")
    echo(format_table(metrics))
    for name, r in results.items():
        if "decoding" in r:
            echo("\n" + format_decoding(name, r["decoding"], r["num_steps"], recipe=r["recipe"],
                                         visibility=r.get("pause_visibility", "shared")))
    echo("\n" + format_reading(metrics))
    echo(f"\nreport: {out}/ (metrics.json, settings.json, table.md, latency.png, examples.html); "
         f"total {metrics['total_seconds']:.0f} s")
    return metrics


# ------------------------------------------------------------------------------- output


def format_table(metrics: dict) -> str:
    """The comparison table (Markdown) of a :func:`run_demo` result."""
    rows = ["| method | M | exact match | token accuracy | answer ppl | mean steps/token E[S] "
            "| greedy steps/token | train s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in metrics["methods"].items():
        rows.append(f"| {name} | {r['num_steps']} | {r['exact_match']:.1%} | {r['token_accuracy']:.1%} "
                    f"| {r['ppl']:.3f} | {r['mean_steps']:.2f} | {r['greedy_steps']:.2f} "
                    f"| {r['train_seconds']:.0f} |")
    return "\n".join(rows)


def hard_easy_steps(results: dict, method: str) -> tuple[float, float] | None:
    """``method``'s mean E[S] over the hard and over the easy answer positions of one run.

    ``results`` maps method names to their :func:`score_model` results (``metrics["methods"]``).
    Difficulty is the per-position token accuracy averaged over every method of the run: hard
    positions are below the mean of those accuracies, easy ones at or above it.  ``<eos>`` (the
    last position) counts only when the answer is a single character.  None when the positions
    do not differ in accuracy by at least 2 points (no hard position)."""
    acc = [r["per_position_accuracy"] for r in results.values()]
    n = len(acc[0])
    positions = list(range(n - 1)) if n > 2 else list(range(n))
    mean_acc = {k: sum(a[k] for a in acc) / len(acc) for k in positions}
    if max(mean_acc.values()) - min(mean_acc.values()) < 0.02:
        return None
    level = sum(mean_acc.values()) / len(mean_acc)
    steps = results[method]["per_position_steps"]
    hard = [steps[k] for k in positions if mean_acc[k] < level]
    easy = [steps[k] for k in positions if mean_acc[k] >= level]
    return sum(hard) / len(hard), sum(easy) / len(easy)


def meets_criterion(results: dict, method: str) -> bool:
    """The demo criterion at one seed for a method with dk: exact match above the baseline's and
    at least TBYS's (both to within half a point), and more steps on the hard answer positions
    than on the easy ones (:func:`hard_easy_steps`, by at least 0.1)."""
    if not {"baseline", "tbys", method} <= set(results):
        return False
    exact = {m: results[m]["exact_match"] for m in ("baseline", "tbys", method)}
    he = hard_easy_steps(results, method)
    return (exact[method] > exact["baseline"] + 0.005 and exact[method] >= exact["tbys"] - 0.005
            and he is not None and he[0] - he[1] >= 0.1)


def format_reading(metrics: dict) -> str:
    """What a :func:`run_demo` result shows, in plain words, computed from its numbers: whether
    pauses beat the no-pause baseline, and for each method with dk its exact match against the
    baseline and TBYS, its steps on the hard and easy answer positions and its adaptive decoding."""
    r = metrics["methods"]
    lines = ["What this run shows (one seed; docs/demo.md gives the spread over seeds):"]
    paused = {m: v["exact_match"] for m, v in r.items() if methods.spec(m).uses_pauses}
    if "baseline" in r and paused:
        base, best = r["baseline"]["exact_match"], max(paused, key=paused.get)
        if paused[best] > base + 0.005:
            lines.append(f"- pauses pay: {best} answers {paused[best]:.1%} exactly, the no-pause baseline "
                         f"{base:.1%}, with the same data, steps and initial weights")
        else:
            lines.append(f"- pauses do not pay in this run: the best method with pauses, {best}, answers "
                         f"{paused[best]:.1%} exactly against the no-pause baseline's {base:.1%}")
    for m, v in r.items():
        if not methods.spec(m).has_dk:
            continue
        against = [f"{o} {r[o]['exact_match']:.1%}" for o in ("baseline", "tbys") if o in r]
        text = f"- {m}: {v['exact_match']:.1%} exact" + (f" ({', '.join(against)})" if against else "")
        he = hard_easy_steps(r, m) if len(r) > 1 else None
        if he is not None:
            text += f"; E[S] {he[0]:.2f} on the hard answer positions, {he[1]:.2f} on the easy ones"
        else:
            text += f"; E[S] {v['mean_steps']:.2f}"
        dec = v.get("decoding")
        if dec:
            f, a = dec["fixed"], dec["adaptive"]
            text += (f"; generating adaptively it answers {a['exact_match']:.1%} exactly at "
                     f"{a['positions_per_token']:.2f} positions per token, against {f['exact_match']:.1%} at "
                     f"{f['positions_per_token']:.2f} in fixed mode")
        if {"baseline", "tbys"} <= set(r):
            text += "; it meets the demo's criterion" if meets_criterion(r, m) else "; it does not meet the demo's criterion"
        lines.append(text)
    return "\n".join(lines)


def format_decoding(method: str, decoding: dict, num_steps: int, *, recipe: int = 1,
                    visibility: str = "shared") -> str:
    """One line per mode: free-running exact match and network positions per generated token,
    then what adaptive mode changes for a model trained with ``recipe`` (docs/recipes.md) and
    pauses of ``visibility``."""
    lines = [f"{method} generating its answers token by token (greedy; M = {num_steps}):"]
    for mode, d in decoding.items():
        lines.append(f"  {mode:8s} mode: exact match {d['exact_match']:.1%}, {d['positions_per_token']:.2f} "
                     f"positions per token, {d['seconds']:.1f} s")
    fixed, adaptive = decoding.get("fixed"), decoding.get("adaptive")
    if visibility == "private":
        lines.append("  (private pauses: no token reads another token's pauses, so adaptive mode makes fixed "
                     "mode's decisions and runs a pause only where the model asks for one)")
    elif fixed and adaptive and fixed["exact_match"] >= 0.1 and adaptive["exact_match"] >= fixed["exact_match"] - 0.02:
        saved = fixed["positions_per_token"] / max(adaptive["positions_per_token"], 1e-9)
        lines.append(f"  (adaptive mode feeds a pause only after <don't know>: here it keeps the exact match "
                     f"with {saved:.1f}x fewer positions per token)")
    elif recipe == 2:
        lines.append("  (adaptive mode feeds a pause only after <don't know>; in Recipe 2 training the pauses "
                     "came at random, and later tokens read them, so an earlier token answered at once leaves "
                     "its successors fewer positions than in training)")
    else:
        lines.append("  (adaptive mode feeds a pause only after <don't know>; a model trained with a pause after "
                     "every token, Recipe 1, then reads contexts it never saw in training)")
    return "\n".join(lines)


def write_report(out: Path, s: DemoSettings, metrics: dict, configs: dict, test, details: dict) -> None:
    """Write metrics.json, settings.json, table.md, latency.png and examples.html into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "metrics.json", metrics, indent=2)
    write_json_atomic(out / "settings.json", {"demo": s.to_dict(), "runs": configs}, indent=2)
    (out / "table.md").write_text(format_table(metrics) + "\n")
    from .report import html, plots

    plots.steps_per_position_figure(metrics, out / "latency.png")
    shaded = next((m for m in details if methods.spec(m).has_dk), next(iter(details)))
    write_text_atomic(out / "examples.html", html.task_examples_page(
        test, details[shaded]["expected_steps"], details[shaded]["predictions"],
        num_steps=metrics["methods"][shaded]["num_steps"], method=shaded,
        limit=s.num_examples_shown, title=f"{s.task} {s.task_kwargs}"))

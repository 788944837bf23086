"""Evaluate a trained pause model the way the paper does (``cyb eval``).

:func:`evaluate` loads a run folder (its ``final/`` model and ``config.yaml``) or a saved model
folder, runs it over held-out data batch by batch (:mod:`cyb.eval.collect`) and computes:

* perplexity (the paper's evaluation loss of each method, the loss under the run's training
  ``omega``/``gamma``, per-step readouts) and the relative improvement over a reference
  (appendix F);
* for models with ``<don't know>``: latency (Fig. 6), calibration (appendix E), pause
  statistics per token string (Table 2) and shaded text (Fig. 1b);
* for gated pauses: the gates' biases and how much attention they let through to other
  tokens' pauses, per layer (:class:`cyb.model.gates.ForeignAttention`).

Results go to ``metrics.json`` in the output folder (default ``RUN/eval``), with PNG figures,
``shaded.html``, ``pause_stats.md`` and ``summary.txt``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import methods
from ..analysis import (calibration, latency_summary, method_label, pause_statistics,
                       perplexity_summary, relative_improvement)
from ..analysis.latency import expected_pauses
from ..analysis.records import TokenRecords
from ..config import MethodConfig, RunConfig
from ..files import write_json_atomic, write_text_atomic
from ..model import gates
from ..model.settings import SETTINGS_FILE, TRAINING_STATE_FILE
from .collect import collect_records
from .data import EvalData, resolve_data

DEFAULT_TOKENS = 100_000
#: ``max_tokens`` default: a run's own held-out rows (the rows of its evaluations in training)
#: when the data is the run's; else :data:`DEFAULT_TOKENS`.
RUN_ROWS = "run"
DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ------------------------------------------------------------------------------ target


@dataclass
class EvalTarget:
    """What is evaluated: a saved model folder, and the run folder it came from (if any)."""

    path: Path
    model_dir: Path
    run_dir: Path | None = None
    config: RunConfig | None = None
    #: the step of a training checkpoint evaluated (its model), None for a saved model
    checkpoint_step: int | None = None

    @property
    def name(self) -> str:
        if self.config is not None:
            label = method_label(self.config.method)
            return label if self.checkpoint_step is None else f"{label} (checkpoint step {self.checkpoint_step})"
        from ..model.settings import PauseSettings

        if not (self.model_dir / SETTINGS_FILE).is_file():  # a plain model: a no-pause baseline
            return method_label(MethodConfig(name="baseline", num_steps=1))
        s = PauseSettings.load(self.model_dir)
        return method_label(_method_from_settings(s))


def _is_run(path: Path) -> bool:
    return (path / "config.yaml").is_file() and ((path / "run.json").is_file() or (path / "final").is_dir())


def resolve_target(path: str | os.PathLike) -> EvalTarget:
    """A run folder (``config.yaml`` + ``final/``), a run's ``final/`` folder, or a saved model
    folder (``cyb_pause.json``); also a plain model folder, a ``.gguf`` file or a known model's
    name (``smollm2-135m``), evaluated as a no-pause baseline.  Raises FileNotFoundError /
    ValueError naming the path."""
    from ..model.sources import plain_model_kwargs, resolve_model_source
    from ..model.run_folders import checkpoint_step, is_checkpoint, is_run_folder, run_final
    from ..run_models import checkpoint_model

    p = Path(str(path)).expanduser()
    if is_checkpoint(p):  # the model it holds, with its run's configuration (held-out data, method)
        run = p.parent
        cfg = RunConfig.load_run(run) if (run / "config.yaml").is_file() else None
        return EvalTarget(p, checkpoint_model(p), run, cfg, checkpoint_step=checkpoint_step(p))
    if not is_run_folder(p):
        p = Path(resolve_model_source(str(path))).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist (give a run folder or a saved cyb model folder)")
    if not p.is_dir():
        raise ValueError(f"{p} is a file; give a run folder (config.yaml + final/) or a saved cyb model folder")
    if _is_run(p):
        return EvalTarget(p, run_final(p), p, RunConfig.load_run(p))  # an unfinished run: which checkpoint to give
    if (p / SETTINGS_FILE).is_file():
        parent = p.parent
        if p.name == "final" and _is_run(parent):
            return EvalTarget(p, p, parent, RunConfig.load_run(parent))
        return EvalTarget(p, p)
    if plain_model_kwargs(p):
        from ..model.cache import say
        from ..model.sources import plain_model_note

        say(plain_model_note(path, "is evaluated"))
        return EvalTarget(p, p)
    raise ValueError(f"{p} is neither a run folder (config.yaml and final/ written by cyb train) nor a saved "
                     f"cyb model ({SETTINGS_FILE})")


def default_out_dir(target: EvalTarget) -> Path:
    """``PATH/eval``; for a checkpoint ``RUN/eval-ckpt-<step>`` (a checkpoint folder is only read)."""
    if target.checkpoint_step is not None:
        return target.path.parent / f"eval-{target.path.name}"
    return target.path / "eval"


def training_state(model_dir: Path) -> dict:
    """``{"step", "epochs", ...}`` of a model saved by ``cyb train`` (its
    ``training_state.json``), or ``{}`` for other models."""
    f = Path(model_dir) / TRAINING_STATE_FILE
    try:
        d = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {k: d[k] for k in ("step", "epochs", "real_tokens_seen") if k in d}


def _method_from_settings(settings) -> MethodConfig:
    return MethodConfig(name=methods.of_model(settings).name, num_steps=max(settings.num_steps, 1),
                        position_scheme=settings.position_scheme)


def load_model(target: EvalTarget, *, device: str = "auto", dtype: str | None = None):
    """The target's :class:`~cyb.model.PauseModel`, on ``device`` and in eval mode.

    ``dtype``: ``"auto"``/None (the run's ``model.dtype``, else the checkpoint's default),
    ``"float32"``, ``"bfloat16"`` or ``"float16"``.
    """
    from ..runtime import resolve_device
    from ..model import PauseModel

    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
    cfg = target.config
    if dtype in (None, "auto") and cfg is not None:
        dtype = cfg.model.dtype
    attn = cfg.model.attn_implementation if cfg is not None else None
    dev = resolve_device(device, what="--device")
    from ..model.sources import plain_model_kwargs

    model = PauseModel.from_pretrained(target.model_dir, torch_dtype=DTYPES.get(dtype or "auto"),
                                       attn_implementation=attn, **plain_model_kwargs(target.model_dir))
    return model.to(dev).eval()


def method_of(target: EvalTarget, model) -> MethodConfig:
    """The method to evaluate with: the run's, checked against the model, or the model's own."""
    if target.config is None:
        return _method_from_settings(model.settings)
    me = target.config.method
    if me.spec.model_steps(me.num_steps) != model.num_steps:
        raise ValueError(f"{target.run_dir}/config.yaml has M = {me.spec.model_steps(me.num_steps)} steps for {me.name}, but its "
                         f"final model has M = {model.num_steps}: the folder mixes two runs")
    if me.uses_dk != model.settings.use_dk:
        raise ValueError(f"{target.run_dir}/config.yaml says method {me.name} but its final model "
                         f"{'has' if model.settings.use_dk else 'lacks'} a <don't know> output")
    return me


def training_omega_gamma(method: MethodConfig):
    """``(omega, gamma)`` the run was trained with (None where it used the default)."""
    return method.omega, methods.discount_vector(method)


# ------------------------------------------------------------------------------ analyses


def token_strings(tokenizer, ids) -> list[str]:
    """The string of each token id (decoded one by one, special tokens kept)."""
    ids = [int(i) for i in ids]
    cache: dict[int, str] = {}
    for i in set(ids):
        if tokenizer is None:
            cache[i] = f"<{i}>"
            continue
        try:
            cache[i] = tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        except TypeError:
            cache[i] = tokenizer.decode([i])
    return [cache[i] for i in ids]


def analyse(records: TokenRecords, method: MethodConfig, *, has_dk: bool, tokenizer=None, min_count: int = 5,
            top_k: int = 15, attribution: str = "input", calibration_bins: int = 40) -> dict:
    """All analyses of collected records as a JSON-ready dict (no files).

    Keys: ``perplexity``; with dk also ``latency``, ``calibration``, ``pause_stats``.
    """
    omega, gamma = None, None
    if method.spec.layout == "blocks":
        omega, gamma = training_omega_gamma(method)
    out = {"perplexity": perplexity_summary(records.log_t, records.log_d, records.log_not_d, method=method.name,
                                            omega=omega, gamma=gamma)}
    if has_dk:
        out["latency"] = latency_summary(records.log_d, records.log_not_d)
        out["calibration"] = calibration(records.log_t, records.log_d, bins=calibration_bins)
        ids = records.input_ids if attribution == "input" else records.target_ids
        pauses = expected_pauses(records.log_d, records.log_not_d).numpy()
        out["pause_stats"] = pause_statistics(token_strings(tokenizer, ids.tolist()), pauses,
                                              min_count=min_count, top_k=top_k, attribution=attribution)
    return out


# ------------------------------------------------------------------------------ reference


def real_vocab(model) -> dict | None:
    """The tokenizer's ``{string: id}`` without the model's pause and dk ids (None without a
    tokenizer): two models share real tokens when these agree."""
    get = getattr(model.tokenizer, "get_vocab", None)
    if get is None:
        return None
    special = model.vocab.special_ids
    return {k: v for k, v in get().items() if v not in special}


def reference_perplexity(reference: str | os.PathLike, data: EvalData, *, batch_size: int, max_tokens: int | None,
                         device: str = "auto", precision: str = "auto", impl: str = "auto", dtype: str | None = None,
                         progress: bool = True, vocab: dict | None = None) -> dict:
    """The reference's perplexity: read from a metrics JSON file (``cyb eval``'s ``metrics.json``
    or a run's ``final_metrics.json``), or computed on ``data`` for a run/model folder.

    Returns ``{"name", "ppl", "tokens", "source"}`` (plus ``"warning"`` when the reference's
    tokenizer differs from ``vocab``, the evaluated model's :func:`real_vocab`).
    """
    p = Path(reference).expanduser()
    if p.is_file():
        try:
            d = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"--reference {p} is not valid JSON: {e}") from e
        if isinstance(d, dict) and isinstance(d.get("perplexity"), dict):
            return {"name": d.get("target", {}).get("name", p.stem), "ppl": d["perplexity"].get("ppl"),
                    "tokens": d["perplexity"].get("tokens"), "source": str(p)}
        if isinstance(d, dict) and isinstance(d.get("ppl"), (int, float)):
            return {"name": p.parent.name or p.stem, "ppl": float(d["ppl"]),
                    "tokens": d.get("targets", d.get("tokens")),
                    "source": f"{p} (held-out perplexity written at the end of training)"}
        raise ValueError(f"--reference {p}: no perplexity found (expected cyb eval's metrics.json or a run's "
                         "final_metrics.json)")
    target = resolve_target(p)
    model = load_model(target, device=device, dtype=dtype)
    out = {"name": target.name, "source": f"{p} evaluated on the same data"}
    ref_vocab = real_vocab(model)
    if vocab is not None and ref_vocab is not None and ref_vocab != vocab:
        out["warning"] = "the reference's tokenizer differs from the evaluated model's: per-token perplexities are not comparable"
    method = method_of(target, model)
    seed = target.config.train.seed if target.config is not None else 0
    records = collect_records(model, method, data.batches(model.tokenizer, batch_size, trained_on=model.trained_on), max_tokens=max_tokens,
                              precision=precision, impl=impl, progress=progress, num_passages=0, seed=seed,
                              desc="reference")
    ppl = perplexity_summary(records.log_t, records.log_d, records.log_not_d, method=method.name)
    out.update(ppl=ppl["ppl"], tokens=ppl["tokens"])
    return out


# ------------------------------------------------------------------------------ outputs


def write_outputs(metrics: dict, records: TokenRecords, tokenizer, out_dir: str | os.PathLike, *,
                  answer_rows: list[dict] | None = None) -> dict:
    """Write ``metrics.json``, figures, ``shaded.html``, ``pause_stats.md`` and ``summary.txt``
    (and, given ``answer_rows``, the scored answers of a reasoning-gym task, one JSON line
    each); returns ``{kind: file name}`` (also stored in ``metrics["files"]``)."""
    from ..report import html, plots, tables

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    name = metrics["target"]["name"]
    m = records.num_steps
    if "latency" in metrics:
        files["latency"] = plots.latency_figure(metrics["latency"], out / "latency.png", title=name).name
        files["calibration"] = plots.calibration_figure(metrics["calibration"], out / "calibration.png",
                                                        title=f"{name}: d_i vs t_(i+1) - t_i").name
        passages = [list(zip(token_strings(tokenizer, p.token_ids), p.pauses)) for p in records.passages]
        note = ("Each token's background shows the expected number of pauses (E[S] - 1) the model took "
                "to predict it, i.e. in the block of the token before; dotted tokens have no prediction.")
        write_text_atomic(out / "shaded.html", html.shaded_text_page(passages, float(m - 1), title=f"{name}: expected pauses",
                                                               note=note))
        files["shaded_text"] = "shaded.html"
        ps = metrics["pause_stats"]
        md = (f"# Pause statistics: {name}\n\n{tables.pause_table(ps)}\n## Highest median\n\n"
              f"{tables.token_stats_table(ps['highest_median'])}\n## Lowest median\n\n"
              f"{tables.token_stats_table(ps['lowest_median'])}")
        write_text_atomic(out / "pause_stats.md", md)
        files["pause_stats"] = "pause_stats.md"
    if answer_rows is not None:
        from .reasoning_scores import write_rows

        files["reasoning_gym"] = write_rows({"rows": answer_rows}, out)
    files["summary"] = "summary.txt"
    files["metrics"] = "metrics.json"
    metrics["files"] = files
    write_text_atomic(out / "summary.txt", format_summary(metrics) + "\n")
    write_json_atomic(out / "metrics.json", metrics)
    return files


def _p_text(p) -> str:
    if p is None or p != p:
        return "n/a"
    return "p < 0.001" if p < 1e-3 else f"p = {p:.3g}"


def _whole(d: dict) -> str:
    """What a source scored whole (``--data``) covered: all its documents, or where --tokens stopped."""
    if "documents" not in d:
        return ""
    if d.get("complete"):
        return f" (every token of its {d['documents']} document(s))"
    return f" (its first {d['documents']} document(s): --tokens stopped it, --tokens 0 scores them all)"


def format_summary(metrics: dict) -> str:
    """A few human-readable lines of ``metrics``."""
    t, d, ppl = metrics["target"], metrics["data"], metrics["perplexity"]
    trained = f", trained {t['step']} steps" if t.get("step") is not None else ""
    if t.get("epochs") is not None:
        trained += f" ({t['epochs']:.2f} epochs)"
    lines = [f"{t['name']} ({t['path']}{trained})",
             f"data: {d['source']}{_whole(d)}; {ppl['tokens']} tokens in {d['sequences']} sequences",
             f"perplexity {ppl['ppl']:.4f} (loss {ppl['loss']:.4f}; {ppl['readout']})"]
    if "train_setting" in ppl:
        ts = ppl["train_setting"]
        lines.append(f"  under the training omega/gamma: perplexity {ts['ppl']:.4f}")
    if len(ppl["by_step"]) > 1:
        lines.append("  reading out at a fixed step: " + ", ".join(
            f"step {i + 1}: {v:.3f}" for i, v in enumerate(ppl["by_step"])))
    ref = metrics.get("reference")
    if ref:
        lines.append(f"relative improvement vs {ref['name']} (perplexity {ref['ppl']:.4f}): "
                     f"{metrics['relative_improvement_pct']:+.2f}%" + (f"  [{ref['warning']}]" if ref.get("warning") else ""))
    if metrics.get("task"):
        from .task_scores import format_task

        lines.append(format_task(metrics["task"]))
    if metrics.get("reasoning_gym"):
        from .reasoning_scores import format_reasoning

        lines.append(format_reasoning(metrics["reasoning_gym"]))
    if metrics.get("generation"):
        from .text_generation import format_text_generation

        lines.append(format_text_generation(metrics["generation"]))
    lat = metrics.get("latency")
    if lat:
        lines.append(f"latency: mean E[S] {lat['mean_steps']:.3f} steps ({lat['mean_pauses']:.3f} pauses); "
                     "mean Pr(S=i): " + " ".join(f"{x:.3f}" for x in lat["stop_dist"]))
    for c in metrics.get("calibration", []):
        rho = c["spearman"]
        lines.append(f"calibration step {c['step']}: Spearman(d_{c['step']}, t_{c['step'] + 1} - t_{c['step']}) = "
                     + ("n/a" if rho is None or rho != rho else f"{rho:.3f}") + f" ({_p_text(c['p_value'])}, n = {c['n']})")
    if metrics.get("gated"):
        bias = [b for layer in metrics["gated"]["gate_bias"] for b in layer]
        share = metrics["gated"]["foreign_attention"]
        lines.append(f"gated pauses: gate bias mean {sum(bias) / len(bias):.2f}, max {max(bias):.2f}; attention on "
                     f"other tokens' pauses, per layer: " + ", ".join(f"{100 * x:.2f}%" for x in share))
    ps = metrics.get("pause_stats")
    if ps and ps["tokens"]:
        top = ", ".join(repr(s["token"]) for s in ps["highest_median"][:5])
        lines.append(f"pause statistics over {ps['tokens']} token strings; most pauses after: {top}")
    if metrics.get("out_dir"):
        lines.append(f"written to {metrics['out_dir']}: " + ", ".join(metrics.get("files", {}).values()))
    return "\n".join(lines)


# ------------------------------------------------------------------------------ entry point


def evaluate(
    path: str | os.PathLike,
    *,
    data: str | None = None,
    max_tokens: int | str | None = RUN_ROWS,
    batch_size: int | None = None,
    out_dir: str | os.PathLike | None = None,
    reference: str | os.PathLike | None = None,
    device: str = "auto",
    precision: str = "auto",
    impl: str = "auto",
    dtype: str | None = None,
    block_len: int | None = None,
    num_passages: int = 3,
    passage_tokens: int = 200,
    min_count: int = 5,
    top_k: int = 15,
    attribution: str = "input",
    progress: bool = True,
    write: bool = True,
    command: str | None = None,
    generate: int = 0,
    answer_mode: str = "adaptive",
    answer_read_at: int | None = None,
) -> dict:
    """Evaluate a run or saved model on held-out data; returns the metrics (also written as
    ``metrics.json`` with figures into ``out_dir``, default ``PATH/eval``, unless ``write`` is
    False).

    Args:
        path: a run folder, its ``final/`` folder, or a saved cyb model folder.
        data: None (the run's held-out data), ``task:NAME`` or a text source spec.
        max_tokens: evaluated real tokens (whole batches; None = all the data), or ``"run"``
            (the default): for a run on its own held-out data, exactly the rows its training
            evaluated (``train.eval_batches x train.batch_size``, all when 0), so the two
            perplexities agree; otherwise :data:`DEFAULT_TOKENS`.
        batch_size: rows per forward (default: the run's micro-batch, else 8).
        reference: a run/model folder (evaluated on the same data) or a metrics JSON file; adds
            ``reference`` and ``relative_improvement_pct``.
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:N``.  precision: ``auto``/``bf16``/``fp32``.
        impl: readout, ``auto``/``fused``/``naive``.  dtype: parameter dtype (see :func:`load_model`).
        block_len: real tokens per text row (default: the run's).
        num_passages, passage_tokens: shaded-text passages and their length.
        min_count, top_k, attribution: Table 2 settings (see :mod:`cyb.analysis.pause_stats`).
        command: the command line, stored in ``metrics.json``.
        generate: a task run: also generate the answers to the first ``generate`` held-out
            prompts in fixed and adaptive mode (:func:`cyb.eval.task_scores.score_task`); text:
            continue the first ``generate`` held-out rows in both modes and count the positions
            per token (:mod:`cyb.eval.text_generation`).
        answer_mode: a reasoning-gym task run: the mode its answers to every scored held-out
            question are generated in, ``adaptive`` or ``fixed``, before the task's verifier
            scores them (:func:`cyb.eval.reasoning_scores.score_reasoning`).
        answer_read_at: an ablation of those answers: every token read out at this step (1: the
            pauses removed at inference; ``M``: every pause taken); None: the model's decisions.
    """
    if max_tokens is not None and max_tokens != RUN_ROWS and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError(f"max_tokens (--tokens) must be >= 1, None or {RUN_ROWS!r}, got {max_tokens!r}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size (--batch-size) must be >= 1, got {batch_size}")
    if generate < 0:
        raise ValueError(f"generate (--generate) must be >= 0, got {generate}")
    if answer_mode not in ("adaptive", "fixed"):
        raise ValueError(f"answer_mode (--answer-mode) must be adaptive or fixed, got {answer_mode!r}")
    if answer_read_at is not None and answer_read_at < 1:
        raise ValueError(f"answer_read_at (--read-at) must be a step >= 1, got {answer_read_at}")
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    target = resolve_target(path)
    spec = resolve_data(target.config, data, block_len=block_len)
    reasoning = spec.kind == "synthetic" and spec.config.data.task.startswith("reasoning-gym:")
    if answer_read_at is not None and not reasoning:
        raise ValueError("answer_read_at (--read-at) applies to the generated answers of a reasoning-gym task run")
    if max_tokens == RUN_ROWS:
        max_tokens = None
        if data is None and target.config is not None and block_len in (None, spec.block_len):
            from ..run_data import held_out_rows

            spec.max_rows = held_out_rows(target.config)
        else:
            max_tokens = DEFAULT_TOKENS
    if batch_size is None:
        t = target.config.train if target.config is not None else None
        batch_size = (t.micro_batch_size or t.batch_size) if t is not None else 8
    model = load_model(target, device=device, dtype=dtype)
    method = method_of(target, model)
    has_dk = model.settings.use_dk
    seed = target.config.train.seed if target.config is not None else 0
    prompts = None
    if spec.kind == "text" and generate > 0:  # (taken before the scoring pass: a pass of its own over the rows)
        from .text_generation import held_out_prompts

        prompts = held_out_prompts(spec.batches(model.tokenizer, batch_size, trained_on=model.trained_on), generate)
    with gates.foreign_attention(model.hf_model) as through:
        records = collect_records(model, method, spec.batches(model.tokenizer, batch_size, trained_on=model.trained_on), max_tokens=max_tokens,
                                  precision=precision, impl=impl, progress=progress, num_passages=num_passages,
                                  passage_tokens=passage_tokens, seed=seed, desc=f"eval {method.name}")
    tokenizer = model.tokenizer
    vocab = real_vocab(model)
    metrics = {
        "target": {"name": target.name, "path": str(target.path), "run_dir": str(target.run_dir) if target.run_dir else None,
                   "method": method.name, "num_steps": model.num_steps, "has_dk": has_dk,
                   **training_state(target.model_dir)},
        "data": {**spec.to_dict(), "sequences": records.sequences, "batch_size": batch_size,
                 "max_tokens": max_tokens},
        "device": str(model.device),
        "precision": precision,
        "command": command,
    }
    metrics.update(analyse(records, method, has_dk=has_dk, tokenizer=tokenizer, min_count=min_count,
                           top_k=top_k, attribution=attribution))
    if through is not None:
        metrics["gated"] = {"gate_bias": gates.gate_values(model.hf_model).tolist(),
                            "foreign_attention": through.per_layer()}
    if spec.kind == "synthetic":  # exact match of the greedy answers
        from .task_scores import score_task

        metrics["task"] = score_task(model, spec.config, tokenizer, max_rows=spec.max_rows,
                                     generate=generate)
    if prompts is not None:  # continuations of held-out rows: positions per token as the model writes
        from .text_generation import score_text_generation

        metrics["generation"] = score_text_generation(model, prompts)
    answer_rows = None
    if reasoning:  # the task's verifier
        from .reasoning_scores import score_reasoning

        judged = score_reasoning(model, spec.config, tokenizer, max_rows=spec.max_rows, mode=answer_mode,
                                 read_at=answer_read_at)
        answer_rows = judged.pop("rows")
        metrics["reasoning_gym"] = judged
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if reference is not None:
        ref = reference_perplexity(reference, spec, batch_size=batch_size, max_tokens=max_tokens, device=device,
                                   precision=precision, impl=impl, dtype=dtype, progress=progress, vocab=vocab)
        if not isinstance(ref.get("ppl"), (int, float)):
            raise ValueError(f"--reference {reference}: its perplexity is missing or not a number")
        metrics["reference"] = ref
        metrics["relative_improvement_pct"] = relative_improvement(metrics["perplexity"]["ppl"], float(ref["ppl"]))
    if write:
        out = Path(out_dir) if out_dir is not None else default_out_dir(target)
        metrics["out_dir"] = str(out)
        write_outputs(metrics, records, tokenizer, out, answer_rows=answer_rows)
    return metrics

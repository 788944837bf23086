"""Several runs side by side (``cyb report``): the paper's appendix F table, training curves and
latency figures, as Markdown and a standalone HTML page.

For each run folder: the perplexity of ``RUN/eval/metrics.json`` (written by ``cyb eval``) when
present, else the held-out perplexity written at the end of training (``final_metrics.json``);
the training curves of ``metrics.jsonl``; the latency of ``cyb eval``.  Relative improvement is
``(PPL_ref - PPL) / PPL_ref x 100%`` against the reference run (default: the TBYS run with the
most pauses, else the first run).

Submodules: :mod:`~cyb.report.plots` (figures; the only matplotlib user),
:mod:`~cyb.report.html` (shaded text, pages), :mod:`~cyb.report.tables` (Markdown tables).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .. import methods
from ..files import write_json_atomic, write_text_atomic

EVAL_DIR = "eval"
GROUP_ORDER = methods.NAMES

__all__ = ["EVAL_DIR", "RunSummary", "build_report", "default_reference", "find_reference", "load_run"]


@dataclass
class RunSummary:
    """What the report needs of one run folder.

    Attributes:
        ppl, tokens: perplexity and the tokens it was measured on; ``ppl_source`` is ``"eval"``
            (``cyb eval``) or ``"training"`` (held-out evaluation at the end of training).
        mean_steps: mean ``E[S]`` for models with dk (same source), else None.
        step: optimiser steps of the evaluated model (None when unknown).
        warning: why ``RUN/eval`` was not used (it belongs to an earlier step), else None.
        curves: ``{"train": [(step, loss)], "valid": [(step, loss)]}`` from ``metrics.jsonl``.
        eval_metrics: ``RUN/eval/metrics.json`` or None.
    """

    path: Path
    name: str
    method: str
    num_steps: int
    ppl: float | None
    ppl_source: str
    tokens: int | None
    mean_steps: float | None
    step: int | None = None
    warning: str | None = None
    curves: dict = field(default_factory=dict)
    eval_metrics: dict | None = None
    eval_dir: Path | None = None


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


def load_run(path: str | os.PathLike, *, eval_dir: str = EVAL_DIR) -> RunSummary:
    """Read a run folder written by ``cyb train`` (and optionally ``cyb eval``).

    Raises FileNotFoundError for a missing path and ValueError for a folder that is not a run.
    """
    from ..config import RunConfig
    from ..metrics_log import read_metrics
    from ..methods import label as method_label

    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"run folder {p} does not exist")
    if not p.is_dir() or not (p / "config.yaml").is_file():
        raise ValueError(f"{p} is not a run folder: it has no config.yaml (give folders written by cyb train)")
    cfg = RunConfig.load_run(p)
    final = _read_json(p / "final_metrics.json") or {}
    ev_dir = p / eval_dir
    ev = _read_json(ev_dir / "metrics.json")
    trained = final.get("step")
    warning = _stale_eval(p, ev_dir, ev, trained)
    if warning is not None:
        ev = None
    if ev is not None:
        ppl, tokens, source = ev["perplexity"].get("ppl"), ev["perplexity"].get("tokens"), "eval"
        steps = (ev.get("latency") or {}).get("mean_steps")
        trained = ev.get("target", {}).get("step", trained)
    elif final.get("ppl") is not None:
        ppl, tokens, source = final.get("ppl"), final.get("targets", final.get("tokens")), "training"
        steps = final.get("mean_steps")
    else:
        if not (p / "metrics.jsonl").is_file():
            raise ValueError(f"{p} is not a run folder with results: no final_metrics.json, metrics.jsonl "
                             f"or {eval_dir}/metrics.json")
        ppl, tokens, source, steps = None, None, "none", None
    curves = {split: [(r["step"], r["loss"]) for r in read_metrics(p, split)
                      if r.get("step") is not None and r.get("loss") is not None]
              for split in ("train", "valid")}
    return RunSummary(path=p, name=method_label(cfg.method), method=cfg.method.name,
                      num_steps=cfg.method.num_steps if cfg.method.uses_pauses else 1,
                      ppl=None if ppl is None else float(ppl), ppl_source=source, tokens=tokens,
                      mean_steps=steps, step=trained, warning=warning, curves=curves, eval_metrics=ev,
                      eval_dir=ev_dir if ev is not None else None)


def _stale_eval(run: Path, ev_dir: Path, ev: dict | None, trained: int | None) -> str | None:
    """Why ``ev_dir/metrics.json`` does not describe the run's final model, or None if it does:
    it names another step, or (written before steps were recorded) is older than the run's
    final metrics."""
    if ev is None:
        return None
    ev_step = ev.get("target", {}).get("step")
    if ev_step is not None and trained is not None and ev_step != trained:
        return (f"{ev_dir}/metrics.json evaluated the model of step {ev_step}, but the run's final model is "
                f"from step {trained}: its held-out evaluation at the end of training is used; rerun "
                f"`cyb eval {run}`")
    final = run / "final_metrics.json"
    if ev_step is None and final.is_file() and final.stat().st_mtime > (ev_dir / "metrics.json").stat().st_mtime:
        return (f"{ev_dir}/metrics.json is older than the run's final model (the run went on after cyb eval): "
                f"its held-out evaluation at the end of training is used; rerun `cyb eval {run}`")
    return None


def _unique_names(runs: Sequence[RunSummary]) -> None:
    seen: dict[str, int] = {}
    for r in runs:
        seen[r.name] = seen.get(r.name, 0) + 1
    for r in runs:
        if seen[r.name] > 1:
            r.name = f"{r.name} [{r.path.name}]"


def _order(runs: Sequence[RunSummary]) -> list[RunSummary]:
    rank = {m: i for i, m in enumerate(GROUP_ORDER)}
    return sorted(runs, key=lambda r: (rank.get(r.method, len(rank)), r.num_steps))


def default_reference(runs: Sequence[RunSummary]) -> RunSummary:
    """The TBYS run with the most pauses (appendix F compares with TBYS 3 pauses), else the first."""
    refs = [r for r in runs if r.method == methods.REFERENCE and r.ppl is not None]
    return max(refs, key=lambda r: r.num_steps) if refs else runs[0]


def find_reference(runs: Sequence[RunSummary], name: str) -> RunSummary:
    """The run whose display name or folder name is ``name`` (case-insensitive)."""
    key = name.strip().lower()
    for r in runs:
        if key in (r.name.lower(), r.path.name.lower(), str(r.path).lower()):
            return r
    raise ValueError(f"--reference {name!r} matches no run; runs are: "
                     + ", ".join(f"{r.name!r} ({r.path.name})" for r in runs))


def _notes(runs: Sequence[RunSummary], ref: RunSummary) -> list[str]:
    notes = [f"Relative improvement = (PPL_ref - PPL) / PPL_ref x 100% with reference {ref.name!r}."]
    notes += [r.warning for r in runs if r.warning]
    notes += [f"{r.name} has no perplexity yet: its training has not finished (no final_metrics.json in "
              f"{r.path}) and `cyb eval` has not run on it; its training curves show how far it got."
              for r in runs if r.ppl_source == "none"]
    scored = [r for r in runs if r.ppl_source != "none"]
    sources = {r.ppl_source for r in scored}
    if sources == {"eval"}:
        notes.append("Perplexities from `cyb eval` (RUN/eval/metrics.json).")
    elif sources == {"training"}:
        notes.append("Perplexities from the held-out evaluation at the end of training (final_metrics.json).")
    elif sources:
        by = ", ".join(f"{r.name}: {r.ppl_source}" for r in scored)
        notes.append("Perplexities come from different evaluations (eval = `cyb eval`, training = held-out "
                     f"evaluation at the end of training); compare with care: {by}.")
    tokens = {r.tokens for r in runs if r.tokens is not None}
    if len(tokens) > 1:
        notes.append(f"The runs were evaluated on different numbers of tokens ({sorted(tokens)}).")
    steps = {r.step for r in runs if r.step is not None}
    if len(steps) > 1:
        notes.append(f"The runs were trained for different numbers of steps ({sorted(steps)}).")
    notes.append("Mean steps: E[S] over tokens (steps 1..M) for models with <don't know>.")
    return notes


def build_report(paths: Sequence[str | os.PathLike], out_dir: str | os.PathLike = "runs/report", *,
                 reference: str | None = None, command: str | None = None, eval_dir: str = EVAL_DIR) -> dict:
    """Write ``report.md``, ``report.html`` (figures embedded), ``report.json`` and PNG figures
    into ``out_dir``; returns the report as a dict (``entries``, ``reference``, ``files``).

    Args:
        paths: run folders (at least one).
        reference: display or folder name of the reference run (default: see
            :func:`default_reference`).
    """
    from ..analysis.perplexity import relative_improvement
    from . import html, plots, tables

    if not paths:
        raise ValueError("cyb report needs at least one run folder")
    runs = _order([load_run(p, eval_dir=eval_dir) for p in paths])
    _unique_names(runs)
    ref = find_reference(runs, reference) if reference else default_reference(runs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    entries = [{"name": r.name, "path": str(r.path), "method": r.method, "ppl": r.ppl, "tokens": r.tokens,
                "step": r.step, "mean_steps": r.mean_steps, "source": r.ppl_source} for r in runs]
    usable_ref = ref.ppl is not None and math.isfinite(ref.ppl) and ref.ppl > 0
    headers, rows = tables.results_rows(entries, ref.name if usable_ref else None)
    for e in entries:
        e["relative_improvement_pct"] = (relative_improvement(e["ppl"], ref.ppl)
                                         if usable_ref and e["name"] != ref.name and e["ppl"] is not None else None)
    notes = _notes(runs, ref)

    files = {"training_curves": plots.training_curves([(r.name, r.curves) for r in runs],
                                                      out / "training_curves.png").name}
    with_ppl = [(r.name, r.ppl) for r in runs if r.ppl is not None and math.isfinite(r.ppl)]
    if with_ppl:
        files["perplexity"] = plots.perplexity_bars(with_ppl, out / "perplexity.png", reference=ref.name).name
    lat = [(r.name, r.eval_metrics["latency"]) for r in runs if r.eval_metrics and r.eval_metrics.get("latency")]
    if lat:
        files["latency"] = plots.latency_grid(lat, out / "latency.png").name

    md = ["# Results\n"]
    if command:
        md.append(f"Made with `{command}`.\n")
    md += [tables.markdown_table(headers, rows), *(f"- {n}" for n in notes), ""]
    md += ["## Training curves\n", f"![training curves]({files['training_curves']})\n"]
    if "perplexity" in files:
        md += ["## Perplexity\n", f"![perplexity]({files['perplexity']})\n"]
    if lat:
        md += ["## Latency (paper Fig. 6)\n",
               "Blue: histogram of per-token expected pauses; purple: Pr(S) averaged over tokens.\n",
               f"![latency]({files['latency']})\n"]
    cal_rows = [[r.name, str(c["step"]), "n/a" if c.get("spearman") is None else f"{c['spearman']:.3f}",
                 "n/a" if c.get("p_value") is None else f"{c['p_value']:.2g}", str(c["n"])]
                for r in runs if r.eval_metrics for c in r.eval_metrics.get("calibration", [])]
    cal_headers = ("Method", "Step i", "Spearman(d_i, t_{i+1} - t_i)", "p-value", "Tokens")
    if cal_rows:
        md += ["## Calibration (appendix E)\n", tables.markdown_table(cal_headers, cal_rows)]
    pause_runs = [r for r in runs if r.eval_metrics and r.eval_metrics.get("pause_stats")]
    for r in pause_runs:
        md += [f"## Pause statistics: {r.name} (Table 2)\n", tables.pause_table(r.eval_metrics["pause_stats"],
                                                                                 per_cell=10)]
    write_text_atomic(out / "report.md", "\n".join(md))
    files["markdown"] = "report.md"

    body = []
    if command:
        body.append(f"<p class='note'>Made with <code>{html.escape(command)}</code>.</p>")
    body += [html.table_html(headers, rows), "<ul>" + "".join(f"<li>{html.inline_html(n)}</li>" for n in notes) + "</ul>",
             "<h2>Training curves</h2>", html.image_html(out / files["training_curves"], "training curves")]
    if "perplexity" in files:
        body += ["<h2>Perplexity</h2>", html.image_html(out / files["perplexity"], "perplexity")]
    if lat:
        body += ["<h2>Latency (paper Fig. 6)</h2>",
                 "<p class='note'>Blue: histogram of per-token expected pauses; purple: Pr(S) averaged over tokens.</p>",
                 html.image_html(out / files["latency"], "latency")]
    if cal_rows:
        body += ["<h2>Calibration (appendix E)</h2>", html.table_html(cal_headers, cal_rows)]
    for r in pause_runs:
        ps = r.eval_metrics["pause_stats"]
        cells = [["Low variance", *(", ".join(tables.display_token(s["token"]) for s in ps["cells"][c][:10])
                                    for c in ("low_median_low_variance", "high_median_low_variance"))],
                 ["High variance", *(", ".join(tables.display_token(s["token"]) for s in ps["cells"][c][:10])
                                     for c in ("low_median_high_variance", "high_median_high_variance"))]]
        body += [f"<h2>Pause statistics: {html.escape(r.name)} (Table 2)</h2>",
                 html.table_html(("", "Low median", "High median"), cells)]
    write_text_atomic(out / "report.html", html.page("cyb report", "\n".join(body)))
    files["html"] = "report.html"
    result = {"entries": entries, "reference": ref.name, "notes": notes, "files": files, "command": command}
    write_json_atomic(out / "report.json", result)
    files["json"] = "report.json"
    return result

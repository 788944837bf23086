"""The demo's presentation: the lines it prints while it runs, the comparison table, what a
run shows in plain words (computed from its numbers: the criterion's verdicts of
:mod:`cyb.demo.criterion`), and the report folder."""

from __future__ import annotations

from pathlib import Path

from .. import methods
from ..files import write_json_atomic, write_text_atomic
from .criterion import FEW, KEEPS, MARGIN, verdict
from .settings import DemoSettings


def header_lines(s: DemoSettings, task_description: str) -> list[str]:
    """What a run is about to do: the task, the model and the training of every method."""
    return [f"cyb demo: {task_description}",
            f"model: {s.arch}, hidden {s.hidden_size}, {s.num_layers} layer(s), {s.num_heads} head(s); "
            f"M = {s.num_steps}; {s.train_steps} steps of {s.batch_size} examples per method"]


def training_line(i: int, n: int, method: str, trained_in: str | None = None) -> str:
    """``[2/4] training tbys``, or for a run an earlier demo finished, that it is reused."""
    if trained_in is not None:
        return f"[{i}/{n}] {method}: trained already in {trained_in} (reused; --fresh trains it again)"
    return f"[{i}/{n}] training {method}"


def score_line(method: str, score: dict, train_seconds: float) -> str:
    """One trained method's scores (:func:`~cyb.demo.run.score_model`) and training time."""
    return (f"    {method}: exact match {score['exact_match']:.1%}, token accuracy "
            f"{score['token_accuracy']:.1%}, steps/token {score['mean_steps']:.2f} "
            f"({train_seconds:.0f} s)")


def summary_lines(out: Path, metrics: dict) -> list[str]:
    """What a run prints at its end: the table, each method's decoding, what the run shows and
    where the report is."""
    lines = ["", format_table(metrics)]
    for name, r in metrics["methods"].items():
        if "decoding" in r:
            lines.append("\n" + format_decoding(name, r["decoding"], r["num_steps"], recipe=r["recipe"],
                                                 visibility=r.get("pause_visibility", "shared")))
    lines.append("\n" + format_reading(metrics))
    lines.append(f"\nreport: {out}/ (metrics.json, settings.json, table.md, latency.png, examples.html); "
                 f"total {metrics['total_seconds']:.0f} s")
    return lines


def format_table(metrics: dict) -> str:
    """The comparison table (Markdown) of a :func:`~cyb.demo.run.run_demo` result."""
    rows = ["| method | M | exact match | token accuracy | answer ppl | mean steps/token E[S] "
            "| greedy steps/token | train s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in metrics["methods"].items():
        rows.append(f"| {name} | {r['num_steps']} | {r['exact_match']:.1%} | {r['token_accuracy']:.1%} "
                    f"| {r['ppl']:.3f} | {r['mean_steps']:.2f} | {r['greedy_steps']:.2f} "
                    f"| {r['train_seconds']:.0f} |")
    return "\n".join(rows)


def format_reading(metrics: dict) -> str:
    """What a :func:`~cyb.demo.run.run_demo` result shows, in plain words, computed from its numbers: whether
    pauses beat the no-pause baseline, and for each method with dk a line with each part of the
    demo's criterion (:func:`cyb.demo.criterion.verdict`), its verdict and the numbers behind it,
    then what adaptive decoding kept."""
    r = metrics["methods"]
    lines = ["What this run shows (one seed; docs/record/demo.md gives the spread over seeds, "
             "docs/concepts/demo.md the criterion):"]
    paused = {m: v["exact_match"] for m, v in r.items() if methods.spec(m).uses_pauses}
    if "baseline" in r and paused:
        base, best = r["baseline"]["exact_match"], max(paused, key=paused.get)
        if paused[best] > base + MARGIN:
            lines.append(f"- pauses pay: {best} answers {paused[best]:.1%} exactly, the no-pause baseline "
                         f"{base:.1%}, with the same data, steps and initial weights")
        else:
            lines.append(f"- pauses do not pay in this run: the best method with pauses, {best}, answers "
                         f"{paused[best]:.1%} exactly against the no-pause baseline's {base:.1%}")
    for m in r:
        if methods.spec(m).has_dk:
            lines.append(verdict_line(m, verdict(r, m), r[m]["mean_steps"]))
    return "\n".join(lines)


def verdict_line(method: str, v: dict, mean_steps: float) -> str:
    """A method's :func:`~cyb.demo.criterion.verdict` in words, on one line: whether it meets the
    criterion, each part (yes, no or cannot say) with its numbers, then adaptive decoding's."""
    head = {True: f"- {method} meets the demo's criterion",
            False: f"- {method} does not meet the demo's criterion",
            None: f"- {method}: the demo's criterion needs the baseline and TBYS in the run"}[v["meets_criterion"]]
    b, t, h = v["beats_baseline"], v["level_with_tbys"], v["more_steps_when_hard"]
    parts = [f"beats the no-pause baseline: {_said(b['holds'], 'no baseline in this run')}"
             + ("" if b["baseline"] is None else f" ({b['exact_match']:.1%} exact against {b['baseline']:.1%})"),
             f"within {MARGIN * 100:.1f} points of TBYS, or above: {_said(t['holds'], 'no TBYS in this run')}"
             + ("" if t["tbys"] is None else f" ({t['exact_match']:.1%} against {t['tbys']:.1%})")]
    steps = "more steps on the hard answer positions than on the easy ones"
    if h["hard"] is None:
        parts.append(f"{steps}: no (no answer position is harder than the others in this run; E[S] "
                     f"{mean_steps:.2f})")
    else:
        parts.append(f"{steps}: {_said(h['holds'])} (E[S] {h['hard']:.2f} against {h['easy']:.2f})")
    a = v.get("adaptive_keeps_answers")
    if a is not None:
        text = "beyond the criterion, adaptive decoding keeps fixed mode's answers: "
        if a["holds"] is None:
            text += f"cannot say (fixed mode answers only {a['fixed']:.1%} exactly)"
        elif not a["holds"]:
            text += f"no ({a['adaptive']:.1%} against {a['fixed']:.1%})"
        elif a["fewer_positions"] >= 1.1:
            text += f"yes ({a['adaptive']:.1%} against {a['fixed']:.1%}), at {a['fewer_positions']:.1f}x fewer positions per token"
        else:
            text += f"yes ({a['adaptive']:.1%} against {a['fixed']:.1%}), taking nearly every pause"
        parts.append(text)
    return f"{head}: " + "; ".join(parts)


def _said(holds: bool | None, unknown: str = "") -> str:
    return "cannot say (" + unknown + ")" if holds is None else ("yes" if holds else "no")


def format_decoding(method: str, decoding: dict, num_steps: int, *, recipe: int = 1,
                    visibility: str = "shared") -> str:
    """One line per mode: free-running exact match and network positions per generated token,
    then :func:`decoding_note` on what adaptive mode did."""
    lines = [f"{method} generating its answers token by token (greedy; M = {num_steps}):"]
    for mode, d in decoding.items():
        lines.append(f"  {mode:8s} mode: exact match {d['exact_match']:.1%}, {d['positions_per_token']:.2f} "
                     f"positions per token, {d['seconds']:.1f} s")
    note = decoding_note(decoding, recipe=recipe, visibility=visibility)
    if note:
        lines.append(f"  ({note})")
    return "\n".join(lines)


def decoding_note(decoding: dict, *, recipe: int = 1, visibility: str = "shared") -> str:
    """What adaptive mode did against fixed mode, read from their numbers (``""`` without both):

    * fixed mode answers under :data:`FEW`: too few answers to compare the modes;
    * adaptive mode within :data:`KEEPS` of fixed mode: it keeps the exact match (with how many
      times fewer positions, or that it took nearly every pause); with private pauses, why (and
      that it should, where it does not);
    * adaptive mode above half of fixed mode: it keeps most of it (how many points it loses);
    * else it loses most of the answers, and why: the contexts that a model trained with a pause
      after every token (Recipe 1), or with random pauses (Recipe 2), reads when earlier tokens
      answered at once.
    """
    fixed, adaptive = decoding.get("fixed"), decoding.get("adaptive")
    if not fixed or not adaptive:
        return ""
    f, a = fixed["exact_match"], adaptive["exact_match"]
    pf, pa = fixed["positions_per_token"], adaptive["positions_per_token"]
    saved = pf / max(pa, 1e-9)
    fewer = (f"with {saved:.1f}x fewer positions per token" if saved >= 1.1 else
             f"but takes nearly every pause ({pa:.2f} positions per token against {pf:.2f})")
    head = "adaptive mode feeds a pause only after <don't know>"
    if f < FEW:
        return (f"{head}; in fixed mode the model answers only {f:.1%} of the prompts exactly, too few to say "
                "what adaptive mode keeps")
    if visibility == "private" and a < f - KEEPS:
        return (f"private pauses: adaptive mode should make fixed mode's decisions, yet it answers {a:.1%} "
                f"exactly against {f:.1%}")
    if a >= f - KEEPS:
        if visibility == "private":
            return (f"private pauses: no token reads another token's pauses, so adaptive mode makes fixed mode's "
                    f"decisions; it keeps the exact match {fewer}")
        return f"{head}: here it keeps the exact match {fewer}"
    lost = f"{(f - a) * 100:.1f} points"
    if a >= f / 2:
        return f"{head}: here it keeps most of the exact match, {a:.1%} of {f:.1%} ({lost} fewer), {fewer}"
    if recipe == 2:
        why = ("in Recipe 2 training the pauses came at random, and later tokens read them, so an earlier token "
               "answered at once leaves its successors fewer positions than in training")
    else:
        why = ("a model trained with a pause after every token, Recipe 1, then reads contexts it never saw in "
               "training")
    return f"{head}: here it loses most of its answers ({a:.1%} against {f:.1%}): {why}"


def write_report(out: Path, s: DemoSettings, metrics: dict, configs: dict, test, details: dict) -> None:
    """Write metrics.json, settings.json, table.md, latency.png and examples.html (the test answers
    shaded by the expected pauses of :func:`shaded_method`) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "metrics.json", metrics, indent=2)
    write_json_atomic(out / "settings.json", {"demo": s.to_dict(), "runs": configs}, indent=2)
    (out / "table.md").write_text(format_table(metrics) + "\n")
    from ..report import html, plots

    plots.steps_per_position_figure(metrics, out / "latency.png")
    shaded = shaded_method(metrics)
    size = ", ".join(f"{k} {v}" for k, v in s.task_kwargs.items())
    write_text_atomic(out / "examples.html", html.task_examples_page(
        test, details[shaded]["expected_steps"], details[shaded]["predictions"],
        num_steps=metrics["methods"][shaded]["num_steps"], method=shaded,
        limit=s.num_examples_shown, title=f"{s.task} ({size})" if size else s.task))


def shaded_method(metrics: dict) -> str:
    """The method ``examples.html`` shades: of those with dk, the one that pauses most (the
    highest mean E[S]), else the first."""
    with_dk = [m for m in metrics["methods"] if methods.spec(m).has_dk]
    if not with_dk:
        return next(iter(metrics["methods"]))
    return max(with_dk, key=lambda m: metrics["methods"][m]["mean_steps"])

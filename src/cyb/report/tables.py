"""Markdown tables in the layout of the paper: results (appendix F) and pause statistics (Table 2)."""

from __future__ import annotations

import math
from typing import Sequence

from ..analysis.perplexity import relative_improvement

RESULT_HEADERS = ("Method", "Perplexity", "Rel. Improvement (%)", "Mean steps", "Eval tokens", "Trained steps")


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> str:
    """A GitHub-flavoured Markdown table; ``align`` is one of ``l``/``r`` per column (default:
    first column left, the rest right)."""
    align = align or ("l" + "r" * (len(headers) - 1))
    rule = ["---" if a == "l" else "--:" for a in align]
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def format_ppl(ppl: float | None) -> str:
    if ppl is None or (isinstance(ppl, float) and math.isnan(ppl)):
        return "n/a"
    return "inf" if math.isinf(ppl) else f"{ppl:.3f}"


def format_improvement(value: float | None) -> str:
    """``+2.20%`` / ``-1.48%``; ``---`` for the reference itself (``None``)."""
    if value is None:
        return "---"
    if math.isnan(value):
        return "n/a"
    return f"{value:+.2f}%"


def results_rows(entries: Sequence[dict], reference: str | None) -> tuple[tuple[str, ...], list[list[str]]]:
    """Rows of the appendix F table.

    Args:
        entries: dicts with ``name``, ``ppl`` (float or None), optional ``mean_steps``,
            ``tokens`` and ``step`` (optimiser steps of the evaluated model); in display order.
        reference: the ``name`` of the reference entry (its improvement shows ``---``); None
            leaves the column empty.

    The lowest perplexity and the highest improvement are set in bold, as in the paper.
    """
    ref_ppl = None
    if reference is not None:
        match = [e for e in entries if e["name"] == reference]
        if not match:
            raise ValueError(f"reference {reference!r} is not among the entries {[e['name'] for e in entries]}")
        ref_ppl = match[0].get("ppl")
    usable = ref_ppl is not None and math.isfinite(ref_ppl) and ref_ppl > 0
    improvements = []
    for e in entries:
        if reference is None or e["name"] == reference:
            improvements.append(None)
        elif usable and e.get("ppl") is not None:
            improvements.append(relative_improvement(e["ppl"], ref_ppl))
        else:
            improvements.append(math.nan)
    finite_ppl = [e["ppl"] for e in entries if e.get("ppl") is not None and math.isfinite(e["ppl"])]
    best_ppl = min(finite_ppl) if finite_ppl else None
    finite_imp = [v for v in improvements if v is not None and math.isfinite(v)]
    best_imp = max(finite_imp) if finite_imp else None
    rows = []
    for e, imp in zip(entries, improvements):
        ppl_s = format_ppl(e.get("ppl"))
        if best_ppl is not None and len(entries) > 1 and e.get("ppl") == best_ppl:
            ppl_s = f"**{ppl_s}**"
        imp_s = "" if reference is None else format_improvement(imp)
        if imp is not None and best_imp is not None and imp == best_imp and best_imp > 0:
            imp_s = f"**{imp_s}**"
        steps = e.get("mean_steps")
        rows.append([e["name"], ppl_s, imp_s, "" if steps is None else f"{steps:.2f}",
                     "" if e.get("tokens") is None else str(e["tokens"]),
                     "" if e.get("step") is None else str(e["step"])])
    return RESULT_HEADERS, rows


def results_table(entries: Sequence[dict], reference: str | None) -> str:
    """The appendix F table as Markdown (see :func:`results_rows`)."""
    headers, rows = results_rows(entries, reference)
    return markdown_table(headers, rows)


def display_token(token: str) -> str:
    """A token string with its whitespace made visible (``␣`` for a space, ``↵`` for a newline,
    ``⇥`` for a tab)."""
    return token.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5") or "\u2205"


def md_token(token: str) -> str:
    """:func:`display_token` with the characters Markdown would interpret escaped."""
    text = display_token(token)
    for ch in "\\`*_[]<>#":
        text = text.replace(ch, "\\" + ch)
    return text


def pause_table(pause_stats: dict, *, per_cell: int | None = None) -> str:
    """Table 2 as Markdown: low/high median (columns) x low/high variance (rows), each cell
    listing its most frequent tokens."""
    cells = pause_stats["cells"]

    def tokens(cell):
        items = cells[cell][:per_cell] if per_cell else cells[cell]
        return ", ".join(md_token(s["token"]) for s in items) or "(none)"

    rows = [["**Low variance**", tokens("low_median_low_variance"), tokens("high_median_low_variance")],
            ["**High variance**", tokens("low_median_high_variance"), tokens("high_median_high_variance")]]
    split = pause_stats.get("split", {})
    note = ""
    if split.get("median") is not None:
        note = (f"\nSplit at the medians over {pause_stats.get('tokens', 0)} token strings seen at "
                f"least {pause_stats.get('min_count')} times: median expected pauses "
                f"{split['median']:.3f}, variance {split['variance']:.3g} (values equal to a split "
                f"count as low). Pauses attributed to the {pause_stats.get('attribution')} token "
                "of each block.\n")
    return markdown_table(("", "Low median", "High median"), rows, align="lll") + note


def token_stats_table(items: Sequence[dict]) -> str:
    """Per-token statistics (token, count, median, variance) as Markdown."""
    rows = [[md_token(s["token"]), str(s["count"]), f"{s['median']:.3f}", f"{s['variance']:.3g}"]
            for s in items]
    return markdown_table(("Token", "Count", "Median pauses", "Variance"), rows)

"""Standalone HTML: shaded text (paper Fig. 1b) and report pages (figures embedded inline)."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Sequence

from ..colours import hex_colour, is_light, pause_rgb

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 60em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.passage { font-family: Menlo, Consolas, monospace; white-space: pre-wrap; line-height: 1.9;
           border: 1px solid #ddd; padding: 0.8em; margin: 1em 0; }
.tok { padding: 0.1em 0; border-radius: 2px; }
.tok.na { outline: 1px dotted #bbb; }
.legend { display: flex; align-items: center; gap: 0.5em; font-size: 0.9em; margin: 0.5em 0; }
.legend .swatch { display: inline-block; width: 2.2em; height: 1.2em; border: 1px solid #999;
                  text-align: center; font-size: 0.8em; }
.legend .bar { display: inline-block; width: 14em; height: 1.0em; border: 1px solid #999; }
img { max-width: 100%; }
.note { color: #666; font-size: 0.9em; }
"""


def escape(text: str) -> str:
    """HTML-escape ``text`` (quotes included)."""
    return html.escape(str(text))


def shade_color(value: float, max_value: float) -> str:
    """``#rrggbb`` from white (``value = 0``) to dark blue (``value = max_value``), linear in
    RGB and clipped; every channel is non-increasing in ``value``."""
    return hex_colour(pause_rgb(value / max_value if max_value > 0 else 0.0))


def _text_color(value: float, max_value: float) -> str:
    return "#000000" if is_light(pause_rgb(value / max_value if max_value > 0 else 0.0)) else "#ffffff"


def legend_html(max_value: float) -> str:
    """A legend of the shading: a gradient bar from 0 to ``max_value`` expected pauses and one
    swatch per whole number of pauses."""
    m = max(int(round(max_value)), 0)
    swatches = "".join(
        f'<span class="swatch" style="background:{shade_color(k, max_value)};'
        f'color:{_text_color(k, max_value)}">{k}</span>' for k in range(m + 1))
    bar = (f'<span class="bar" style="background:linear-gradient(to right, {shade_color(0, 1)}, '
           f'{shade_color(1, 1)})"></span>')
    return (f'<div class="legend" id="legend"><b>Legend</b> expected pauses per token: '
            f'0 {bar} {max_value:g} &nbsp; {swatches}</div>')


def token_span(text: str, value: float | None, max_value: float) -> str:
    """One token as a ``<span>`` shaded by its expected pauses (``None``/``nan``: no value)."""
    shown = html.escape(text) if text else "&#8203;"
    if value is None or not math.isfinite(value):
        return f'<span class="tok na" title="no prediction for this token">{shown}</span>'
    return (f'<span class="tok" data-pauses="{value:.4f}" title="{value:.2f} expected pauses" '
            f'style="background:{shade_color(value, max_value)};color:{_text_color(value, max_value)}">'
            f"{shown}</span>")


def shaded_passages_html(passages: Sequence[Sequence[tuple[str, float | None]]], max_value: float) -> str:
    """``<div class="passage">`` blocks, one ``<span>`` per ``(token text, expected pauses)``."""
    return "\n".join(
        '<div class="passage">' + "".join(token_span(t, v, max_value) for t, v in passage) + "</div>"
        for passage in passages)


def page(title: str, body: str) -> str:
    """A standalone HTML document."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n"
            f"<body>\n<h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n")


def shaded_text_page(passages: Sequence[Sequence[tuple[str, float | None]]], max_value: float, *,
                     title: str = "Expected pauses per token", note: str | None = None) -> str:
    """Paper Fig. 1b as a page: each token's background by the expected number of pauses the
    model takes to predict it, white (0) to dark blue (``max_value = M - 1``), with a legend."""
    parts = [legend_html(max_value)]
    if note:
        parts.append(f'<p class="note">{html.escape(note)}</p>')
    parts.append(shaded_passages_html(passages, max_value))
    return page(title, "\n".join(parts))


def table_html(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain HTML table (cells escaped; ``**x**`` becomes bold)."""
    def cell(tag, text):
        s = html.escape(str(text))
        if s.startswith("**") and s.endswith("**") and len(s) > 4:
            s = f"<b>{s[2:-2]}</b>"
        return f"<{tag}>{s}</{tag}>"

    head = "<tr>" + "".join(cell("th", h) for h in headers) + "</tr>"
    body = "\n".join("<tr>" + "".join(cell("td", c) for c in r) + "</tr>" for r in rows)
    return f"<table>\n{head}\n{body}\n</table>"


def image_html(path: str | Path, alt: str = "") -> str:
    """An ``<img>`` with the PNG embedded as a data URI (the page stays standalone)."""
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def task_examples_page(test, expected_steps, predictions, *, num_steps: int, method: str = "cyb",
                       limit: int = 24, title: str = "") -> str:
    """An HTML page of test examples whose answer characters are shaded by expected pauses.

    ``expected_steps`` and ``predictions`` are ``[N, L]`` aligned with ``test.ids`` (see
    :func:`cyb.demo.run.score_model`); a character's shade is ``E[S] - 1`` (expected pauses) of the block
    that predicts it, white at 0 and dark blue at ``num_steps - 1``.  Wrong greedy predictions
    are underlined in red, with the predicted character in the tooltip.
    """
    tok = test.tokenizer
    max_pauses = num_steps - 1
    rows = []
    for i in range(min(limit, len(test))):
        cells, all_ok = [], True
        for j in test.loss_mask[i].nonzero().flatten().tolist():
            target, pred = int(test.ids[i, j]), int(predictions[i, j])
            text = "⏎" if target == tok.eos_id else tok.decode([target])
            pauses = float(expected_steps[i, j]) - 1.0
            tip = f"{pauses:.2f} expected pauses"
            style = f"background:{shade_color(pauses, max_pauses)};color:{_text_color(pauses, max_pauses)};"
            if pred != target:
                all_ok = False
                guess = tok.decode([pred]) if 0 <= pred < tok.vocab_size else "?"
                tip += f"; greedy predicted {guess!r}"
                style += "border-bottom:3px solid #d62728;"
            cell = (f'<span class="tok" data-pauses="{pauses:.4f}" title="{escape(tip)}" '
                    f'style="{style}">{escape(text)}</span>')
            cells.append(cell)
        rows.append(f"<tr><td><code>{escape(test.prompts[i])}</code></td>"
                    f'<td class="answer">{"".join(cells)}</td><td>{"✓" if all_ok else "✗"}</td></tr>')
    style = ("<style>td.answer { font-family: Menlo, Consolas, monospace; font-size: 1.15em; "
             "text-align: left; letter-spacing: 0.1em; }</style>")
    note = (f"Each answer character (⏎ = end of answer) is shaded by the expected number of pauses "
            f"(E[S] - 1) {method} took before producing it, from white (0) to dark blue "
            f"({max_pauses}); hover for the value. Red underline: the greedy answer at that character "
            f"was wrong. Predictions are greedy with the correct prefix (teacher forcing), which is "
            f"what greedy generation emits up to its first mistake.")
    body = [style, legend_html(max_pauses), f'<p class="note">{escape(note)}</p>',
            "<table><tr><th>prompt</th><th>answer</th><th>exact</th></tr>", *rows, "</table>"]
    return page(f"Where {method} pauses: {title}", "\n".join(body))

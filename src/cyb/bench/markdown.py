"""Markdown tables of benchmark results (printed by ``cyb bench`` and used for the docs)."""

from __future__ import annotations


def markdown_table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table; cells are converted with ``str``."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _status(row: dict) -> str | None:
    """None for an ok row, else what to show instead of numbers."""
    if row.get("status") == "ok":
        return None
    reason = row.get("reason")
    return f"{row.get('status', '?')}" + (f" ({reason[:60]})" if reason else "")


def train_table(result: dict) -> str:
    """One line per (vocab, batch, mode, variant)."""
    headers = ["V", "B", "mode", "variant", "step ms", "real tok/s", "positions/s", "MFU",
               "peak GiB", "first loss"]
    modes, variants = ("eager", "compile"), _TRAIN_VARIANTS

    def key(r):
        return (r["vocab"], r["batch"], _index(modes, r["mode"]), _index(variants, r["variant"]))

    rows = []
    for r in sorted(result.get("results", []), key=key):
        head = [r["vocab"], r["batch"], r["mode"], r["variant"]]
        bad = _status(r)
        if bad is not None:
            rows.append(head + [bad, "", "", "", "", ""])
            continue
        rows.append(head + [_num(r["ms"], ".1f"), _num(r["real_tokens_per_s"], ",.0f"),
                            _num(r["positions_per_s"], ",.0f"), _num(r.get("mfu"), ".3f"),
                            _num(r.get("peak_gib"), ".2f"), _num(r.get("first_loss"), ".4f")])
    return markdown_table(headers, rows)


_TRAIN_VARIANTS = ("baseline_hf", "tbys_hf", "tbys_liger", "cyb_naive", "cyb_fused",
                   "cyb_fused_lowmem")


def _index(order, value) -> int:
    return order.index(value) if value in order else len(order)


def _captures(row: dict) -> str:
    """``ms`` of every graph capture of a row, with the number of graphs when known."""
    ms = _num(row.get("capture_ms"), ".1f")
    n = row.get("graphs_captured")
    return ms if n is None else f"{ms} ({n})"


def decode_table(result: dict) -> str:
    """One line per (implementation, mode, batch, M), then the end-to-end and check lines."""
    headers = ["impl", "mode", "B", "M", "ms / real token", "ms / step (median)", "positions / token",
               "steps / token", "real tok/s", "prefill ms", "graph capture ms (graphs)", "tokens = eager"]
    impls = ("hf_eager", "cyb_eager", "cyb_graph", "cyb_static", "cyb_eager_pos", "cyb_graph_pos",
             "cyb_static_pos")
    modes = ("fixed", "adaptive")
    rows = []
    key = lambda r: (r["batch"], _index(modes, r.get("mode", "fixed")), r["num_steps"],  # noqa: E731
                     _index(impls, r["impl"]))
    for r in sorted(result.get("results", []), key=key):
        head = [r["impl"], r.get("mode", "fixed"), r["batch"], r["num_steps"]]
        bad = _status(r)
        if bad is not None:
            rows.append(head + [bad] + [""] * 7)
            continue
        cmp = r.get("tokens_vs_cyb_eager")
        same = "-" if cmp is None else f"{cmp['match_fraction']:.2f}"
        rows.append(head + [_num(r.get("per_real_token_ms"), ".3f"), _num(r["step_ms"], ".3f"),
                            _num(r.get("positions_per_token"), ".2f"),
                            _num(r.get("steps_per_token"), ".2f"),
                            _num(r.get("real_tokens_per_s"), ",.1f"), _num(r["prefill_ms"], ".1f"),
                            _captures(r), same])
    out = markdown_table(headers, rows)
    e2e = (result.get("end_to_end") or {}).get("rows") or []
    if e2e:
        lines = []
        for r in e2e:
            head = [r["mode"], r["batch"], r["num_steps"], r["new_tokens"], r.get("decoder", "")]
            bad = _status(r)
            lines.append(head + ([bad, ""] if bad is not None else
                                 [_num(r["tokens_per_s"], ",.1f"), _num(r.get("decode_tokens_per_s"), ",.1f")]))
        out += "\n\n" + markdown_table(["generate: mode", "B", "M", "new tokens", "decoder",
                                          "tok/s (whole call)", "tok/s (decoding, from token 3)"], lines)
    ll = result.get("loglikelihood") or {}
    if ll.get("status") == "ok":
        lines = []
        for name in ("scored_blocks", "full_logits"):
            r = ll.get(name) or {}
            bad = _status(r)
            lines.append([name] + ([bad, "", "", ""] if bad is not None else
                                   [_num(r["ms"], ".1f"), _num(r["requests_per_s"], ",.1f"),
                                    _num(r["tokens_scored_per_s"], ",.0f"), _num(r.get("peak_gib"), ".2f")]))
        out += "\n\n" + markdown_table(
            [f"loglikelihood: {ll['batch']} requests x ({ll['context']} + {ll['continuation']}) tokens",
             "ms / batch", "requests/s", "continuation tokens/s", "peak GiB"], lines)
    check = result.get("agreement_fp32") or {}
    if check.get("status") == "ok":
        lines = [[k, "yes" if v["equal"] else "NO", f"{v['match_fraction']:.3f}", v["rows"],
                  v["tokens"], f"{v['mean_steps']:.2f}"]
                 for k, v in check.items() if isinstance(v, dict)]
        out += "\n\n" + markdown_table(["float32 check: case", "graph = eager", "tokens equal",
                                          "rows", "tokens per row", "steps per token"], lines)
    return out


def loss_table(result: dict) -> str:
    """Rows (V, N), a column per method: ``ms / extra GiB`` (forward + backward)."""
    rows_in = result.get("results", [])
    methods = []
    for r in rows_in:
        if r["method"] not in methods:
            methods.append(r["method"])
    cell = {(r["vocab"], r["positions"], r["method"]): r for r in rows_in}
    rows = []
    for v, n in sorted({(r["vocab"], r["positions"]) for r in rows_in}):
        line = [v, n]
        for m in methods:
            r = cell.get((v, n, m))
            if r is None:
                line.append("-")
            elif r.get("status") != "ok":
                line.append(r.get("status", "?"))
            elif r.get("peak_extra_gib") is None:
                line.append(f"{r['ms']:.1f} ms")
            else:
                line.append(f"{r['ms']:.1f} ms / {r['peak_extra_gib']:.2f} GiB")
        rows.append(line)
    return markdown_table(["V", "N"] + methods, rows)


def table_for(result: dict) -> str:
    """The table of a result of any kind."""
    from .targets import result_kind

    kind = result_kind(result)
    if kind == "train":
        return train_table(result)
    if kind == "decode":
        return decode_table(result)
    if kind == "loss":
        return loss_table(result)
    raise ValueError(f"not a benchmark result (kind {result.get('kind')!r})")

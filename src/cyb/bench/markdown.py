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
    headers = ["V", "B", "mode", "variant", "step ms", "kernel ms", "real tok/s", "positions/s", "MFU",
               "peak GiB", "first loss"]
    modes, variants = ("eager", "compile"), _TRAIN_VARIANTS

    def key(r):
        return (r["vocab"], r["batch"], _index(modes, r["mode"]), _index(variants, r["variant"]))

    rows = []
    for r in sorted(result.get("results", []), key=key):
        head = [r["vocab"], r["batch"], r["mode"], r["variant"]]
        bad = _status(r)
        if bad is not None:
            rows.append(head + [bad, "", "", "", "", "", ""])
            continue
        rows.append(head + [_num(r["ms"], ".1f"), _num(r.get("kernel_ms"), ".1f"), _num(r["real_tokens_per_s"], ",.0f"),
                            _num(r["positions_per_s"], ",.0f"), _num(r.get("mfu"), ".3f"),
                            _num(r.get("peak_gib"), ".2f"), _num(r.get("first_loss"), ".4f")])
    return markdown_table(headers, rows)


_TRAIN_VARIANTS = ("baseline_hf", "tbys_hf", "tbys_liger", "cyb_naive", "cyb_fused",
                   "cyb_fused_lowmem")


def _index(order, value) -> int:
    return order.index(value) if value in order else len(order)


def decode_table(result: dict) -> str:
    """One line per (layout, batch, mode, M, pause share, implementation), then the offline job,
    the float32 checks and the loglikelihood rows."""
    from .decode import IMPLS

    headers = ["impl", "pauses", "mode", "B", "M", "dk share", "ms / real token", "ms / step",
               "positions / token", "steps / token", "real tok/s"]
    modes = ("fixed", "adaptive")
    key = lambda r: (r.get("visibility", ""), r["batch"], _index(modes, r.get("mode", "fixed")),  # noqa: E731
                     r["num_steps"], r.get("pause_fraction") or 0, _index(IMPLS, r["impl"]))
    rows = []
    for r in sorted(result.get("results", []), key=key):
        head = [r["impl"], r.get("visibility", ""), r.get("mode", "fixed"), r["batch"], r["num_steps"],
                "" if r.get("pause_fraction") is None else r["pause_fraction"]]
        bad = _status(r)
        if bad is not None:
            rows.append(head + [bad] + [""] * 4)
            continue
        rows.append(head + [_num(r.get("ms_per_token"), ".3f"), _num(r.get("step_ms"), ".3f"),
                            _num(r.get("positions_per_token"), ".2f"), _num(r.get("steps_per_token"), ".2f"),
                            _num(r.get("real_tokens_per_s"), ",.0f")])
    out = markdown_table(headers, rows)
    jobs = result.get("offline") or []
    if jobs:
        lines = []
        for j in jobs:
            head = [j.get("impl", ""), j.get("visibility", ""), j.get("prompts", "")]
            bad = _status(j)
            lines.append(head + ([bad, "", "", "", ""] if bad is not None else
                                 [_num(j["seconds"], ".1f"), _num(j["real_tokens_per_s"], ",.0f"), j["slots"],
                                  _num(j["cache_gib"], ".2f"), _num(j.get("speedup_vs_static_batches"), ".2f")]))
        out += "\n\n" + markdown_table(["offline job (adaptive)", "pauses", "prompts", "seconds", "real tok/s",
                                          "slots", "KV cache GiB", "x static batches"], lines)
    for name, check in sorted((k, v) for k, v in result.items() if k.startswith("agreement_fp32")):
        if check.get("status") == "ok":
            lines = [[k, "yes" if v["equal"] else "NO", f"{v['rows_equal']}/{v['rows']}", v["tokens"],
                      f"{v['mean_steps']:.2f}"] for k, v in check.items() if isinstance(v, dict)]
            out += "\n\n" + markdown_table(["float32 check: case", "engine = eager", "rows equal",
                                              "tokens per row", "steps per token"], lines)
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

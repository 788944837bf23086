"""The performance targets, checked on a benchmark result (ratios within one run).

Each check is ``{"target", "value", "op", "threshold", "met", "note"}``: ``met`` is True or
False, or None when a row it needs is missing or failed (``note`` says which).

Training (per ``(vocab, batch)`` case and mode): CYB fused tokens/s >= TBYS with Liger,
CYB fused peak memory <= TBYS with Liger; per case, the best CYB fused MFU >= 0.50; and, as
correctness checks, equal first-step losses of two implementations of one loss (CYB fused vs
naive, TBYS with Liger vs the Hugging Face loss: same weights, same batch).
Decode: fixed-mode (M > 1) per-real-token latency <= 1.1 x the M = 1 latency of the same decoder
on the graph (static) path and <= 1.5 x on the eager path (batch 1); the CUDA-graph M > 1
latency <= 0.5 x the eager Hugging Face latency (the 8.4 ms anchor, and the eager loop measured
in the same run); :func:`cyb.generation.generate` decoding within 10% of the decoder's own
tokens/s (fixed mode, batch 1); the static decoders' tokens equal to the eager ones (float32).
"""

from __future__ import annotations

MFU_TARGET = 0.50
LATENCY_RATIO_TARGET = 1.1
EAGER_LATENCY_RATIO_TARGET = 1.5
E2E_FRACTION = 0.9
HF_LATENCY_FRACTION = 0.5
#: Relative difference allowed between two implementations of one loss (bf16 rounding).
LOSS_AGREEMENT = 0.01


def _check(target: str, value, op: str, threshold, note: str = "") -> dict:
    met = None
    if value is not None:
        met = value >= threshold if op == ">=" else value <= threshold if op == "<=" else value == threshold
    return {"target": target, "value": value, "op": op, "threshold": threshold, "met": met,
            "note": note}


def _ok(row) -> bool:
    return row is not None and row.get("status") == "ok"


def _why(name: str, row) -> str:
    if row is None:
        return f"{name} not run"
    return f"{name}: {row.get('status')}"


def train_targets(result: dict) -> list[dict]:
    """Checks of a ``cyb bench train`` result."""
    rows = result.get("results", [])
    at = {(r["vocab"], r["batch"], r["mode"], r["variant"]): r for r in rows}
    cases = sorted({(r["vocab"], r["batch"]) for r in rows})
    modes = [m for m in ("eager", "compile") if any(r["mode"] == m for r in rows)]
    out = []
    for v, b in cases:
        label = f"V={v}, B={b}"
        for mode in modes:
            liger = at.get((v, b, mode, "tbys_liger"))
            for variant, name in (("cyb_fused", "CYB fused"),
                                  ("cyb_fused_lowmem", "CYB fused, small chunks")):
                fused = at.get((v, b, mode, variant))
                if variant != "cyb_fused" and fused is None:
                    continue  # an optional variant that was not run
                if _ok(fused) and _ok(liger):
                    out.append(_check(f"{name} tokens/s >= HF+Liger TBYS ({label}, {mode})",
                                      fused["real_tokens_per_s"] / liger["real_tokens_per_s"], ">=",
                                      1.0))
                    if fused.get("peak_gib") is not None and liger.get("peak_gib"):
                        out.append(_check(f"{name} peak memory <= HF+Liger TBYS ({label}, {mode})",
                                          fused["peak_gib"] / liger["peak_gib"], "<=", 1.0))
                else:
                    note = "; ".join(_why(n, r) for n, r in ((variant, fused), ("tbys_liger", liger))
                                     if not _ok(r))
                    out.append(_check(f"{name} vs HF+Liger TBYS ({label}, {mode})", None, ">=", 1.0,
                                      note))
        for mode in modes:  # same weights and data at the first step: same loss up to rounding
            for a, b_ in (("cyb_fused", "cyb_naive"), ("cyb_fused_lowmem", "cyb_naive"),
                          ("tbys_liger", "tbys_hf")):
                ra, rb = at.get((v, b, mode, a)), at.get((v, b, mode, b_))
                if _ok(ra) and _ok(rb) and ra.get("first_loss") is not None:
                    diff = abs(ra["first_loss"] - rb["first_loss"]) / max(abs(rb["first_loss"]), 1e-12)
                    out.append(_check(f"{a} first-step loss == {b_} ({label}, {mode}; relative "
                                      "difference)", diff, "<=", LOSS_AGREEMENT))
        best = [at[(v, b, m, "cyb_fused")] for m in modes if _ok(at.get((v, b, m, "cyb_fused")))]
        mfus = [(r["mfu"], r["mode"]) for r in best if r.get("mfu") is not None]
        if mfus:
            mfu, mode = max(mfus)
            out.append(_check(f"CYB fused MFU >= {MFU_TARGET} ({label}, best: {mode})", mfu, ">=",
                              MFU_TARGET))
        else:
            out.append(_check(f"CYB fused MFU >= {MFU_TARGET} ({label})", None, ">=", MFU_TARGET,
                              "no CYB fused row with an MFU (not on a known GPU?)"))
    return out


def decode_targets(result: dict) -> list[dict]:
    """Checks of a ``cyb bench decode`` result."""
    rows = result.get("results", [])
    at = {(r["impl"], r.get("mode", "fixed"), r["batch"], r["num_steps"]): r for r in rows}
    m = result.get("config", {}).get("num_steps", 4)
    out = []
    impls = [i for i in ("cyb_graph", "cyb_static", "cyb_eager") if any(r["impl"] == i for r in rows)]
    for impl in impls:
        limit = EAGER_LATENCY_RATIO_TARGET if impl == "cyb_eager" else LATENCY_RATIO_TARGET
        big, one = at.get((impl, "fixed", 1, m)), at.get((impl, "fixed", 1, 1))
        if _ok(big) and _ok(one) and big.get("per_real_token_ms") and one.get("per_real_token_ms"):
            out.append(_check(f"{impl}: per-real-token latency M={m} <= {limit} x M=1 (batch 1)",
                              big["per_real_token_ms"] / one["per_real_token_ms"], "<=", limit))
        else:
            out.append(_check(f"{impl}: latency M={m} vs M=1 (batch 1)", None, "<=", limit,
                              "; ".join(_why(n, r) for n, r in (("M", big), ("M=1", one))
                                        if not _ok(r))))
    graph = at.get(("cyb_graph", "fixed", 1, m))
    anchor = result.get("anchor_hf_eager_ms")
    if _ok(graph) and anchor:
        out.append(_check(f"cyb_graph M={m} latency <= {HF_LATENCY_FRACTION} x eager HF anchor "
                          f"({anchor} ms)", graph["per_real_token_ms"] / anchor, "<=",
                          HF_LATENCY_FRACTION))
    hf1 = at.get(("hf_eager", "fixed", 1, 1))
    if _ok(graph) and _ok(hf1):
        out.append(_check(f"cyb_graph M={m} latency <= {HF_LATENCY_FRACTION} x eager HF M=1 "
                          "(same run)", graph["per_real_token_ms"] / hf1["per_real_token_ms"], "<=",
                          HF_LATENCY_FRACTION))
    elif graph is None or not _ok(graph):
        out.append(_check(f"cyb_graph M={m} latency <= {HF_LATENCY_FRACTION} x eager HF", None, "<=",
                          HF_LATENCY_FRACTION, _why("cyb_graph", graph)))
    graph_impl = "cyb_graph" if any(r["impl"] == "cyb_graph" for r in rows) else "cyb_static"
    for r in (result.get("end_to_end") or {}).get("rows") or []:
        if r.get("mode") != "fixed" or r.get("batch") != 1:
            continue
        own = at.get((graph_impl, "fixed", 1, r["num_steps"]))
        label = f"generate decoding tok/s >= {E2E_FRACTION} x the decoder's own (fixed, M={r['num_steps']}, batch 1)"
        if _ok(r) and _ok(own) and r.get("decode_tokens_per_s") and own.get("real_tokens_per_s"):
            out.append(_check(label, r["decode_tokens_per_s"] / own["real_tokens_per_s"], ">=",
                              E2E_FRACTION))
        else:
            out.append(_check(label, None, ">=", E2E_FRACTION,
                              "; ".join(_why(n, x) for n, x in (("generate", r), (graph_impl, own))
                                        if not _ok(x))))
    check = result.get("agreement_fp32")
    if check is not None:
        equal = check.get("equal") if check.get("status") == "ok" else None
        out.append(_check("graph (static) decoder tokens == eager decoder (fp32, left padding, "
                          "fixed and adaptive, greedy and sampled)",
                          equal, "==", True, "" if equal is not None else _why("check", check)))
    return out


def targets_for(result: dict) -> list[dict]:
    """The checks of a result of any kind (none for the loss benchmark)."""
    kind = result_kind(result)
    if kind == "train":
        return train_targets(result)
    if kind == "decode":
        return decode_targets(result)
    return []


def result_kind(result: dict) -> str | None:
    """``"loss"``, ``"train"`` or ``"decode"`` (loss results of :mod:`cyb.bench.loss`
    carry no kind: recognised by their rows)."""
    kind = result.get("kind")
    if kind:
        return kind
    rows = result.get("results") or []
    if rows and "method" in rows[0]:
        return "loss"
    return None


def format_check(c: dict) -> str:
    """``MET / MISSED / N/A  target: value (op threshold)``."""
    state = {True: "MET", False: "MISSED", None: "N/A"}[c["met"]]
    value = c["value"]
    shown = f"{value:.4g}" if isinstance(value, float) else str(value)
    note = f" -- {c['note']}" if c.get("note") else ""
    return f"{state:<6} {c['target']}: {shown} ({c['op']} {c['threshold']}){note}"

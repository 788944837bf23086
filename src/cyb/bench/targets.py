"""The performance targets, checked on a benchmark result (ratios within one run).

Each check is ``{"target", "value", "op", "threshold", "met", "note"}``: ``met`` is True or
False, or None when a row it needs is missing or failed (``note`` says which).

Training (per ``(vocab, batch)`` case and mode): CYB fused tokens/s >= TBYS with Liger,
CYB fused peak memory <= TBYS with Liger; per case, the best CYB fused MFU >= 0.50; and, as
correctness checks, equal first-step losses of two implementations of one loss (CYB fused vs
naive, TBYS with Liger vs the Hugging Face loss: same weights, same batch).
Decode (the engine): from batch 256 up, adaptive decoding with one position per row per step
costs per real token <= 1.15 x E[S] x the M = 1 model's time at the same batch; at batch 1 the
best engine row in adaptive mode <= 1.12 x M = 1; gated pauses decode >= 10 x faster through the
engine's cache than by recomputing the row; the offline job of mixed prompts >= 1.5 x the
previous release's static batches of the same memory; the engine's tokens equal to the eager
decoders' (float32).
"""

from __future__ import annotations

MFU_TARGET = 0.50
ADAPTIVE_RATIO = 1.15
ADAPTIVE_MIN_BATCH = 256
BATCH1_RATIO = 1.12
GATED_SPEEDUP = 10.0
OFFLINE_SPEEDUP = 1.5
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
    """Checks of a ``cyb bench decode`` result: the engine's goals (module docstring)."""
    rows = [r for r in result.get("results", []) if _ok(r) and r.get("ms_per_token")]
    out = []
    base = {r["batch"]: r for r in rows if r["num_steps"] == 1 and r["impl"] == "engine_one"}
    for r in rows:
        if r["mode"] != "adaptive" or not r["impl"].startswith("engine") or r["batch"] not in base:
            continue
        one = base[r["batch"]]["ms_per_token"]
        if r["batch"] >= ADAPTIVE_MIN_BATCH and r["impl"] == "engine_one":
            out.append(_check(f"engine_one {r['visibility']} B={r['batch']} dk share {r['pause_fraction']}: "
                              f"ms/token <= {ADAPTIVE_RATIO} x E[S] ({r['steps_per_token']:.2f}) x M=1",
                              r["ms_per_token"] / (r["steps_per_token"] * one), "<=", ADAPTIVE_RATIO))
    for (vis, frac), group in _by(rows, lambda r: (r["visibility"], r["pause_fraction"])).items():
        engines = [r for r in group if r["batch"] == 1 and r["mode"] == "adaptive" and r["impl"].startswith("engine")]
        if engines and 1 in base:
            best = min(engines, key=lambda r: r["ms_per_token"])
            out.append(_check(f"adaptive {vis} B=1 dk share {frac}: best engine ({best['impl']}) <= "
                              f"{BATCH1_RATIO} x M=1", best["ms_per_token"] / base[1]["ms_per_token"], "<=",
                              BATCH1_RATIO))
    for r in rows:
        if r["visibility"] == "gated" and r["impl"] == "engine_one" and r["mode"] == "adaptive":
            twin = next((x for x in rows if x["impl"] == "eager_pos" and x["visibility"] == "gated"
                         and x["batch"] == r["batch"] and x["pause_fraction"] == r["pause_fraction"]), None)
            if twin is not None:
                out.append(_check(f"gated B={r['batch']}: the engine's cache >= {GATED_SPEEDUP} x the recompute "
                                  f"decoder ({r['new_tokens']} tokens)", twin["ms_per_token"] / r["ms_per_token"],
                                  ">=", GATED_SPEEDUP))
    for job in result.get("offline") or []:
        if "speedup_vs_static_batches" in job:
            out.append(_check(f"offline job ({job['prompts']} prompts, {job['visibility']}): engine >= "
                              f"{OFFLINE_SPEEDUP} x static batches", job["speedup_vs_static_batches"], ">=",
                              OFFLINE_SPEEDUP))
    for name, check in sorted((k, v) for k, v in result.items() if k.startswith("agreement_fp32")):
        equal = check.get("equal") if check.get("status") == "ok" else None
        out.append(_check(f"engine tokens == eager decoder ({name.split(' ', 1)[-1]}, fp32, fixed and adaptive, "
                          "greedy)", equal, "==", True, "" if equal is not None else _why("check", check)))
    return out


def _by(rows, key) -> dict:
    groups: dict = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return groups


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

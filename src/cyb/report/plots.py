"""Figures as PNG files (the only module of the package that imports matplotlib; Agg backend).

Every function takes JSON-ready summaries (as written to ``metrics.json``), so a figure can be
redrawn from saved results without the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..files import save_atomic  # noqa: E402

BLUE = "#3b75af"  # per-token expected pauses (paper Fig. 6, blue)
PURPLE = "#7b4fa0"  # mean stop distribution (paper Fig. 6, purple)
DPI = 120


def _method_style(name: str) -> tuple[str, str]:
    """Colour and line style of a method: dotted without pauses, dashed without dk."""
    from ..methods import spec

    s = spec(name)
    return s.colour, ("-" if s.has_dk else "--" if s.uses_pauses else ":")


def _save(fig, path: str | Path) -> Path:
    try:
        return save_atomic(path, lambda tmp: fig.savefig(tmp, dpi=DPI, bbox_inches="tight"))
    finally:
        plt.close(fig)


def _latency_axes(ax_hist, ax_bars, latency: dict, title: str | None) -> None:
    edges = latency["pauses_hist"]["edges"]
    counts = latency["pauses_hist"]["counts"]
    total = max(sum(counts), 1)
    widths = [b - a for a, b in zip(edges, edges[1:])]
    ax_hist.bar(edges[:-1], [c / total for c in counts], width=widths, align="edge",
                color=BLUE, edgecolor="white", linewidth=0.3)
    ax_hist.set_xlabel("expected pauses per token (E[S] - 1)")
    ax_hist.set_ylabel("fraction of tokens")
    ax_hist.set_xlim(edges[0], edges[-1] if edges[-1] > edges[0] else edges[0] + 1)
    stop = latency["stop_dist"]
    ax_bars.bar(range(len(stop)), stop, color=PURPLE, width=0.7)
    ax_bars.set_xticks(range(len(stop)))
    ax_bars.set_xlabel("pauses before readout (S - 1)")
    ax_bars.set_ylabel("Pr(S), mean over tokens")
    ax_bars.set_ylim(0, 1)
    if title:
        ax_hist.set_title(title, fontsize=10, loc="left")


def latency_figure(latency: dict, path: str | Path, *, title: str | None = None) -> Path:
    """Paper Fig. 6 for one model: histogram of per-token expected pauses (blue) and the stop
    distribution averaged over tokens (purple).  ``latency`` as from
    :func:`cyb.analysis.latency_summary`."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
    _latency_axes(a, b, latency, title)
    fig.tight_layout()
    return _save(fig, path)


def latency_grid(entries: Sequence[tuple[str, dict]], path: str | Path) -> Path:
    """Fig. 6 for several models: one column per ``(name, latency)``, histogram above bars."""
    if not entries:
        raise ValueError("latency_grid needs at least one (name, latency) entry")
    n = len(entries)
    fig, axes = plt.subplots(2, n, figsize=(3.4 * n, 5.2), squeeze=False)
    for j, (name, lat) in enumerate(entries):
        _latency_axes(axes[0][j], axes[1][j], lat, name)
    fig.tight_layout()
    return _save(fig, path)


def calibration_figure(steps: Sequence[dict], path: str | Path, *, title: str | None = None) -> Path:
    """Appendix E: one density map per step ``i < M`` of ``d_i`` (ordinate) against
    ``t_{i+1} - t_i`` (abscissa), log-scaled counts, with Spearman's rho in the title.
    ``steps`` as from :func:`cyb.analysis.calibration`."""
    import numpy as np
    from matplotlib.colors import LogNorm

    n = max(len(steps), 1)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.3), squeeze=False)
    for ax, st in zip(axes[0], steps):
        dens = st["density"]
        counts = np.asarray(dens["counts"], dtype=float).T  # rows: d_i bins
        masked = np.ma.masked_where(counts <= 0, counts)
        vmax = max(float(counts.max()), 1.0)
        mesh = ax.pcolormesh(dens["x_edges"], dens["y_edges"], masked, cmap="viridis",
                             norm=LogNorm(vmin=1, vmax=max(vmax, 1.0 + 1e-9)), shading="flat")
        rho = st.get("spearman")
        rho_txt = "n/a" if rho is None or rho != rho else f"{rho:.3f}"
        ax.set_title(f"step {st['step']}: Spearman {rho_txt}", fontsize=9)
        ax.set_xlabel(f"t_{st['step'] + 1} - t_{st['step']}")
        ax.set_ylabel(f"d_{st['step']}")
        fig.colorbar(mesh, ax=ax, label="tokens")
    if not steps:
        axes[0][0].text(0.5, 0.5, "M = 1: no step to compare", ha="center", va="center")
        axes[0][0].set_axis_off()
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def training_curves(series: Sequence[tuple[str, dict]], path: str | Path) -> Path:
    """Loss against optimiser step for several runs: ``series`` of ``(name, {"train": [(step,
    loss)], "valid": [(step, loss)]})``; two panels (train, held-out)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, curves in series:
        for ax, split in zip(axes, ("train", "valid")):
            pts = curves.get(split) or []
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=name, marker="o" if len(pts) < 12 else None, markersize=3)
    if all(len(curves.get("valid") or []) < 2 for _, curves in series):
        axes[1].text(0.5, 0.04, "held-out loss evaluated once per run (train.eval_every = 0 or a short run):\n"
                     "see the table for the final values", transform=axes[1].transAxes, ha="center",
                     va="bottom", fontsize=7, color="#555555")
    for ax, what in zip(axes, ("training loss", "held-out loss")):
        ax.set_xlabel("step")
        ax.set_ylabel(f"{what} (nats per real token)")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def perplexity_bars(rows: Sequence[tuple[str, float]], path: str | Path, *, reference: str | None = None) -> Path:
    """Perplexity per run as horizontal bars from 0 (paper Fig. 2 style), each labelled with its
    value; the reference is hatched."""
    names = [r[0] for r in rows]
    vals = [r[1] for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 0.45 * len(rows) + 1.2))
    bars = ax.barh(range(len(rows)), vals, color=BLUE)
    for bar, name in zip(bars, names):
        if name == reference:
            bar.set_facecolor("#999999")
            bar.set_edgecolor("white")
            bar.set_hatch("//")
    ax.set_yticks(range(len(rows)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("perplexity (lower is better)")
    finite = [v for v in vals if v == v and v != float("inf")]
    if finite:
        ax.set_xlim(0.0, max(finite) * 1.15)
    for i, v in enumerate(vals):
        if v == v and v != float("inf"):
            ax.text(v, i, f" {v:.4g}", va="center", fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def steps_per_position_figure(metrics: dict, path: str | Path) -> Path:
    """PNG: mean steps per answer position for each method (E[S] for CYB; M for TBYS; 1 for
    the baseline), with each method's accuracy at that position on a second panel (the demo's
    ``metrics.json``)."""
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(6.4, 6.0), sharex=True)
    labels = None
    for name, r in metrics["methods"].items():
        steps, acc = r["per_position_steps"], r["per_position_accuracy"]
        x = list(range(1, len(steps) + 1))
        labels = [str(k) for k in x[:-1]] + ["eos"]
        color, ls = _method_style(name)
        ax.plot(x, steps, ls, color=color, marker="o", label=name)
        ax2.plot(x, acc, ls, color=color, marker="o", label=name)
    m = max(r["num_steps"] for r in metrics["methods"].values())
    ax.set_ylim(0.8, m + 0.2)
    ax.set_ylabel("mean steps per token (E[S])")
    size = ", ".join(f"{k}={v}" for k, v in metrics["task_kwargs"].items())
    ax.set_title(f"{metrics['task']} ({size}): steps per answer position")
    ax.grid(alpha=0.3)
    ax2.set_ylim(-0.02, 1.02)
    ax2.set_ylabel("token accuracy")
    ax2.set_xlabel("answer position")
    ax2.grid(alpha=0.3)
    if labels:
        ax2.set_xticks(range(1, len(labels) + 1), labels)
    # one legend below both panels: inside a panel it covered lines that run near the top (TBYS at M)
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 4), frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return _save(fig, path)


def visibility_masks(path: str | Path, masks: dict, labels: Sequence[str]) -> Path:
    """Attention masks side by side: ``masks`` maps a title to a ``[T, T]`` boolean nested list
    (query rows, key columns), ``labels`` names the ``T`` positions (``x1``, ``p1``, ...)."""
    n = len(masks)
    t = len(labels)
    fig, axes = plt.subplots(1, n, figsize=(3.4 * n, 3.6), squeeze=False)
    for ax, (title, mask) in zip(axes[0], masks.items()):
        ax.imshow([[1.0 if v else 0.0 for v in row] for row in mask], cmap="Blues", vmin=0, vmax=1.25)
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(t), labels, fontsize=7, rotation=90)
        ax.set_yticks(range(t), labels, fontsize=7)
        ax.set_xlabel("key (attended to)", fontsize=8)
        for k in range(1, t):  # block boundaries
            if labels[k].startswith("x"):
                ax.axvline(k - 0.5, color="0.6", linewidth=0.5)
                ax.axhline(k - 0.5, color="0.6", linewidth=0.5)
    axes[0][0].set_ylabel("query (attending)", fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def quality_compute(path: str | Path, panels: dict) -> Path:
    """Held-out perplexity against network forwards per real token, one panel per setting.

    ``panels`` maps a title to points ``{"label", "forwards", "ppl", "ppl_sd" (or None),
    "method", "exact"}``: ``forwards`` is 1 for a baseline, ``M`` for TBYS and fixed-mode
    decoding, ``E[S]`` for CYB decoded adaptively; ``exact`` False marks an ``E[S]`` that
    adaptive decoding does not reach exactly (shared pauses: the contexts differ from
    training's), drawn hollow.
    """
    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.0), squeeze=False)
    for ax, (title, points) in zip(axes[0], panels.items()):
        markers = "osD^vP*Xh"
        for i, p in enumerate(points):
            colour, _ = _method_style(p["method"])
            face = colour if p.get("exact", True) else "white"
            ax.errorbar(p["forwards"], p["ppl"], yerr=p.get("ppl_sd") or None, fmt=markers[i % len(markers)],
                        ms=7, color=colour, mfc=face, capsize=3, label=p["label"])
        ax.legend(fontsize=7, loc="best")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("network forwards per real token")
        ax.set_xlim(0.8, max(p["forwards"] for p in points) + 0.8)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("held-out perplexity")
    fig.tight_layout()
    return _save(fig, path)

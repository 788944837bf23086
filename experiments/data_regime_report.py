"""The data-regime study's report: held-out perplexity per regime (the paper's figure), the
data-efficiency factors, the convergence table, and which cells need a third seed.

    python experiments/data_regime_report.py results/experiments/data-regime   # tables.md, data_regime.png
    python experiments/data_regime_report.py results/experiments/data-regime --keep data-regime.tar.gz --doc

Reads the finished cells of ``summary.jsonl`` (``experiments/data_regime.py``).  The factors are
read by interpolation in log data between a curve's regimes of one pass (1x1, 1x2, 1x3; the data
share of each as its run measured it, by characters):

* **share of the data a CYB row needs to match a reference at 1x3**: where the row's curve
  crosses the reference's 1x3 perplexity (the paper: 33% against the baseline, under 66%
  against TBYS 3).  Outside the curve it is a bound (below 1x1's share, above 1x3's).
* **baseline-equivalent data**: where the baseline's curve reaches the row's perplexity at a
  regime, over the row's own share (the paper's 33% is 3x at 1x1).

Each seed is read against the same seed of the reference (the same third, the same order), then
summarised over the seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:  # run as a script: the repository root holds experiments/
    sys.path.insert(0, REPO_ROOT)

from experiments import data_regime_cells as dc  # noqa: E402

#: The paper's one fine-tuning regime (Gemma1-2B on C4, its table of fine-tuning results); its
#: data-regime figure prints no numbers, only the reading "33%" and "less than 66%".
PAPER = {"base": 12.173, "base4x": 11.953, "tbys": 11.983, "cyb": 11.657}
PAPER_READING = {"base": "33%", "tbys": "< 66%"}


@dataclass(frozen=True)
class Result:
    """One finished cell."""

    row: str
    regime: str
    seed: int
    ppl: float
    share: float  # of the training text's characters read (1.0: all)
    mean_steps: float | None  # E[S] on the held-out rows (CYB), else None
    decode_positions: float | None  # positions per token decoding held-out prompts through the engine
    steps: int
    command: str


def load(folder: Path) -> list[Result]:
    """The finished cells in ``folder/summary.jsonl`` (the newest finished row of each name)."""
    path = Path(folder) / "summary.jsonl"
    rows = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        r = json.loads(line) if line.strip() else {}
        if "final" in r and r.get("returncode", 0) == 0 and dc.parse(r.get("name", "")):
            rows[r["name"]] = r
    out = []
    for name, r in rows.items():
        row, regime, seed = dc.parse(name)
        state = r.get("training_state") or {}
        share = (state.get("data_fraction") or {}).get("share", dc.share(regime))
        out.append(Result(row, regime, seed, float(r["final"]["ppl"]), float(share), r["final"].get("mean_steps"),
                          (r.get("decode") or {}).get("positions_per_token"), int(r["final"].get("step", 0)),
                          r.get("command", "")))
    return sorted(out, key=lambda x: (x.row, x.regime, x.seed))


Cells = dict[tuple[str, str], dict[int, Result]]


def cells_of(results: list[Result]) -> Cells:
    """``{(row, regime): {seed: result}}``."""
    cells: Cells = {}
    for r in results:
        cells.setdefault((r.row, r.regime), {})[r.seed] = r
    return cells


def mean_ppl(cells: Cells, row: str, regime: str) -> float | None:
    seeds = cells.get((row, regime))
    return statistics.fmean(r.ppl for r in seeds.values()) if seeds else None


# ----------------------------------------------------------------------------- interpolation


@dataclass(frozen=True)
class Reading:
    """A share read off a curve: ``value``, or a bound (``"<"`` or ``">"`` ``value``) where the
    target lies outside the curve."""

    value: float
    bound: str = ""

    def text(self, times: bool = False) -> str:
        v = f"{self.value:.2f}x" if times else f"{100 * self.value:.0f}%"
        return f"{self.bound} {v}" if self.bound else v


def crossing(curve: list[tuple[float, float]], target: float) -> Reading | None:
    """The data share at which a curve of ``(share, ppl)`` points (one per regime of one pass)
    first reaches perplexity ``target``, linear in log share between its neighbours; a bound
    outside the curve (``<`` its smallest share: reached already there; ``>`` its largest: not
    reached); None for an empty curve."""
    pts = sorted(curve)
    if not pts:
        return None
    if pts[0][1] <= target:
        return Reading(pts[0][0], "<" if pts[0][1] < target else "")
    for (x0, p0), (x1, p1) in zip(pts, pts[1:]):
        if p1 <= target:
            t = (p0 - target) / (p0 - p1)
            return Reading(math.exp(math.log(x0) + t * (math.log(x1) - math.log(x0))))
    return Reading(pts[-1][0], ">")


def curve(cells: Cells, row: str, seed: int) -> list[tuple[float, float]]:
    """A row's ``(share, ppl)`` points of one pass (1x1, 1x2, 1x3) for one seed."""
    return [(c[seed].share, c[seed].ppl) for regime in dc.FIGURE if dc.regime(regime)[0] == 1
            and (c := cells.get((row, regime))) and seed in c]


def share_to_match(cells: Cells, row: str, reference: str) -> dict[int, Reading]:
    """Per seed: the share of the data ``row`` needs to match ``reference`` at 1x3 (the same
    seed's)."""
    ref = cells.get((reference, "1x3"), {})
    out = {}
    for seed, r in sorted(ref.items()):
        reading = crossing(curve(cells, row, seed), r.ppl)
        if reading is not None and len(curve(cells, row, seed)) == 3:
            out[seed] = reading
    return out


def baseline_equivalent(cells: Cells, row: str, regime: str) -> dict[int, Reading]:
    """Per seed: the data the baseline needs to reach ``row``'s perplexity at ``regime``, in
    multiples of the share ``row`` read there."""
    out = {}
    for seed, r in sorted(cells.get((row, regime), {}).items()):
        base = curve(cells, dc.BASELINE, seed)
        reading = crossing(base, r.ppl) if len(base) == 3 else None
        if reading is not None:
            out[seed] = Reading(reading.value / r.share, reading.bound)
    return out


def summary(readings: dict[int, Reading], times: bool = False) -> str:
    """Mean and spread (min-max) over the seeds, the seeds' values after it; bounds as such."""
    if not readings:
        return ""
    each = ", ".join(r.text(times) for _, r in sorted(readings.items()))
    values, bounds = [r.value for r in readings.values()], {r.bound for r in readings.values()}
    seeds = f"({len(values)} seed{'s' * (len(values) > 1)})"
    if bounds in ({"<"}, {">"}):  # every seed outside the curve on the same side: the loosest bound
        return f"{Reading(max(values) if bounds == {'<'} else min(values), bounds.pop()).text(times)} {seeds}"
    if any(bounds) or len(values) == 1:
        return f"{each} {seeds}"
    m, half = statistics.fmean(values), (max(values) - min(values)) / 2
    f = (lambda x: f"{x:.2f}x") if times else (lambda x: f"{100 * x:.0f}%")
    return f"{f(m)} ± {f(half).rstrip('x%')}{'x' if times else '%'} ({each})"


# ----------------------------------------------------------------------------- what to run next


def third_seed(cells: Cells) -> list[tuple[str, str]]:
    """The cells whose two seeds differ by more than a third of the gap being read there: a
    row's gap to the baseline at the same regime (the baseline's: its smallest gap to a row)."""
    need = []
    for (row, regime), seeds in sorted(cells.items()):
        if len(seeds) != 2:
            continue
        a, b = (r.ppl for r in seeds.values())
        base = mean_ppl(cells, dc.BASELINE, regime)
        if base is None:
            continue
        if row == dc.BASELINE:
            gaps = [abs(m - base) for (other, g), _ in cells.items() if g == regime and other != row
                    and (m := mean_ppl(cells, other, g)) is not None]
            if not gaps:
                continue
            gap = min(gaps)
        else:
            gap = abs(mean_ppl(cells, row, regime) - base)
        if abs(a - b) > gap / 3:
            need.append((row, regime))
    return need


def best_cyb(cells: Cells, seeds: list[int]) -> str | None:
    """The CYB row with the lowest mean perplexity at 1x3, once every CYB row has it for every
    one of ``seeds``; None before."""
    means = {}
    for row in (r for r in dc.ROWS if r.cyb):
        done = cells.get((row.key, "1x3"), {})
        if not all(s in done for s in seeds):
            return None
        means[row.key] = statistics.fmean(done[s].ppl for s in seeds)
    return min(means, key=means.get) if means else None


def convergence_regimes(cells: Cells, row: str, seeds: list[int]) -> list[str]:
    """The convergence regimes to run for ``row``: 2x3 and 3x3, then one more pass each time the
    last one finished (every seed) and improved on the one before, up to :data:`MAX_PASSES`."""
    regimes = [dc.convergence(2), dc.convergence(3)]
    for passes in range(3, dc.MAX_PASSES):
        last = [cells.get((row, dc.convergence(p)), {}) for p in (passes - 1, passes)]
        if not all(s in c for c in last for s in seeds):
            break
        before, now = (statistics.fmean(c[s].ppl for s in seeds) for c in last)
        if now >= before:
            break
        regimes.append(dc.convergence(passes + 1))
    return regimes


# ----------------------------------------------------------------------------- tables


def _cell_text(cells: Cells, row: str, regime: str) -> str:
    seeds = cells.get((row, regime))
    if not seeds:
        return ""
    ppl = [r.ppl for r in seeds.values()]
    if len(ppl) == 1:
        return f"{ppl[0]:.2f} (1 seed)"
    return f"{statistics.fmean(ppl):.2f} ± {(max(ppl) - min(ppl)) / 2:.2f}"


def _decode_positions(cells: Cells, row: dc.Row) -> str:
    """Positions per token decoding through the engine at 1x3 (``experiments/text_decoding.py``:
    the mean over seeds), else what the method fixes (a baseline 1, TBYS M), else CYB's
    teacher-forced E[S], marked."""
    at = [r for (k, g), seeds in cells.items() if k == row.key and g == "1x3" for r in seeds.values()]
    measured = [r.decode_positions for r in at if r.decode_positions is not None]
    if measured:
        return f"{statistics.fmean(measured):.2f}"
    if row.method["name"] in ("baseline", "baseline_nx"):
        return "1"
    if row.method["name"] == "tbys":
        return str(row.method["num_steps"])
    es = [r.mean_steps for r in at if r.mean_steps]
    return f"{statistics.fmean(es):.2f} (E[S], teacher-forced)" if es else ""


def figure_table(cells: Cells) -> str:
    """Held-out perplexity per row and regime (mean ± half the seeds' range), the paper's
    number, the cost of each row and its command."""
    head = ("| row | " + " | ".join(dc.FIGURE) + " | paper (Gemma1-2B, one regime) | training positions per "
            "real token | forwards per step | decode positions per token (the engine, at 1x3) | command |")
    lines = [head, "|---|" + "---:|" * (len(dc.FIGURE) + 4) + "---|"]
    for row in dc.ROWS:
        if not any(k == row.key for k, _ in cells):
            continue
        positions = "1" if row.method["name"] in ("baseline", "baseline_nx") else str(row.method["num_steps"])
        forwards = "1" if row.method["name"] == "baseline" else "4"
        command = f"`python experiments/data_regime.py run --rows {row.key} --seeds 0,1 --out outputs/data-regime`"
        lines.append(f"| {row.label} | " + " | ".join(_cell_text(cells, row.key, g) for g in dc.FIGURE)
                     + f" | {PAPER.get(row.key, '')} | {positions} | {forwards} | {_decode_positions(cells, row)}"
                     + f" | {command} |")
    return "\n".join(lines)


def factor_table(cells: Cells) -> str:
    """The data-efficiency factors of each CYB row, per seed and summarised."""
    lines = ["| row | share of the data to match the baseline at 1x3 (paper: 33%) | share to match TBYS 3 at 1x3 "
             "(paper: < 66%) | baseline-equivalent data at 1x1 | at 1x2 |", "|---|---|---|---|---|"]
    for row in (r for r in dc.ROWS if r.cyb):
        base, tbys = share_to_match(cells, row.key, dc.BASELINE), share_to_match(cells, row.key, dc.TBYS)
        eq1, eq2 = (baseline_equivalent(cells, row.key, g) for g in ("1x1", "1x2"))
        if base or tbys or eq1 or eq2:
            lines.append(f"| {row.label} | {summary(base)} | {summary(tbys)} | {summary(eq1, True)} | "
                         f"{summary(eq2, True)} |")
    return "\n".join(lines)


def convergence_table(cells: Cells, seeds: list[int]) -> str:
    """Each convergence row's perplexity past 1x3, its best and where, and whether the gap at
    the rows' own bests is larger, the same or smaller than at 1x3 (by seed: larger or smaller
    only where every seed says so)."""
    best = best_cyb(cells, seeds)
    rows = [dc.BASELINE] + ([best] if best else [])
    regimes = ["1x3"] + [dc.convergence(p) for p in range(2, dc.MAX_PASSES + 1)
                         if any((k, dc.convergence(p)) in cells for k in rows)]
    lines = ["| row | " + " | ".join(regimes) + " | best | at |", "|---|" + "---:|" * (len(regimes) + 1) + "---|"]
    at = {}
    for key in rows:
        means = {g: m for g in regimes if (m := mean_ppl(cells, key, g)) is not None}
        if not means:
            continue
        at[key] = min(means, key=means.get)
        lines.append(f"| {dc.BY_KEY[key].label} | " + " | ".join(_cell_text(cells, key, g) for g in regimes)
                     + f" | {means[at[key]]:.2f} | {at[key]} |")
    if best and len(at) == 2:
        lines.append("")
        lines.append(gap_verdict(cells, best, at[dc.BASELINE], at[best], seeds))
    return "\n".join(lines)


def gap_verdict(cells: Cells, row: str, base_best: str, row_best: str, seeds: list[int]) -> str:
    """The gap (baseline over ``row``, relative) at 1x3 and at each one's best, per seed."""
    def gap(g_base, g_row, s):
        b, r = cells[(dc.BASELINE, g_base)][s].ppl, cells[(row, g_row)][s].ppl
        return (b - r) / b

    pairs = [(gap("1x3", "1x3", s), gap(base_best, row_best, s)) for s in seeds
             if all(s in cells.get(k, {}) for k in ((dc.BASELINE, "1x3"), (row, "1x3"), (dc.BASELINE, base_best),
                                                      (row, row_best)))]
    if not pairs:
        return ""
    moved = [b - a for a, b in pairs]
    verdict = ("larger" if min(moved) > 0 else "smaller" if max(moved) < 0 else "the same (the seeds disagree on "
               "the sign)")
    return (f"Gap to the baseline at 1x3: {', '.join(f'{100 * a:+.2f}%' for a, _ in pairs)}; at each row's best "
            f"(baseline {base_best}, {dc.BY_KEY[row].label} {row_best}): {', '.join(f'{100 * b:+.2f}%' for _, b in pairs)}"
            f" (seeds {', '.join(map(str, seeds[:len(pairs)]))}): {verdict} at the best.")


#: The record page whose ``<!-- table:NAME -->`` markers :func:`tables` fill (``--doc``).
DOC = Path(REPO_ROOT) / "docs" / "record" / "results" / "data-regime.md"


def tables(folder: Path, seeds: list[int]) -> dict[str, str]:
    """The study's tables by marker name: the figure's, the factors, convergence, third seeds."""
    cells = cells_of(load(folder))
    return {"data-regime": figure_table(cells), "data-regime-factors": factor_table(cells),
            "data-regime-convergence": convergence_table(cells, seeds),
            "data-regime-third-seeds": ", ".join(f"{row} {regime}" for row, regime in third_seed(cells)) or "none"}


def report(folder: Path, seeds: list[int]) -> str:
    """``tables.md`` of the study: the figure's table, the factors, convergence, what is missing."""
    t = tables(folder, seeds)
    parts = ["## Held-out perplexity per regime", t["data-regime"], "## Data-efficiency factors",
             t["data-regime-factors"], "## Convergence", t["data-regime-convergence"],
             "## Cells that need a third seed", t["data-regime-third-seeds"]]
    return "\n\n".join(parts) + "\n"


def figure(folder: Path, target: Path, seeds: list[int]) -> Path:
    """The paper's layout: held-out perplexity per regime, one line per row (the seeds' range as
    bars), each row's 1x3 level dashed (Baseline 4xseq: its 1x1, as the paper draws it); beside
    it the convergence runs against passes over the whole set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = cells_of(load(folder))
    fig, (ax, conv) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    for i, row in enumerate(dc.ROWS):
        xs, ys, lo, hi = [], [], [], []
        for x, g in enumerate(dc.FIGURE):
            ppl = [r.ppl for r in cells.get((row.key, g), {}).values()]
            if ppl:
                m = statistics.fmean(ppl)
                xs.append(x), ys.append(m), lo.append(m - min(ppl)), hi.append(max(ppl) - m)
        if not xs:
            continue
        colour = f"C{i}"
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", color=colour, label=row.label, capsize=3,
                    linestyle="none" if row.key == "base4x" else "-")
        level = mean_ppl(cells, row.key, "1x1" if row.key == "base4x" else "1x3")
        if level is not None:
            ax.axhline(level, color=colour, linestyle="--", linewidth=0.8)
    ax.set_xticks(range(len(dc.FIGURE)), dc.FIGURE)
    ax.set_xlabel("data regime (passes x thirds of techdocs)")
    ax.set_ylabel("held-out perplexity")
    ax.set_title("SmolLM2-135M fine-tuned on techdocs")
    ax.legend(fontsize=8)
    best = best_cyb(cells, seeds)
    passes = set()
    for key in [dc.BASELINE] + ([best] if best else []):
        pts = sorted((dc.regime(g)[0], mean_ppl(cells, key, g)) for k, g in cells
                     if k == key and dc.regime(g)[1] == 3)
        if pts:
            conv.plot(*zip(*pts), marker="o", color=f"C{[r.key for r in dc.ROWS].index(key)}",
                      label=dc.BY_KEY[key].label)
            passes |= {p for p, _ in pts}
    conv.set_xticks(sorted(passes), [dc.convergence(p) for p in sorted(passes)])
    conv.set_xlabel("passes over the whole set")
    conv.set_title("convergence")
    conv.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(target, dpi=120)
    plt.close(fig)
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="the study's results (summary.jsonl), e.g. results/experiments/data-regime")
    p.add_argument("--seeds", default="0,1", help="the seeds every cell has (comma-separated)")
    p.add_argument("--keep", nargs="+", type=Path, default=(), metavar="PACK",
                   help="first fold these packs (the .tar.gz a GPU call returned) into the folder")
    p.add_argument("--doc", type=Path, default=None, nargs="?", const=DOC,
                   help=f"also put the tables between their markers in this page (default {DOC.relative_to(REPO_ROOT)})")
    args = p.parse_args(argv)
    seeds = [int(x) for x in args.seeds.split(",")]
    if args.keep:
        from experiments import keep_pack

        for pack in args.keep:
            with keep_pack.unpacked(pack) as folder:
                print(f"{pack}: {keep_pack.fold(folder, args.folder)} finished cells kept in {args.folder}")
    text = report(args.folder, seeds)
    (args.folder / "tables.md").write_text(text)
    if load(args.folder):
        figure(args.folder, args.folder / "data_regime.png", seeds)
    if args.doc is not None:
        from experiments.make_results import fill_tables

        fill_tables(args.doc, tables(args.folder, seeds))
    print(text)
    print(f"wrote {args.folder / 'tables.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

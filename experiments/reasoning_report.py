"""The table and the figure of the reasoning-gym suite from its ``summary.jsonl``.

    python experiments/reasoning_report.py outputs/reasoning      # or results/experiments/reasoning

Writes ``tables.md`` (one table per task: each row's exact share and mean verifier score, mean
and standard deviation over seeds, every seed, its gain over the baseline in points, the
questions it gains and loses against the baseline with an exact sign test, steps per
answer token, the exact share with the pauses removed or all taken at inference
(``RUN/eval/ablations.json``), the measured decode time per answer alone on its GPU
(``RUN/eval/timing.json`` of ``experiments/reasoning_timing.py``), that time over the one of
the models without pauses (the baselines) timed on the same task and the same kind of GPU
(times from different cards are never compared), the cards, the time as ``cyb eval`` took it
beside the suite's other runs, and the command) and ``score_time.png`` (exact share against
that time ratio, one point per run timed alone, one panel per task) into the folder.  The
pilot's choice (``reasoning-choice.json``) heads the tables.  For the kept results
(``results/experiments/reasoning``) it also writes the compact summary (exact share, gain,
decode time alone, per row and task) and the answers read out at a fixed step into
docs/record/results/reasoning.md, between ``<!-- table:reasoning -->`` (``reasoning-ablations``) and
``<!-- end table -->``.
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
import sys
from pathlib import Path

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:  # run as a script: the repository root holds experiments/
    sys.path.insert(0, REPO_ROOT)

RESULTS = Path(REPO_ROOT) / "results" / "experiments" / "reasoning"


def load(folder: Path) -> list[dict]:
    """The finished rows of the ``reasoning`` suite that carry the verifier's scores (the newest
    row per run)."""
    rows: dict[str, dict] = {}
    for line in (Path(folder) / "summary.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if r.get("reasoning_gym") and r["name"].startswith("rg-"):
                rows[r["name"]] = r
    for name, r in rows.items():  # the decode time measured alone (experiments/reasoning_timing.py)
        for key in ("timing", "ablations"):  # experiments/reasoning_timing.py
            f = Path(folder) / name / "eval" / f"{key}.json"
            if f.is_file():
                r[key] = json.loads(f.read_text())
        answers = _answers(Path(folder) / name / "eval")
        if answers is not None:
            r["answers"] = answers
    return list(rows.values())


def _answers(eval_dir: Path) -> dict[int, bool] | None:
    """Question index -> answered exactly, from the run's ``reasoning_gym.jsonl`` (gzipped where
    kept in the repository); None when neither is there."""
    for path, opener in ((eval_dir / "reasoning_gym.jsonl", open), (eval_dir / "reasoning_gym.jsonl.gz", gzip.open)):
        if path.is_file():
            with opener(path, "rt") as f:
                return {int(r["index"]): bool(r["exact"]) for r in map(json.loads, f) if r}
    return None


def sign_test(gained: int, lost: int) -> float:
    """Two-sided exact sign test (McNemar's exact test) of ``gained`` against ``lost`` answers:
    the probability of a split at least this uneven if either way were equally likely."""
    n = gained + lost
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(gained, lost) + 1)) / 2 ** n)


def paired(runs: list[dict], base: dict[int, dict]) -> str:
    """Questions a row answers exactly where the same seed's baseline does not (+), and the
    reverse (-), summed over the seeds (each seed has its own held-out questions), with the sign
    test's p; empty without the answers."""
    gained = lost = 0
    pairs = [(r["answers"], base[r["seed"]]["answers"]) for r in runs
             if "answers" in r and r["seed"] in base and "answers" in base[r["seed"]]]
    for mine, theirs in pairs:
        gained += sum(ok and not theirs.get(i, False) for i, ok in mine.items())
        lost += sum(theirs.get(i, False) and not ok for i, ok in mine.items())
    if not pairs:
        return ""
    p = sign_test(gained, lost)
    return f"+{gained} / -{lost} (p {'< 0.001' if p < 0.001 else f'{p:.2f}'})"


def _ablation(runs: list[dict], key: str) -> str:
    """Mean and spread of the exact share of an ablation (``RUN/eval/ablations.json``), with how
    many of the row's runs it covers where that is not all of them."""
    values = [r["ablations"][key]["exact"] for r in runs if key in r.get("ablations", {})]
    text = _mean_sd(values).replace(" (1 seed)", "")
    return text + (f" ({len(values)} of {len(runs)})" if values and len(values) < len(runs) else "")


def ablation_table(rows: list[dict], tasks: list[str]) -> str:
    """The pause rows' answers read out three ways on the same runs (those with
    ``RUN/eval/ablations.json``): adaptive / every token at its first step (pauses removed at
    inference) / every token at its last (every pause taken), exact %, means over the runs, whose
    number is in brackets."""
    from experiments import reasoning_suite as rs

    lines = ["| row | " + " | ".join(f"{t}: adaptive / step 1 / step 4" for t in tasks) + " |",
             "|---|" + "---|" * len(tasks)]
    for label, *_ in rs.rows():
        cells = []
        for task in tasks:
            runs = [r for r in rows if _task(r) == task and _label(r) == label
                    and {"without_pauses", "every_pause"} <= set(r.get("ablations", {}))]
            cells.append(" / ".join(f"{100 * statistics.mean(v):.1f}" for v in (
                [r["reasoning_gym"]["exact"] for r in runs], [r["ablations"]["without_pauses"]["exact"] for r in runs],
                [r["ablations"]["every_pause"]["exact"] for r in runs])) + f" ({len(runs)})" if runs else "")
        if any(cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def alone_ms(row: dict) -> float | None:
    """Decode time per answer measured alone on the GPU, in ms (None when not measured)."""
    t = row.get("timing")
    return t["seconds_per_answer"] * 1e3 if t else None


def card(row: dict) -> str | None:
    """The short name of the GPU its time alone was measured on (``H200``), None if not timed."""
    t = row.get("timing")
    return t.get("device", "unknown").replace("NVIDIA ", "").split()[0] if t else None


def no_pause_ms(rows: list[dict]) -> dict[tuple[str, str], float]:
    """(task, card) -> mean time alone of the models without pauses (the baselines, compute-matched
    ones included: the same network decoding the same way) timed on that card."""
    times: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if _label(r).startswith("Baseline") and alone_ms(r) is not None:
            times.setdefault((_task(r), card(r)), []).append(alone_ms(r))
    return {k: statistics.mean(v) for k, v in times.items()}


def time_ratio(row: dict, reference: dict[tuple[str, str], float]) -> float | None:
    """The run's decode time alone over that of the models without pauses on the same task and
    card (:func:`no_pause_ms`); None where either is missing.  Times from different cards are
    never compared."""
    ms, ref = alone_ms(row), reference.get((_task(row), card(row)))
    return ms / ref if ms is not None and ref else None


def _cards(runs: list[dict]) -> str:
    """Which cards timed these runs: ``H200 2, H100 1``."""
    counts: dict[str, int] = {}
    for r in runs:
        if card(r):
            counts[card(r)] = counts.get(card(r), 0) + 1
    return ", ".join(f"{c} {n}" for c, n in counts.items())


def _task(row: dict) -> str:
    return row["reasoning_gym"]["task"].split(":", 1)[-1]


def _label(row: dict) -> str:
    return row["label"].split(" [")[0]


def _mean_sd(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0] * scale:.{digits}f} (1 seed)"
    return f"{statistics.mean(values) * scale:.{digits}f} ± {statistics.stdev(values) * scale:.{digits}f}"


def tables(rows: list[dict]) -> str:
    """One Markdown table per task, rows in the suite's order."""
    from experiments import reasoning_suite as rs

    order = [label for label, *_ in rs.rows()]
    reference = no_pause_ms(rows)
    out = []
    for task in sorted({_task(r) for r in rows}):
        mine = [r for r in rows if _task(r) == task]
        base_rows = {r["seed"]: r for r in mine if _label(r) == "Baseline"}
        base = {seed: r["reasoning_gym"]["exact"] for seed, r in base_rows.items()}
        out.append(f"### {task}\n\n| method | exact % | per seed | vs Baseline (points) | answers vs Baseline | mean score | steps per "
                   "answer token | exact % without pauses at inference | exact % with every pause | ms per answer, alone | "
                   "x a model without pauses (same card) | timed on | ms per answer, beside training | command |\n"
                   "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---|")
        for label in order:
            runs = sorted((r for r in mine if _label(r) == label), key=lambda r: r["seed"])
            if not runs:
                continue
            g = [r["reasoning_gym"] for r in runs]
            exact = [x["exact"] for x in g]
            gain = [r["reasoning_gym"]["exact"] - base[r["seed"]] for r in runs if r["seed"] in base]
            per_seed = ", ".join(f"{100 * x:.1f}%" for x in exact)
            command = runs[0]["command"].replace(f"--seeds {runs[0]['seed']}", "--seeds N").replace(
                f"-s{runs[0]['seed']} ", "-sN ")
            out.append(f"| {label} | {_mean_sd(exact)} | {per_seed} | "
                       f"{'---' if label == 'Baseline' else _mean_sd(gain)} | "
                       f"{'---' if label == 'Baseline' else paired(runs, base_rows)} | "
                       f"{_mean_sd([x['mean_score'] for x in g], 1.0, 3)} | "
                       f"{_mean_sd([x['mean_steps'] for x in g], 1.0, 2)} | "
                       f"{_ablation(runs, 'without_pauses')} | {_ablation(runs, 'every_pause')} | "
                       f"{_mean_sd([alone_ms(r) / 1e3 for r in runs if alone_ms(r) is not None], 1e3, 2)} | "
                       f"{_mean_sd([x for r in runs if (x := time_ratio(r, reference)) is not None], 1.0, 2)} | "
                       f"{_cards(runs)} | "
                       f"{_mean_sd([x['seconds_per_answer'] for x in g], 1e3, 2)} | `{command}` |")
        out.append("")
    return "\n".join(out)


#: The issue's bound on a pause row's decode time: 1.3x the baseline's.
TIME_BOUND = 1.3


def figure(rows: list[dict], path: Path) -> None:
    """Exact share against decode time per answer (over that of the models without pauses timed on
    the same card), one point per run timed alone, a panel per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    tasks = sorted({_task(r) for r in rows})
    labels = sorted({_label(r) for r in rows})
    colours = {label: plt.cm.tab10(i % 10) for i, label in enumerate(labels)}
    markers = {"H200": "o", "H100": "^"}
    reference = no_pause_ms(rows)
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 4.6), squeeze=False)
    untimed = 0
    for ax, task in zip(axes[0], tasks):
        for r in rows:
            if _task(r) != task:
                continue
            ratio = time_ratio(r, reference)
            if ratio is None:
                untimed += 1
                continue
            ax.scatter(ratio, 100 * r["reasoning_gym"]["exact"], s=20, color=colours[_label(r)],
                       marker=markers.get(card(r), "s"), label=_label(r))
        base = [100 * r["reasoning_gym"]["exact"] for r in rows if _task(r) == task and _label(r) == "Baseline"]
        if base:  # the bar a pause row has to clear
            ax.axhline(sum(base) / len(base), color="grey", lw=0.8, ls="--")
        ax.axvline(TIME_BOUND, color="grey", lw=0.8, ls=":")
        ax.set_title(task)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator([0.8, 1, 1.3, 1.6, 2, 2.5, 3]))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%gx"))
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xlabel("decode time per answer alone (256 at once; log),\nx the no-pause models' on the same card")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("exact answers (%)")
    handles = {}
    for ax in axes[0]:
        for h in ax.collections:
            handles.setdefault(h.get_label(), h)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(4, len(handles)), fontsize=8,
                   bbox_to_anchor=(0.5, 0.04))
    fig.text(0.5, 0.01, f"circles: timed on an H200; triangles: on an H100; dashed: the baseline's mean; dotted: "
             f"{TIME_BOUND}x; {untimed} runs not timed alone are not shown", ha="center", fontsize=7.5)
    fig.tight_layout(rect=(0, 0.19, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summary_table(rows: list[dict], tasks: list[str]) -> str:
    """The compact table of docs/record/results/reasoning.md: per row and task the exact share (mean ± sd, seeds),
    the gain over the same seed's baseline with the paired sign test's p (:func:`paired`), and the
    decode time per answer measured alone (ms, and x that of the models without pauses on the same
    task and card, :func:`time_ratio`), rows in the suite's order."""
    from experiments import reasoning_suite as rs

    reference = no_pause_ms(rows)

    def mean(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.mean(values) if values else None

    lines = ["| row | " + " | ".join(f"{t}: exact %, gain (points; p), ms per answer alone" for t in tasks) + " |",
             "|---|" + "---|" * len(tasks)]
    for label, *_ in rs.rows():
        cells = []
        for task in tasks:
            mine = [r for r in rows if _task(r) == task]
            runs = sorted((r for r in mine if _label(r) == label), key=lambda r: r["seed"])
            if not runs:
                cells.append("")
                continue
            base = {r["seed"]: r for r in mine if _label(r) == "Baseline"}
            exact = _mean_sd([r["reasoning_gym"]["exact"] for r in runs]).replace(" (1 seed)", "")
            cell = f"{exact} ({len(runs)})"
            if label != "Baseline":
                gain = [r["reasoning_gym"]["exact"] - base[r["seed"]]["reasoning_gym"]["exact"]
                        for r in runs if r["seed"] in base]
                text = _mean_sd(gain).replace(" (1 seed)", "")
                test = paired(runs, base)
                cell += f", {text if text.startswith('-') else '+' + text}" if gain else ""
                cell += f" ({test[test.index('(p') + 1:-1]})" if test else ""
            t, ratio = mean([alone_ms(r) for r in runs]), mean([time_ratio(r, reference) for r in runs])
            cell += "; " + (f"{t:.2f} ms" + (f" ({ratio:.2f}x)" if ratio is not None and label != "Baseline" else "")
                            if t is not None else "not timed alone")
            cells.append(cell)
        if any(cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", nargs="?", type=Path, default=Path("outputs/reasoning"),
                   help="the suite's folder, with its summary.jsonl (default: outputs/reasoning)")
    folder = p.parse_args(argv).folder
    if not (folder / "summary.jsonl").is_file():
        print(f"{folder / 'summary.jsonl'} does not exist: give the folder of a reasoning suite "
              "(experiments/run_suite.py reasoning --out FOLDER)", file=sys.stderr)
        return 1
    rows = load(folder)
    if not rows:
        print(f"{folder / 'summary.jsonl'} holds no scored run of the reasoning suite yet", file=sys.stderr)
        return 1
    head = ""
    choice = folder / "reasoning-choice.json"
    if choice.is_file():  # the suite's tasks; the pilot's other candidates are in the heading only
        c = json.loads(choice.read_text())
        head = (f"Pilot ({c['rule']}): chosen {', '.join(c['chosen'])}; baseline exact share per candidate: "
                + ", ".join(f"{t} {100 * x:.1f}%" for t, x in c["exact"].items()) + "\n\n")
        rows = [r for r in rows if _task(r) in c["chosen"]] or rows
    (folder / "tables.md").write_text(head + tables(rows))
    figure(rows, folder / "score_time.png")
    if folder.resolve() == RESULTS.resolve():  # the kept results: docs/record/results/reasoning.md shows their summary
        from experiments.make_results import DOC, fill_tables

        tasks = json.loads(choice.read_text())["chosen"] if choice.is_file() else sorted({_task(r) for r in rows})
        fill_tables(DOC, {"reasoning": summary_table(rows, tasks), "reasoning-ablations": ablation_table(rows, tasks)})
    print(f"wrote {folder / 'tables.md'} and {folder / 'score_time.png'} ({len(rows)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

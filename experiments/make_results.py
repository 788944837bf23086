"""Tables and figures of the record's results pages (docs/record/results/) from the text suites' outputs.

    python experiments/make_results.py [results/experiments/text]
    python experiments/make_results.py results/experiments/smollm2     # or .../visibility, .../recipes,
        # .../smollm2-epoch, .../smollm2-arith, .../stability

Reads ``summary.jsonl`` written by ``experiments/run_suite.py`` (the newest finished row per
run) and writes ``tables.md`` (one Markdown table per suite, mean and standard deviation over
seeds, the command of each row) and ``curves.png`` (held-out perplexity against epochs) into
the same folder, then puts each table into the record page that holds its markers (docs/record/results/)
(``<!-- table:SUITE -->`` and ``<!-- end table -->``); the prose around them is written by hand.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

REPO_ROOT = str(Path(__file__).resolve().parents[1])
if REPO_ROOT not in sys.path:  # run as a script: the repository root holds experiments/ and benchmarks/
    sys.path.insert(0, REPO_ROOT)

HERE = Path(__file__).resolve().parent
DEFAULT = HERE.parent / "results" / "experiments" / "text"
#: The record's results pages: each table goes into the page that holds its markers.
DOC = HERE.parent / "docs" / "record" / "results"
REFERENCE = "TBYS 3 pauses"


def load(folder: Path) -> list[dict]:
    rows: dict[str, dict] = {}
    for line in (folder / "summary.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if "final" in r or r["name"] not in rows:
                rows[r["name"]] = r
    return list(rows.values())


def mean_sd(values: list[float], fmt: str = "{:.1f}", unit: str = "") -> str:
    """``mean ± sd`` over seeds in ``fmt``, ``unit`` after both; one value says so."""
    if not values:
        return ""
    if len(values) == 1:
        return fmt.format(values[0]) + unit + " (1 seed)"
    return f"{fmt.format(statistics.mean(values))} ± {fmt.replace('+', '').format(statistics.stdev(values))}{unit}"


def by_label(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        if "final" in r:
            out.setdefault(r["label"], []).append(r)
    for runs in out.values():
        runs.sort(key=lambda r: r["seed"])
    return out


SCALE = "gpu"  # the suites' scale (scale.json of the folder read)


def command_of(runs: list[dict]) -> str:
    """The command that reruns a row from a fresh clone (``N`` = the seed when several ran)."""
    from experiments.suite_runner import rerun_command

    r = runs[0]
    name, seed = r["name"], r["seed"]
    if len(runs) > 1:
        name, seed = name[: -len(f"-s{seed}")] + "-sN", "N"
    # the scale the suite ran with, and its scratch folder, as its recorded command says (a suite
    # written straight into results/ reruns into outputs/SUITE)
    out, scale = (re.search(rf"--{key} (\S+)", r.get("command", "")) for key in ("out", "scale"))
    out = out.group(1) if out and out.group(1).startswith("outputs/") else None
    return f"`{rerun_command(r['suite'], name, seed, scale.group(1) if scale else SCALE, out)}`"


def paired(groups: dict[str, list[dict]], label: str, reference: str | None) -> str:
    """Relative improvement over ``reference`` of the same seed, (ppl_ref - ppl) / ppl_ref in
    percent as the paper's appendix F, mean ± sd over the seeds both have."""
    if not reference or reference not in groups:
        return ""
    if label == reference:
        return "---"
    ref = {r["seed"]: r["final"]["ppl"] for r in groups[reference]}
    vals = [(ref[r["seed"]] - r["final"]["ppl"]) / ref[r["seed"]] * 100 for r in groups[label] if r["seed"] in ref]
    return mean_sd(vals, "{:+.1f}", "%")


def table(rows: list[dict], references: tuple[str, ...] = (REFERENCE, "Baseline"),
          extra: dict[str, list[dict]] | None = None, order: list[str] | None = None,
          digits: int = 1) -> str:
    """One line per method: held-out perplexity on the in-distribution part of the held-out
    file (mean ± sd over seeds, and per seed), the relative improvement over each of
    ``references`` paired by seed, perplexity on the whole held-out file, E[S] and the stop
    distribution, epochs of training data, training perplexity of the last logged steps and
    the command (``-sN`` = seed N); perplexities with ``digits`` decimals."""
    groups = {**(extra or {}), **by_label(rows)}
    labels = (order or []) + [g for g in groups if g not in (order or [])]  # no row left out
    refs = [r for r in references if r in groups]
    head = ("| method | held-out ppl | per seed | " + " | ".join(f"vs {r}" for r in refs) +
            " | whole-file ppl | E[S] | E[S] spread | stop distribution | epochs | train ppl | command |")
    lines = [head, "|---|---:|---|" + "---:|" * len(refs) + "---:|---:|---:|---|---:|---:|---|"]
    fmt = "{:.%df}" % digits
    for label in labels:
        runs = groups.get(label)
        if not runs:
            continue
        ppl = [r["final"]["ppl"] for r in runs]
        whole = [r["whole_file"]["ppl"] for r in runs if r.get("whole_file")]
        steps = [r["final"]["mean_steps"] for r in runs if r["final"].get("mean_steps") is not None]
        spread = [r["final"]["steps_std"] for r in runs if r["final"].get("steps_std") is not None]
        dists = [r["final"]["stop_dist"] for r in runs if r["final"].get("stop_dist")]
        dist = " / ".join(f"{statistics.mean(col):.2f}" for col in zip(*dists)) if dists else ""
        epochs = [r["final"].get("epoch") for r in runs if r["final"].get("epoch") is not None]
        train = [r["train_ppl"] for r in runs if r.get("train_ppl")]
        lines.append(" | ".join([
            f"| {label}", mean_sd(ppl, fmt), ", ".join(fmt.format(x) for x in ppl),
            *[paired(groups, label, ref) for ref in refs], mean_sd(whole, fmt),
            mean_sd(steps, "{:.2f}") if steps else "", mean_sd(spread, "{:.2f}") if spread else "", dist,
            f"{statistics.mean(epochs):.2f}" if epochs else "", f"{statistics.mean(train):.1f}" if train else "",
            command_of(runs)]) + " |")
    return "\n".join(lines)


def reproduction_table(rows: list[dict], earlier: Path) -> str:
    """Whole-file perplexity of the pretraining runs here and in an earlier job of the same
    configurations (which evaluated only on the whole file)."""
    if not (earlier / "summary.jsonl").is_file():
        return "(no earlier run)"
    before = {r["name"]: r for r in load(earlier)}
    lines = ["| run | whole-file ppl, earlier job | whole-file ppl, this job |", "|---|---:|---:|"]
    for r in sorted((r for r in rows if r["suite"] == "pretrain" and r.get("whole_file")), key=lambda r: r["name"]):
        b = before.get(r["name"], {}).get("final", {}).get("ppl")
        lines.append(f"| {r['name']} | {'' if b is None else f'{b:.2f}'} | {r['whole_file']['ppl']:.2f} |")
    return "\n".join(lines)


def curve_table(rows: list[dict]) -> str:
    """Held-out perplexity at every evaluation of the two-epoch runs."""
    runs = sorted((r for r in rows if r["suite"] == "epochs" and "final" in r), key=lambda r: (r["seed"], r["name"]))
    if not runs:
        return "(not run)"
    steps = [p["step"] for p in runs[0]["curve"] if p["step"]]
    lines = ["| method (seed) | " + " | ".join(f"step {s}" for s in steps) + " |",
             "|---|" + "---:|" * len(steps),
             "| epochs | " + " | ".join(f"{p['epoch']:.2f}" for p in runs[0]["curve"] if p["step"]) + " |"]
    for r in runs:
        vals = {p["step"]: p["ppl"] for p in r["curve"]}
        lines.append(f"| {r['label']} ({r['seed']}) | " + " | ".join(f"{vals[s]:.1f}" if s in vals else "" for s in steps) + " |")
    return "\n".join(lines)


def curves_figure(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    colours = {"Baseline": "tab:gray", "TBYS 3 pauses": "tab:orange", "CYB 3 pauses": "tab:blue"}
    for ax, suite, title in ((axes[0], "pretrain", "one epoch (3 seeds)"), (axes[1], "epochs", "two epochs (seed 0)")):
        for r in rows:
            if r["suite"] != suite or "final" not in r:
                continue
            pts = [(p["epoch"], p["ppl"]) for p in r["curve"] if p["step"] and p["epoch"] is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, color=colours.get(r["label"]), alpha=0.8,
                        label=r["label"] if r["seed"] == min(x["seed"] for x in rows if x["suite"] == suite) else None)
        ax.set_title(f"pretraining, {title}")
        ax.set_xlabel("epochs of techdocs")
        ax.set_yscale("log")
        ax.set_ylim(top=200)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out perplexity (in-distribution part)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_recipes(folder: Path, rows: list[dict]) -> None:
    """The recipe comparison (``run_suite.py recipes``, all of it or a part) into
    docs/record/results/recipes.md, between the markers named after the folder (``recipes``, ``recipes-h100``)."""
    rows = [r for r in rows if r["suite"] == "recipes"]
    labels = list(by_label(rows))
    paper = [g for g in ("Baseline", "TBYS 3 pauses", "CYB 3 pauses") if g in labels]
    order = paper + [g for g in labels if g not in paper]
    references = tuple(g for g in ("CYB 3 pauses", "Baseline", "TBYS 3 pauses") if g in labels)
    tables = {folder.name: table(rows, references=references, order=order)}
    (folder / "tables.md").write_text("".join(f"## {k}\n\n{v}\n\n" for k, v in tables.items()))
    fill_tables(DOC / "recipes.md", tables)
    print(f"wrote {folder / 'tables.md'} and the tables of docs/record/results/recipes.md")


#: the suites with one table each, named after their folder: ``(row order, reference rows,
#: decimals of the perplexities)`` (a pretrained model's gains are small: two decimals)
SUITE_TABLES = {
    "smollm2": (["Baseline", "Baseline 4xseq", "CYB 1 pause, private", "CYB 2 pauses, private",
                 "CYB 3 pauses, private", "CYB 1 pause, shared", "CYB 2 pauses, shared", "CYB 3 pauses, shared",
                 "CYB 3 pauses, gated", "CYB-decoupled 3 pauses, private", "CYB-ponder tau=-0.05, private",
                 "CYB 3 pauses, private, dk prior 0.5", "CYB 3 pauses, private, dk prior 0.99",
                 "CYB-ponder tau=-0.2, private", "CYB-ponder tau=-0.5, private", "TBYS 3 pauses, private",
                 "TBYS 3 pauses, shared", "Baseline, LoRA", "CYB 3 pauses, private, LoRA"],
                ("Baseline", "TBYS 3 pauses, shared", "CYB 3 pauses, shared", "Baseline, LoRA"), 2),
    "smollm2-epoch": (["Baseline", "CYB 3 pauses, private", "CYB 3 pauses, private, pause adapters r16"],
                      ("Baseline",), 2),
    "visibility": (["Pretrained base, not fine-tuned", "Baseline", "TBYS 3 pauses, shared",
                    "TBYS 3 pauses, private", "CYB 3 pauses, shared", "CYB 3 pauses, private"],
                   ("Baseline", "TBYS 3 pauses, shared", "CYB 3 pauses, shared"), 1),
    "stability": (["Baseline", "Baseline, warmup 400", "CYB 3 pauses", "CYB 3 pauses, private",
                   "CYB 3 pauses, warmup 400", "CYB 3 pauses, lr 5e-4"], ("Baseline", "Baseline, warmup 400"), 1),
}


#: the rows drawn in a real-model suite's ``curves.png`` (the others crowd it)
CURVE_ROWS = {
    "smollm2": ["Baseline", "Baseline 4xseq", "CYB 3 pauses, private", "CYB 3 pauses, shared", "CYB 3 pauses, gated",
                "CYB 3 pauses, private, dk prior 0.99", "CYB-ponder tau=-0.2, private", "TBYS 3 pauses, shared"],
    "smollm2-epoch": ["Baseline", "CYB 3 pauses, private", "CYB 3 pauses, private, pause adapters r16"],
}


def real_tokens_curves(folder: Path, rows: list[dict], labels: list[str], path: Path) -> None:
    """Two panels for the rows ``labels`` of ``folder``, mean over seeds: held-out perplexity at
    every evaluation against the real tokens read (tokens per step from each run's
    ``config.yaml``: batch x block_len x seq_multiplier), and the training perplexity's gain over
    the baseline's at the same step, in percent (a running mean of 5 logs; rows that read as many
    tokens per step as the baseline)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import yaml

    groups = by_label(rows)
    curves = {}  # label -> (tokens per step, {split: {step: [ppl per seed]}})
    for label in (x for x in labels if x in groups):
        per_step, splits = 0, {"valid": {}, "train": {}}
        for r in groups[label]:
            run = folder / r["name"]
            cfg = yaml.safe_load((run / "config.yaml").read_text())
            per_step = cfg["train"]["batch_size"] * cfg["data"]["block_len"] * (cfg["method"].get("seq_multiplier") or 1)
            for line in (run / "metrics.jsonl").read_text().splitlines():
                rec = json.loads(line)
                if rec.get("split") in splits and "ppl" in rec:
                    splits[rec["split"]].setdefault(rec["step"], []).append(rec["ppl"])
        curves[label] = (per_step, {k: {step: statistics.mean(v) for step, v in sorted(d.items())}
                                    for k, d in splits.items()})
    fig, (held, gain) = plt.subplots(1, 2, figsize=(12, 4.5))
    base_step, base = curves.get("Baseline", (0, {"train": {}}))
    gains = [0.0]
    for i, (label, (per_step, splits)) in enumerate(curves.items()):
        pts = [(step * per_step / 1e6, ppl) for step, ppl in splits["valid"].items()]
        held.plot(*zip(*pts), marker="o", ms=4, lw=1.2, color=f"C{i}", label=label)
        if label != "Baseline" and per_step == base_step:
            steps = [st for st in splits["train"] if st in base["train"] and st > 0]
            rel = [100 * (base["train"][st] - splits["train"][st]) / base["train"][st] for st in steps]
            smooth = [statistics.mean(rel[max(0, k - 4):k + 1]) for k in range(len(rel))]
            gain.plot([st * per_step / 1e6 for st in steps], smooth, lw=1.2, color=f"C{i}", label=label)
            gains += smooth
    floor = min(min(s["valid"].values()) for _, s in curves.values())
    held.set_ylim(floor * 0.97, floor * 1.3)  # step 0 of shared pauses and TBYS is far above (2,062; 14,451)
    held.set_ylabel("held-out perplexity (in-distribution)")
    gain.axhline(0, color="black", lw=0.8)
    gain.set_ylim(max(min(gains), -15) - 0.5, max(gains) + 0.5)  # a curve below -15% runs off the bottom
    gain.set_ylabel("training perplexity: gain over the baseline (%)")
    for ax in (held, gain):
        ax.set_xlabel("real tokens read (millions)")
        ax.grid(alpha=0.3)
    held.legend(fontsize=8)
    fig.suptitle(f"results/experiments/{folder.name}: mean over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_suite(folder: Path, rows: list[dict]) -> None:
    """The table of ``folder`` (a suite of :data:`SUITE_TABLES`, or ``smollm2-arith``) into its
    ``tables.md`` and docs/record/results/ (marker: the folder's name)."""
    if folder.name == "smollm2-arith":
        text = arithmetic_table(rows)
    else:
        order, references, digits = SUITE_TABLES[folder.name]
        text = table(rows, references=references, order=order, digits=digits)
    tables = {folder.name: text}
    calibration = calibration_table(folder, rows, SUITE_TABLES.get(folder.name, ([],))[0])
    if folder.name in CURVE_ROWS:
        real_tokens_curves(folder, rows, CURVE_ROWS[folder.name], folder / "curves.png")
    if calibration:
        tables[f"{folder.name}-calibration"] = calibration
    (folder / "tables.md").write_text("".join(f"## {k}\n\n{v}\n\n" for k, v in tables.items()))
    fill_tables(DOC, tables)
    print(f"wrote {folder / 'tables.md'} and its table in {DOC}")


def calibration_table(folder: Path, rows: list[dict], order: list[str]) -> str:
    """H2 per step for the runs of ``folder`` that were analysed (``eval/metrics.json`` of
    ``cyb eval``): Spearman's rho of d_i with the next step's gain in log-probability of the
    target, mean ± sd over the seeds analysed, and E[S], rows in ``order`` first; empty when no
    run was."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        metrics = folder / r["name"] / "eval" / "metrics.json"
        if "final" in r and metrics.is_file():
            groups.setdefault(r["label"], []).append(json.loads(metrics.read_text()))
    if not groups:
        return ""
    steps = max(len(m["calibration"]) for runs in groups.values() for m in runs)
    lines = ["| method | seeds | " + " | ".join(f"rho(d_{i}, gain {i}->{i + 1})" for i in range(1, steps + 1))
             + " | E[S] |", "|---|---:|" + "---:|" * (steps + 1)]
    for label in sorted(groups, key=lambda g: order.index(g) if g in order else len(order)):
        runs = groups[label]
        rho = [mean_sd([m["calibration"][i]["spearman"] for m in runs if len(m["calibration"]) > i], "{:.2f}")
               for i in range(steps)]
        es = mean_sd([m["latency"]["mean_steps"] for m in runs], "{:.2f}")
        lines.append(f"| {label} | {len(runs)} | " + " | ".join(rho) + f" | {es} |")
    return "\n".join(lines)


ARITHMETIC_ORDER = ["Baseline", "TBYS 3 pauses, private", "TBYS 3 pauses, shared", "TBYS 3 pauses, gated",
                    "CYB 3 pauses, private", "CYB 3 pauses, shared", "CYB 3 pauses, gated",
                    "CYB-decoupled 3 pauses, private", "CYB-decoupled 3 pauses, gated"]


def arithmetic_table(rows: list[dict]) -> str:
    """One line per method of a task suite (``run_suite.py smollm2-arith``): exact match of the
    teacher-forced greedy answers (mean ± sd over seeds, per seed, and against the baseline of
    the same seed in points), of free-running fixed and adaptive generation, the positions per
    generated token adaptive generation used, E[S] by answer position (the end-of-sequence token
    last), the answers' perplexity, epochs and the command."""
    groups = by_label(rows)
    base = {r["seed"]: r["task"]["teacher_forced"]["exact_match"] for r in groups.get("Baseline", []) if r.get("task")}
    lines = ["| method | exact match | per seed | vs Baseline (points) | fixed generation | adaptive generation "
             "| positions per token | E[S] by answer position | answer ppl | epochs | command |",
             "|---|---:|---|---:|---:|---:|---:|---|---:|---:|---|"]
    pct = lambda values: mean_sd([100 * v for v in values], "{:.1f}", "%")  # noqa: E731
    for label in ARITHMETIC_ORDER + [g for g in groups if g not in ARITHMETIC_ORDER]:
        runs = groups.get(label)
        if not runs:
            continue
        scored = [r for r in runs if r.get("task")]
        exact = [r["task"]["teacher_forced"]["exact_match"] for r in scored]
        gain = [100 * (r["task"]["teacher_forced"]["exact_match"] - base[r["seed"]]) for r in scored
                if r["seed"] in base and label != "Baseline"]
        modes = {m: [r["task"][m]["exact_match"] for r in scored if m in r["task"]] for m in ("fixed", "adaptive")}
        used = [r["task"]["adaptive"]["positions_per_token"] for r in scored if "adaptive" in r["task"]]
        per_position = [r["task"]["teacher_forced"]["per_position_steps"] for r in scored]
        by_position = " / ".join(f"{statistics.mean(col):.2f}" for col in zip(*per_position)) if per_position else ""
        missing = [str(r["seed"]) for r in runs if not r.get("task")]
        seeds = ", ".join([f"{100 * x:.1f}%" for x in exact] + [f"seed {m} not scored" for m in missing])
        lines.append(" | ".join([
            f"| {label}", pct(exact), seeds, "---" if label == "Baseline" else (mean_sd(gain, "{:+.1f}") if gain else ""),
            pct(modes["fixed"]), pct(modes["adaptive"]), mean_sd(used, "{:.2f}") if used else "", by_position,
            mean_sd([r["final"]["ppl"] for r in runs], "{:.3f}"),
            f"{statistics.mean(r['final']['epoch'] for r in runs):.2f}", command_of(runs)]) + " |")
    return "\n".join(lines)


def fill_tables(doc: Path, tables: dict) -> None:
    """Put each table between its markers in ``doc``, a page or a folder of pages (every page
    that holds a table's markers gets it)."""
    for page in sorted(doc.rglob("*.md")) if doc.is_dir() else [doc] if doc.is_file() else []:
        text = page.read_text()
        for key, value in tables.items():
            text = re.sub(rf"(<!-- table:{key} -->\n).*?(?=<!-- end table -->)",
                          lambda m: m.group(1) + value + "\n", text, flags=re.S)
        if text != page.read_text():
            page.write_text(text)


def main(argv: list[str] | None = None) -> None:
    global SCALE
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0]) if args else DEFAULT
    rows = load(folder)
    if (folder / "scale.json").is_file():
        SCALE = json.loads((folder / "scale.json").read_text()).get("scale", "gpu")
    if folder.name.startswith("recipes"):
        return write_recipes(folder, rows)
    if folder.name in SUITE_TABLES or folder.name == "smollm2-arith":
        return write_suite(folder, rows)
    suite = lambda name: [r for r in rows if r["suite"] == name]  # noqa: E731
    ft = suite("finetune")
    cyb3 = [dict(r, label="CYB w=0:0:0:1 (the CYB 3 pauses row above)") for r in ft if r["label"] == "CYB 3 pauses"]
    tables = {
        "pretrain": table(suite("pretrain"), order=["Baseline", "TBYS 3 pauses", "CYB 3 pauses"]),
        "finetune": table(ft, order=["Pretrained base, not fine-tuned", "Baseline", "Baseline 4xseq",
                                              "TBYS 1 pause", "TBYS 2 pauses", "TBYS 3 pauses",
                                              "CYB 1 pause", "CYB 2 pauses", "CYB 3 pauses"]),
        "hparams": table(suite("hparams"), references=(cyb3[0]["label"],) if cyb3 else (),
                                  extra=by_label(cyb3) if cyb3 else None,
                                  order=[cyb3[0]["label"]] + list(by_label(suite("hparams"))) if cyb3 else None),
        "epochs": table(suite("epochs"), order=["Baseline", "TBYS 3 pauses", "CYB 3 pauses"]) + "\n\n" + curve_table(rows),
        "reproduction": reproduction_table(rows, folder.parent / "text-whole-file"),
    }
    (folder / "tables.md").write_text("".join(f"## {k}\n\n{v}\n\n" for k, v in tables.items()))
    fill_tables(DOC, tables)
    curves_figure(rows, folder / "curves.png")
    print(f"wrote {folder / 'tables.md'}, {folder / 'curves.png'} and the tables of {DOC}")


if __name__ == "__main__":
    main()

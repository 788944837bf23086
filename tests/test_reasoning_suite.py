"""The reasoning-gym suites of experiments/run_suite.py (prepared for a GPU run): their rows, the
pilot's choice of tasks, and a CPU smoke test that trains one row of the suite for a few steps on
a tiny model and scores it with the task's verifier, as the GPU job does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from cyb.config import RunConfig  # noqa: E402
from experiments import reasoning_suite as rs  # noqa: E402
from experiments import run_suite, suite_runner  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def jobs(suite: str, seeds=(0, 1, 2), scale="smollm2-reasoning", tasks=("chain_sum", "leg_counting", "gcd"), out=None):
    s = dict(run_suite.SCALES[scale], tasks=list(tasks))
    from pathlib import Path

    return [j for seed in seeds for j in run_suite.suite_jobs(suite, seed, s, {}, Path(out or "outputs/reasoning"))]


def test_the_suite_holds_every_row_three_seeds_and_the_compute_matched_baseline():
    suite = jobs("reasoning")
    assert len(suite) == 3 * 8 * 3 and len({j.name for j in suite}) == len(suite)
    labels = {j.label.split(" [")[0] for j in suite}
    assert labels == {"Baseline", "Baseline, 4x the steps (compute-matched)",
                      "Baseline, 4x the steps and the questions (compute-matched)", "TBYS 3 pauses, private",
                      "CYB 3 pauses, private", "CYB 3 pauses, gated", "CYB-decoupled 3 pauses, private",
                      "CYB 3 pauses, private, pause adapters r16"}
    by_name = {j.name: j for j in suite}
    base, matched = by_name["rg-gcd-baseline-s1"].cfg, by_name["rg-gcd-baseline-4xsteps-s1"].cfg
    assert matched["train"]["steps"] == 4 * base["train"]["steps"] == 2400
    assert matched["data"] == base["data"]  # the same questions, four passes over them
    more = by_name["rg-gcd-baseline-4xdata-s1"].cfg  # four times as many questions, one pass
    assert more["train"]["steps"] == 2400 and more["data"]["num_train_examples"] == 4 * base["data"]["num_train_examples"]
    assert more["data"]["num_valid_examples"] == base["data"]["num_valid_examples"]
    adapters = by_name["rg-chain_sum-cyb-p3-private-adapters16-s2"].cfg
    assert adapters["method"]["pause_adapter_rank"] == 16 and adapters["method"]["pause_visibility"] == "private"
    for j in suite[:7]:  # every row's configuration is one cyb train accepts (the task and its settings too)
        cfg = RunConfig.from_dict(j.cfg).validate()
        assert cfg.data.task == "reasoning-gym:chain_sum" and cfg.data.num_valid_examples == 256
    row = suite_runner.final_row(by_name["rg-gcd-cyb-p3-gated-s1"], Path("outputs/reasoning"),
                              "smollm2-reasoning")
    assert row["command"].endswith("--scale smollm2-reasoning --tasks gcd") and "--only rg-gcd-cyb-p3-gated-s1" in row["command"]
    first = sorted(suite, key=lambda j: -j.priority)  # seed 0 of every row first, the 4x baseline last
    assert {j.seed for j in first[:18]} == {0} and all("-baseline-4x" in j.name for j in first[-18:])
    pilot = jobs("reasoning-pilot", seeds=(0,))
    assert [j.name for j in pilot] == [rs.run_name(t, "baseline", 0) for t in rs.TASKS]
    assert {j.name for j in pilot} & {j.name for j in suite} == {"rg-chain_sum-baseline-s0", "rg-leg_counting-baseline-s0",
                                                                "rg-gcd-baseline-s0"}  # run once


def test_the_pilot_keeps_three_tasks_between_20_and_80_percent(tmp_path):
    scores = {"chain_sum": 0.9, "basic_arithmetic": 0.35, "leg_counting": 0.1, "products": 0.6, "gcd": 0.75,
              "count_bits": 0.5}
    summary = [{"name": rs.run_name(t, "baseline", 0), "reasoning_gym": {"exact": x}} for t, x in scores.items()]
    assert rs.write_choice(tmp_path, summary[:-1]) is None  # not every candidate scored yet
    choice = rs.write_choice(tmp_path, summary)
    assert choice["chosen"] == ["basic_arithmetic", "products", "gcd"]
    assert rs.tasks_of(tmp_path, None) == choice["chosen"] and rs.tasks_of(tmp_path, "gcd") == ["gcd"]
    low = [{"name": rs.run_name(t, "baseline", 0), "reasoning_gym": {"exact": x}}
           for t, x in zip(rs.TASKS, (0.95, 0.5, 0.05, 0.99, 0.0, 0.9))]
    fallback = rs.choose(low)
    assert fallback["chosen"][0] == "basic_arithmetic" and len(fallback["chosen"]) == 3
    assert "only 1 did" in fallback["rule"]
    with pytest.raises(ValueError, match="not candidates"):
        rs.tasks_of(tmp_path, "sudoku")


def test_one_row_trains_on_a_cpu_and_is_scored_by_the_verifier(tmp_path, monkeypatch):
    """The smoke test of the prepared suite: its pause-adapter row on chain_sum at scale
    reasoning-quick, a tiny 'pretrained' model in place of SmolLM2."""
    from cyb.data import reasoning_gym as R
    from cyb.eval import evaluate
    from cyb.train import train
    from test_reasoning_gym import tiny_pretrained

    docs = [R.prompt_of(e) + R.completion_of(e)
            for e in R.draw_entries("reasoning-gym:chain_sum", rs.TASKS["chain_sum"], 200, 0, "train")]
    model, _ = tiny_pretrained(tmp_path, docs)
    monkeypatch.setenv("CYB_SMOLLM2", str(model))
    out = tmp_path / "outputs"
    [job] = [j for j in jobs("reasoning", seeds=(0,), scale="reasoning-quick", tasks=("chain_sum",), out=out)
             if j.name == "rg-chain_sum-cyb-p3-private-adapters16-s0"]
    train(RunConfig.from_dict(job.cfg).validate())
    evaluate(out / job.name, progress=False, num_passages=0)  # what the job runs after training
    row = suite_runner.final_row(job, out, "reasoning-quick")
    judged = row["reasoning_gym"]
    assert row["final"]["ppl"] > 0 and judged["task"] == "reasoning-gym:chain_sum" and judged["num_examples"] == 4
    assert 0.0 <= judged["mean_score"] <= 1.0 and judged["seconds_per_answer"] > 0
    saved = json.loads((out / job.name / "final" / "pause_adapters.json").read_text())
    assert saved["rank"] == 16
    # the decode time alone (experiments/reasoning_timing.py): the same answers, timed again
    from experiments import reasoning_timing

    import os
    import subprocess
    import sys

    assert reasoning_timing.pending(out) == [out / job.name]
    done = subprocess.run([sys.executable, reasoning_timing.__file__, str(out), "--gpus", "0", "--repeats", "2"],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert done.returncode == 0, done.stderr[-2000:]
    timing = json.loads((out / job.name / "eval" / "timing.json").read_text())
    assert timing["same_as_eval"] and len(timing["seconds_all"]) == 2 and timing["seconds_per_answer"] > 0
    assert reasoning_timing.pending(out) == [] and "ms per answer" in done.stdout
    ablations = json.loads((out / job.name / "eval" / "ablations.json").read_text())
    plain, every = ablations["without_pauses"], ablations["every_pause"]
    assert plain["mean_steps"] == 1.0 and 0 <= plain["changed_answers"] <= plain["num_examples"] == 4
    assert every["mean_steps"] == every["read_at"] == 4


def test_the_report_makes_a_table_per_task_and_the_score_time_figure(tmp_path):
    from experiments import reasoning_report

    summary = []
    for task in ("chain_sum", "gcd"):
        for label, short, *_ in rs.rows():
            for seed in (0, 1, 2):
                exact = 0.4 + 0.1 * (short != "baseline") + 0.01 * seed
                summary.append({"name": rs.run_name(task, short, seed), "label": f"{label} [{task}]", "seed": seed,
                                "command": suite_runner.rerun_command("reasoning", rs.run_name(task, short, seed), seed,
                                                                   "smollm2-reasoning", "outputs/reasoning", task),
                                "final": {"ppl": 2.0},
                                "reasoning_gym": {"task": f"reasoning-gym:{task}", "exact": exact, "mean_score": exact,
                                                  "mean_steps": 1.2, "seconds_per_answer": 0.004 + 0.001 * seed}})
    (tmp_path / "summary.jsonl").write_text("".join(json.dumps(r) + "\n" for r in summary))
    rs.write_choice(tmp_path, [r for r in summary if r["name"].endswith("baseline-s0")] + [
        {"name": rs.run_name(t, "baseline", 0), "reasoning_gym": {"exact": 0.9}}
        for t in rs.TASKS if t not in ("chain_sum", "gcd")])
    assert reasoning_report.main([str(tmp_path)]) == 0
    text = (tmp_path / "tables.md").read_text()
    assert text.startswith("Pilot (") and "### chain_sum" in text and "### gcd" in text
    assert "| Baseline | 41.0 ± 1.0 | 40.0%, 41.0%, 42.0% | --- |" in text
    assert "| CYB 3 pauses, private, pause adapters r16 | 51.0 ± 1.0 | 50.0%, 51.0%, 52.0% | 10.0 ± 0.0 |" in text
    assert "--only rg-gcd-cyb-p3-gated-sN" in text and (tmp_path / "score_time.png").stat().st_size > 0
    # a time measured alone (experiments/reasoning_timing.py) gets its own column, and its ratio to
    # the models without pauses is taken on the same card only
    h200, h100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
    for short, seed, ms, device in (("baseline", 0, 2, h200), ("baseline", 1, 3, h200), ("baseline", 2, 4, h100),
                                    ("cyb-p3-private", 0, 6, h100), ("cyb-p3-private", 1, 5, h200)):
        (tmp_path / rs.run_name("gcd", short, seed) / "eval").mkdir(parents=True)
        (tmp_path / rs.run_name("gcd", short, seed) / "eval" / "timing.json").write_text(
            json.dumps({"seconds_per_answer": ms / 1e3, "device": device}))
    assert reasoning_report.main([str(tmp_path)]) == 0
    gcd = (tmp_path / "tables.md").read_text().split("### gcd")[1].splitlines()
    assert "| 1.20 ± 0.00 |  |  | 3.00 ± 1.00 | 1.00 ± 0.20 | H200 2, H100 1 | 5.00 ± 1.00 |" in gcd[4]
    private = next(line for line in gcd if line.startswith("| CYB 3 pauses, private |"))
    assert "| 5.50 ± 0.71 | 1.75 ± 0.35 | H100 1, H200 1 |" in private  # 6 / 4 on the H100, 5 / 2.5 on the H200
    assert "5.50 ms (1.75x)" in reasoning_report.summary_table(reasoning_report.load(tmp_path), ["gcd"])


def test_the_pack_leaves_out_weights_and_tokenizers(tmp_path):
    import tarfile

    run = tmp_path / "out" / "rg-x-baseline-s0"
    (run / "final").mkdir(parents=True)
    (run / "eval").mkdir()
    for name in ("final/model.safetensors", "final/tokenizer.json", "final/config.json", "eval/metrics.json",
                 "ckpt-200/state.pt", "metrics.jsonl"):
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("{}")
    suite_runner.pack(tmp_path / "out", tmp_path / "r.tar.gz")
    with tarfile.open(tmp_path / "r.tar.gz") as tar:
        names = sorted(n.split("rg-x-baseline-s0/")[1] for n in tar.getnames())
    assert names == ["eval/metrics.json", "final/config.json", "metrics.jsonl"]


def test_keep_folds_a_pack_into_the_results_without_machine_paths(tmp_path):
    from experiments import reasoning_keep

    suite = tmp_path / "outputs" / "reasoning"
    run = suite / "rg-gcd-baseline-s0"
    (run / "eval").mkdir(parents=True)
    (run / "config.yaml").write_text("model:\n  name_or_path: /tmp/cyb/smollm2\ntrain:\n"
                                     f"  out_dir: {suite / 'rg-gcd-baseline-s0'}\n")  # the machine's path
    (run / "final_metrics.json").write_text("{}")
    (run / "eval" / "reasoning_gym.jsonl").write_text('{"index": 0, "exact": true}\n')
    (suite / "rg-gcd-cyb-p3-private-s0").mkdir()  # cut by a deadline: not kept
    judged = {"task": "reasoning-gym:gcd", "exact": 0.5, "mean_score": 0.5, "mean_steps": 1.0,
              "seconds_per_answer": 0.01}
    rows = [{"name": "rg-gcd-baseline-s0", "label": "Baseline [gcd]", "seed": 0, "command": "c",
             "config": f"{suite}/reasoning/configs/rg-gcd-baseline-s0.yaml"},
            {"name": "rg-gcd-baseline-s0", "label": "Baseline [gcd]", "seed": 0, "command": "c", "final": {},
             "reasoning_gym": judged}]
    (suite / "summary.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    into = tmp_path / "results"
    (into).mkdir()
    (into / "summary.jsonl").write_text(json.dumps({"name": "rg-gcd-baseline-s1", "label": "Baseline [gcd]",
                                                     "seed": 1, "command": "c", "final": {},
                                                     "reasoning_gym": judged}) + "\n")
    assert reasoning_keep.main([str(suite), "--into", str(into)]) == 0
    kept = [json.loads(x) for x in (into / "summary.jsonl").read_text().splitlines()]
    assert [(r["name"], "final" in r) for r in kept] == [("rg-gcd-baseline-s1", True), ("rg-gcd-baseline-s0", True)]
    assert sorted(p.name for p in into.iterdir()) == ["rg-gcd-baseline-s0", "score_time.png", "summary.jsonl",
                                                      "tables.md"]
    config = (into / "rg-gcd-baseline-s0" / "config.yaml").read_text()
    assert "name_or_path: smollm2-135m" in config and "out_dir: outputs/reasoning/rg-gcd-baseline-s0" in config
    assert (into / "rg-gcd-baseline-s0" / "eval" / "reasoning_gym.jsonl.gz").is_file()
    assert str(tmp_path) not in (into / "summary.jsonl").read_text()


def test_keep_never_trades_a_scored_row_for_a_run_whose_scoring_was_cut(tmp_path):
    """A run trained again elsewhere (``--again``) whose scoring a deadline cut keeps the scored
    row and files of the earlier machine; rows of runs never scored are not taken as finished."""
    from experiments import reasoning_keep

    judged = {"task": "reasoning-gym:gcd", "exact": 0.5, "mean_score": 0.5, "mean_steps": 1.0,
              "seconds_per_answer": 0.01}
    scored = {"name": "rg-gcd-baseline-s0", "label": "Baseline [gcd]", "seed": 0, "command": "c", "final": {},
              "reasoning_gym": judged, "returncode": 0}
    into = tmp_path / "results"
    (into / "rg-gcd-baseline-s0").mkdir(parents=True)
    (into / "summary.jsonl").write_text(json.dumps(scored) + "\n")
    (into / "rg-gcd-baseline-s0" / "metrics.jsonl").write_text("scored\n")
    suite = tmp_path / "outputs" / "reasoning"
    for name in ("rg-gcd-baseline-s0", "rg-gcd-baseline-s1"):
        (suite / name).mkdir(parents=True)
        (suite / name / "final_metrics.json").write_text("{}")
        (suite / name / "metrics.jsonl").write_text("trained again\n")
    cut = [dict(scored, reasoning_gym=None, returncode=-9),  # written before rows said ``trained``
           {"name": "rg-gcd-baseline-s1", "label": "Baseline [gcd]", "seed": 1, "command": "c", "trained": {},
            "returncode": -9}]
    (suite / "summary.jsonl").write_text("".join(json.dumps(r) + "\n" for r in cut))
    reasoning_keep.main([str(suite), "--into", str(into)])
    kept = [json.loads(x) for x in (into / "summary.jsonl").read_text().splitlines()]
    assert kept[0] == scored and "final" not in kept[1]
    assert (into / "rg-gcd-baseline-s0" / "metrics.jsonl").read_text() == "scored\n"
    assert not (into / "rg-gcd-baseline-s1").exists()


def test_the_summary_for_the_docs_gives_gain_and_time_against_the_baseline(tmp_path, monkeypatch):
    """docs/record/results/reasoning.md's compact table: per row and task the exact share, the gain over the same
    seed's baseline (signed) and the time alone as a ratio to the baseline's; written into the
    page only for the kept results, never for another folder."""
    from experiments import make_results, reasoning_report

    def row(short, seed, exact, ms):
        label = next(label for label, s, *_ in rs.rows() if s == short)
        return {"name": rs.run_name("gcd", short, seed), "label": f"{label} [gcd]", "seed": seed,
                "reasoning_gym": {"task": "reasoning-gym:gcd", "exact": exact, "mean_score": exact, "mean_steps": 1.0,
                                  "seconds_per_answer": 0.01}, "timing": {"seconds_per_answer": ms / 1e3}}

    rows = [row("baseline", 0, 0.40, 1.0), row("baseline", 1, 0.42, 1.0),
            row("cyb-p3-private", 0, 0.37, 1.5), row("cyb-p3-private", 1, 0.45, 1.5)]
    rows.append(dict(row("tbys-p3-private", 0, 0.5, 1.0), timing=None))
    table = reasoning_report.summary_table(rows, ["gcd"]).splitlines()
    assert table[2] == "| Baseline | 41.0 ± 1.4 (2); 1.00 ms |"
    assert table[3] == "| TBYS 3 pauses, private | 50.0 (1), +10.0; not timed alone |"
    assert table[4] == "| CYB 3 pauses, private | 41.0 ± 5.7 (2), +0.0 ± 4.2; 1.50 ms (1.50x) |"
    doc = tmp_path / "results.md"
    doc.write_text("a\n<!-- table:reasoning -->\nold\n<!-- end table -->\nb\n")
    monkeypatch.setattr(make_results, "DOC", doc)
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "summary.jsonl").write_text("".join(json.dumps(dict(r, command="c", final={})) + "\n"
                                                      for r in rows if r["timing"]))
    assert reasoning_report.main([str(kept)]) == 0
    assert "old" in doc.read_text()  # another folder: the page is left alone
    monkeypatch.setattr(reasoning_report, "RESULTS", kept)
    assert reasoning_report.main([str(kept)]) == 0
    assert "| Baseline | 41.0 ± 1.4 (2);" in doc.read_text() and "old" not in doc.read_text()


def test_the_paired_sign_test_counts_questions_won_and_lost_per_seed():
    """The questions a row answers and its baseline (same seed, same questions) does not, and the
    reverse, summed over seeds; p of the exact two-sided sign test."""
    from experiments import reasoning_report

    assert reasoning_report.sign_test(0, 0) == 1.0
    assert reasoning_report.sign_test(5, 0) == pytest.approx(2 / 32)
    assert reasoning_report.sign_test(45, 29) == pytest.approx(0.0805, abs=5e-4)
    assert reasoning_report.sign_test(3, 3) == 1.0
    base = {0: {"answers": {0: True, 1: False, 2: False}}, 1: {"answers": {0: False, 1: False}}}
    runs = [{"seed": 0, "answers": {0: False, 1: True, 2: True}}, {"seed": 1, "answers": {0: True, 1: False}},
            {"seed": 2, "answers": {0: True}}]  # seed 2 has no baseline: left out
    assert reasoning_report.paired(runs, base) == "+3 / -1 (p 0.62)"
    assert reasoning_report.paired([{"seed": 0}], base) == ""


def test_the_readout_table_takes_the_adaptive_share_over_the_runs_it_reads_out():
    """Ablations exist only for the runs timed alone: the adaptive share beside them is over those
    same runs, and their number is given."""
    from experiments import reasoning_report

    def row(seed, exact, ablations=None):
        r = {"name": rs.run_name("gcd", "cyb-p3-private", seed), "label": "CYB 3 pauses, private [gcd]", "seed": seed,
             "reasoning_gym": {"task": "reasoning-gym:gcd", "exact": exact}}
        return dict(r, ablations=ablations) if ablations else r

    rows = [row(0, 0.30), row(1, 0.40, {"without_pauses": {"exact": 0.41}, "every_pause": {"exact": 0.0}}),
            row(2, 0.50, {"without_pauses": {"exact": 0.49}, "every_pause": {"exact": 0.1}})]
    table = reasoning_report.ablation_table(rows, ["gcd"]).splitlines()
    assert table[2] == "| CYB 3 pauses, private | 45.0 / 45.0 / 5.0 (2) |"
    assert reasoning_report._ablation(rows, "without_pauses") == "45.0 ± 5.7 (2 of 3)"

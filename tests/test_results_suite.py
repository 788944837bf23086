"""experiments/run_suite.py and make_results.py: the jobs of each suite, the data they read, and
the tables (the GPU runs themselves are in results/experiments/text)."""

import gzip
import json

import pytest

from cyb.config import RunConfig
from experiments import make_results, run_suite, suite_runner


@pytest.fixture(scope="module")
def suite():
    return run_suite


@pytest.fixture(scope="module")
def results():
    return make_results


FILES = {k: f"data/{k}.jsonl.gz" for k in ("train", "valid", "valid_in", "base", "ft")} | {"tokenizer": "tok"}


@pytest.mark.parametrize("name", ["pretrain", "finetune", "hparams", "epochs", "recipes", "visibility"])
def test_every_job_is_a_valid_shuffled_run(suite, name, tmp_path):
    s = suite.SCALES["gpu"]
    jobs = suite.suite_jobs(name, 1, s, FILES, tmp_path)
    assert jobs and len({j.name for j in jobs}) == len(jobs)
    for job in jobs:
        cfg = RunConfig.from_dict(job.cfg).validate()
        assert cfg.data.shuffle == "corpus" and cfg.train.seed == 1 and job.name.endswith("-s1")
        assert cfg.data.valid_source == FILES["valid_in"] and cfg.data.block_len == 256
        assert cfg.train.eval_batches == 0  # the whole (in-distribution) held-out file
        if job.needs:  # fine-tuning: from its base, on the documents the base never saw
            assert cfg.model.name_or_path.endswith(f"{job.needs}/final") and cfg.data.source == FILES["ft"]
    if name == "finetune":
        base = [j for j in jobs if j.first]
        assert len(base) == 1 and base[0].cfg["data"]["source"] == FILES["base"]
        assert {j.label for j in jobs} >= {"Baseline 4xseq", "TBYS 1 pause", "CYB 3 pauses"}


def test_in_distribution_held_out_drops_sources_without_training_documents(suite, tmp_path):
    def write(path, records):
        with gzip.open(path, "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)

    write(tmp_path / "train.jsonl.gz", [{"text": "a", "source": "linux-docs/x"}, {"text": "b", "source": "perl-docs"}])
    write(tmp_path / "valid.jsonl.gz", [{"text": "c", "source": "linux-docs/y"}, {"text": "d", "source": "jargon/j"},
                                        {"text": "e", "source": "perl-docs"}])
    suite.write_in_distribution(tmp_path / "train.jsonl.gz", tmp_path / "valid.jsonl.gz", tmp_path / "in.jsonl.gz")
    with gzip.open(tmp_path / "in.jsonl.gz", "rt") as f:
        assert [json.loads(x)["text"] for x in f] == ["c", "e"]


def test_tables_pair_seeds_and_give_the_spread(results, tmp_path):
    def row(label, seed, ppl, suite="finetune"):
        return {"name": f"{label}-s{seed}", "suite": suite, "label": label, "seed": seed,
                "command": f"cyb train x/{label}-s{seed}.yaml", "train_ppl": ppl * 0.8,
                "final": {"ppl": ppl, "epoch": 0.5}, "whole_file": {"ppl": 2 * ppl}}

    rows = [row("Baseline", 0, 50.0), row("Baseline", 1, 60.0), row("TBYS 3 pauses", 0, 55.0),
            row("TBYS 3 pauses", 1, 66.0)]
    text = results.table(rows)
    line = next(x for x in text.splitlines() if x.startswith("| Baseline"))
    assert "55.0 ± 7.1" in line and "+9.1 ± 0.0%" in line  # paired: 1 - 50/55 = 1 - 60/66
    assert "`python experiments/run_suite.py finetune --seeds N --only Baseline-sN --out outputs/finetune`" in line
    assert "| 0.50 |" in line


def test_tables_go_between_their_markers_and_nothing_else_changes(results, tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# t\n\n<!-- table:a -->\n<!-- end table -->\n\ntext a\n\n<!-- table:b -->\nold\n<!-- end table -->\n\ntext b\n")
    results.fill_tables(doc, {"a": "| A |", "b": "| B |\n| 2 |"})
    once = doc.read_text()
    assert once == ("# t\n\n<!-- table:a -->\n| A |\n<!-- end table -->\n\ntext a\n\n<!-- table:b -->\n| B |\n| 2 |\n"
                    "<!-- end table -->\n\ntext b\n")
    results.fill_tables(doc, {"a": "| A |", "b": "| B |\n| 2 |"})
    assert doc.read_text() == once


def test_a_rows_command_reruns_it_alone_with_its_base(tmp_path, monkeypatch):
    """The command recorded for a row runs this script with --only the row: the jobs it selects
    are the row and, for a fine-tuning row, its base."""
    from experiments import run_suite

    cmd = suite_runner.rerun_command("finetune", "ft-cyb-p3-s1", 1)
    assert cmd == "python experiments/run_suite.py finetune --seeds 1 --only ft-cyb-p3-s1 --out outputs/finetune"
    s = dict(run_suite.SCALES["cpu-quick"])
    files = {k: k for k in ("train", "valid", "base", "ft", "tokenizer", "valid_in")}
    jobs = run_suite.suite_jobs("finetune", 1, s, files, tmp_path)
    assert {j.name for j in run_suite.select(jobs, ["ft-cyb-p3-s1"])} == {"ft-cyb-p3-s1", "base-s1"}
    assert suite_runner.rerun_command("smollm2", "sm-cyb-p3-private-s0", 0, "smollm2").endswith("--scale smollm2")


@pytest.mark.parametrize("name", ["visibility", "smollm2"])
def test_shared_against_private_tables_read_the_committed_runs(results, name):
    folder = results.HERE.parent / "results" / "experiments" / name
    order, references, digits = results.SUITE_TABLES[name]
    text = results.table(results.load(folder), references=references, order=order, digits=digits)
    rows = [line for line in text.splitlines()[2:]]
    assert [r.split(" | ")[0].lstrip("| ") for r in rows] == [label for label in order
                                                           if f"| {label} |" in text]
    assert any(r.startswith("| CYB 3 pauses, private |") for r in rows)
    assert "vs CYB 3 pauses, shared" in text.splitlines()[0]


def test_the_real_model_suites_name_their_rows_apart(tmp_path):
    """--only selects one row: private CYB is not its LoRA row, shared TBYS not private TBYS; the
    arithmetic rows are scored on their task and the stability rows change only the optimiser."""
    from experiments import run_suite

    files = {k: k for k in ("train", "valid", "base", "ft", "tokenizer", "valid_in")}
    sm = run_suite.suite_jobs("smollm2", 0, dict(run_suite.SCALES["smollm2"]), files, tmp_path)
    names = {j.name for j in sm}
    assert len(names) == len(sm) == 20
    adapters = next(j for j in sm if j.name == "sm-cyb-p3-adapters16-private-s0")
    assert adapters.cfg["method"]["pause_adapter_rank"] == 16 and not adapters.cfg.get("lora")
    sweep = {j.name: j for j in sm if "-dk" in j.name or "-tau" in j.name}
    assert sorted(sweep) == ["sm-cyb-p3-dk0.5-private-s0", "sm-cyb-p3-dk0.99-private-s0",
                             "sm-cyb_ponder-p3-tau-0.2-private-s0", "sm-cyb_ponder-p3-tau-0.5-private-s0"]
    assert sweep["sm-cyb-p3-dk0.99-private-s0"].cfg["method"]["psi_dk"] == 0.99
    assert sweep["sm-cyb_ponder-p3-tau-0.5-private-s0"].cfg["method"]["ponder_cost"] == -0.5
    assert all(j.analyse for j in sweep.values())  # H2 in every seed of the sweep
    assert {j.name for j in run_suite.select(sm, ["sm-cyb_ponder-p3-private"])} == {"sm-cyb_ponder-p3-private-s0"}
    assert {j.name for j in run_suite.select(sm, ["sm-cyb-p3-private"])} == {"sm-cyb-p3-private-s0"}
    assert {j.name for j in run_suite.select(sm, ["sm-tbys-p3-s"])} == {"sm-tbys-p3-s0"}
    assert {j.name for j in run_suite.select(sm, ["sm-cyb-p1-s", "sm-cyb-p2-s"])} == {"sm-cyb-p1-s0", "sm-cyb-p2-s0"}
    lora = [j for j in sm if "lora" in j.name]
    assert all(j.cfg["lora"]["rank"] == 16 and j.cfg["optim"]["lr"] == 1e-3 for j in lora) and len(lora) == 2
    epoch = run_suite.suite_jobs("smollm2", 1, dict(run_suite.SCALES["smollm2-epoch"]), files, tmp_path)
    assert {j.cfg["train"]["steps"] for j in epoch} == {1620} and all(j.cfg["train"]["save_every"] for j in epoch)
    ar = run_suite.suite_jobs("smollm2-arith", 2, dict(run_suite.SCALES["smollm2-arith"]), files, tmp_path)
    assert all(j.task and j.cfg["data"]["task"] == "addition" for j in ar) and len(ar) == 12
    assert {j.name for j in run_suite.select(ar, ["ar-cyb-p3-private-s"])} == {"ar-cyb-p3-private-s2"}
    assert next(j for j in ar if j.name == "ar-cyb-p3-private-frozenrows-s2").cfg["method"]["pause_rows"] == "frozen"
    by_name = {j.name: j.cfg for j in ar}  # the compute-matched baselines: 4x the steps, then 4x the sums too
    plain, steps, data = by_name["ar-baseline-p3-s2"], by_name["ar-baseline-4xsteps-s2"], by_name["ar-baseline-4xdata-s2"]
    assert steps["train"]["steps"] == data["train"]["steps"] == 4 * plain["train"]["steps"]
    assert steps["data"] == plain["data"] and data["data"]["num_train_examples"] == 4 * plain["data"]["num_train_examples"]
    st = run_suite.suite_jobs("stability", 3, dict(run_suite.SCALES["gpu"]), files, tmp_path)
    plain = next(j for j in st if j.name == "st-cyb-s3")
    warm = next(j for j in st if j.name == "st-cyb-warmup400-s3")
    assert warm.cfg["optim"]["warmup_steps"] == 400 and plain.cfg["optim"]["warmup_steps"] == 100
    assert {k: v for k, v in warm.cfg.items() if k != "optim" and k != "train"} == \
        {k: v for k, v in plain.cfg.items() if k != "optim" and k != "train"}


@pytest.mark.parametrize("name", ["smollm2-epoch", "stability"])
def test_the_suite_tables_read_the_committed_runs(results, name):
    folder = results.HERE.parent / "results" / "experiments" / name
    order, references, digits = results.SUITE_TABLES[name]
    text = results.table(results.load(folder), references=references, order=order, digits=digits)
    labels = [line.split(" | ")[0].lstrip("| ") for line in text.splitlines()[2:]]
    assert labels == order
    assert f"--out outputs/{name}" in text  # each row's command reruns it into its own folder


def test_the_arithmetic_table_reads_the_committed_runs(results):
    folder = results.HERE.parent / "results" / "experiments" / "smollm2-arith"
    text = results.arithmetic_table(results.load(folder))
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()[2:]}
    assert list(rows)[0] == "Baseline" and "CYB 3 pauses, private" in rows
    assert "| 90.9 ± 0.8% | 91.6%, 90.0%, 91.2% | --- |" in rows["Baseline"]
    assert "--scale smollm2-arith" in rows["CYB 3 pauses, private"]


def test_a_row_outside_the_order_still_gets_its_line_and_one_seed_says_so(results):
    rows = [{"name": f"{label}-s0", "suite": "smollm2", "label": label, "seed": 0, "command": "x",
             "final": {"ppl": ppl, "epoch": 0.3}} for label, ppl in (("Baseline", 10.0), ("New row", 9.0))]
    text = results.table(rows, references=("Baseline",), order=["Baseline"])
    line = next(x for x in text.splitlines() if x.startswith("| New row"))
    assert "+10.0% (1 seed)" in line  # the unit before the note, not after it


def test_the_calibration_table_reads_each_analysed_run(results, tmp_path):
    def analysed(name, rhos, mean_steps):
        (tmp_path / name / "eval").mkdir(parents=True)
        metrics = {"calibration": [{"step": i + 1, "spearman": r} for i, r in enumerate(rhos)],
                   "latency": {"mean_steps": mean_steps}}
        (tmp_path / name / "eval" / "metrics.json").write_text(json.dumps(metrics))

    analysed("a-s0", [0.6, 0.1], 1.1)
    analysed("a-s1", [0.8, 0.3], 1.3)
    rows = [{"name": f"a-s{k}", "label": "CYB", "seed": k, "final": {"ppl": 1.0}} for k in (0, 1, 2)]
    rows.append({"name": "b-s0", "label": "Baseline", "seed": 0, "final": {"ppl": 1.0}})  # not analysed
    text = results.calibration_table(tmp_path, rows, ["CYB"])
    assert text.splitlines()[2] == "| CYB | 2 | 0.70 ± 0.14 | 0.20 ± 0.14 | 1.20 ± 0.14 |"
    assert "Baseline" not in text and results.calibration_table(tmp_path, rows[3:], []) == ""


def test_the_committed_calibration_table_has_every_analysed_row(results):
    folder = results.HERE.parent / "results" / "experiments" / "smollm2"
    text = results.calibration_table(folder, results.load(folder), results.SUITE_TABLES["smollm2"][0])
    assert "| CYB 3 pauses, private, dk prior 0.99 | 3 | 0.67 ± 0.00 |" in text


def test_the_real_model_curves_draw_from_the_committed_runs(results, tmp_path):
    folder = results.HERE.parent / "results" / "experiments" / "smollm2-epoch"
    results.real_tokens_curves(folder, results.load(folder), results.CURVE_ROWS["smollm2-epoch"],
                               tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_early_pausing_orders_the_cyb_seeds_by_final_perplexity():
    from experiments import early_pausing

    rows = early_pausing.table(early_pausing.DEFAULT).splitlines()[2:]
    assert [r.split(" | ")[0] for r in rows] == ["| 2", "| 0", "| 1"]
    assert rows[-1].endswith("150.2 / 48.1 |")
    assert "TBYS seeds' largest gradient norm" in early_pausing.others(early_pausing.DEFAULT)


_DRIVER = """
import subprocess, sys, time
from pathlib import Path
from experiments import suite_runner

def launch(job, out, device, log_dir, whole_valid):
    proc = subprocess.Popen(["sleep", "120"], start_new_session=True)
    Path(sys.argv[2]).write_text(str(proc.pid))
    return proc

suite_runner.launch = launch
suite_runner.schedule([suite_runner.Job("j", "s", "J", 0, {})], Path(sys.argv[1]), ["cpu/0"], float("inf"), None)
"""


def test_a_stopped_driver_takes_its_jobs_down(tmp_path):
    """The jobs run in sessions of their own (a job's kill takes its children): a driver stopped
    by a time limit's SIGTERM must stop them too, or they train on beside the next call's jobs."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "pid"
    repo = str(run_suite.REPO)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.path.join(repo, "src")]))
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, str(tmp_path), str(pid_file)], cwd=repo, env=env)
    for _ in range(300):
        if pid_file.is_file() and pid_file.read_text():
            break
        time.sleep(0.1)
    job = int(pid_file.read_text())
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=30) == 128 + signal.SIGTERM
    for _ in range(50):
        try:
            os.kill(job, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(job, 9)
        raise AssertionError("the job outlived its driver")


def test_again_reruns_a_finished_job_only_where_its_model_is_missing(tmp_path, monkeypatch):
    """``--again``: a job finished on another machine (its row in summary.jsonl, its model not
    here) runs again, e.g. to time its decoding; once its model is here it is skipped again."""
    import subprocess

    jobs = [suite_runner.Job(name, "s", name, 0, {}) for name in ("rg-a-baseline-s0", "rg-b-baseline-s0")]
    (tmp_path / "summary.jsonl").write_text("".join(json.dumps({"name": j.name, "final": {}}) + "\n" for j in jobs))
    started = []

    def launch(job, out, device, log_dir, whole_valid):
        started.append(job.name)
        (out / job.name / "final").mkdir(parents=True)
        (out / job.name / "final" / "model.safetensors").write_text("")
        return subprocess.Popen(["true"], start_new_session=True)

    monkeypatch.setattr(suite_runner, "launch", launch)
    monkeypatch.setattr(suite_runner, "final_row", lambda job, out, scale: {"name": job.name, "final": {"ppl": 1.0}})
    suite_runner.schedule(jobs, tmp_path, ["cpu/0"], float("inf"), None, again=("rg-a-",))
    assert started == ["rg-a-baseline-s0"]
    suite_runner.schedule(jobs, tmp_path, ["cpu/0"], float("inf"), None, again=("rg-a-",))
    assert started == ["rg-a-baseline-s0"]


def test_a_run_whose_scoring_was_cut_is_scored_again_without_training_again(tmp_path, monkeypatch):
    """A deadline that kills a job after its training but inside its scoring leaves a model and
    no scores: its row says ``trained`` (not finished), and the next call only scores it."""
    import subprocess

    job = suite_runner.Job("rg-a-baseline-s0", "reasoning", "A", 0, {"method": {"name": "baseline"}},
                           reasoning=True)
    scripts, real_popen = [], subprocess.Popen

    def popen(args, **kwargs):
        scripts.append(args[-1])
        run = tmp_path / job.name
        (run / "final").mkdir(parents=True, exist_ok=True)
        (run / "final" / "model.safetensors").write_text("")
        (run / "final_metrics.json").write_text('{"ppl": 1.5}')
        (run / "metrics.jsonl").write_text("")
        return real_popen(["false"] if len(scripts) == 1 else ["true"], start_new_session=True)

    monkeypatch.setattr(suite_runner.subprocess, "Popen", popen)
    rows = suite_runner.schedule([job], tmp_path, ["cpu/0"], float("inf"), None)
    assert "trained" in rows[-1] and not suite_runner.finished(rows[-1])
    assert scripts[0].split(" && ")[0].endswith(f"-m cyb train {tmp_path}/reasoning/configs/{job.name}.yaml")
    rows = suite_runner.schedule([job], tmp_path, ["cpu/0"], float("inf"), None)
    assert suite_runner.finished(rows[-1]) and len(scripts) == 2
    assert scripts[1].startswith("true && ") and "-m cyb eval" in scripts[1]
    suite_runner.schedule([job], tmp_path, ["cpu/0"], float("inf"), None)
    assert len(scripts) == 2  # finished: skipped


def test_at_the_deadline_a_run_scoring_its_trained_model_gets_the_grace(tmp_path, monkeypatch):
    """Killing a job in its scoring loses a whole training: past the deadline, a job whose model
    is trained runs on for up to ``grace`` seconds, one still training is killed."""
    import subprocess
    import time

    jobs = [suite_runner.Job(name, "s", name, 0, {"method": {}}) for name in ("scoring", "training")]
    real_popen = subprocess.Popen

    def popen(args, **kwargs):
        if "scoring" in args[-1]:
            run = tmp_path / "scoring"
            (run / "final").mkdir(parents=True)
            (run / "final" / "model.safetensors").write_text("")
            (run / "final_metrics.json").write_text('{"ppl": 1.5}')
            (run / "metrics.jsonl").write_text("")
        return real_popen(["sleep", "2"], start_new_session=True)

    monkeypatch.setattr(suite_runner.subprocess, "Popen", popen)
    rows = suite_runner.schedule(jobs, tmp_path, ["cpu/0", "cpu/1"], time.time() + 0.5, None, grace=30.0)
    assert {r["name"]: suite_runner.finished(r) for r in rows} == {"scoring": True, "training": False}


def test_a_pack_folds_into_the_results_without_models_locks_or_machine_paths(tmp_path):
    """experiments/keep_pack.py: the finished runs' files (no final/ model, no lock), the logs and
    configs, the merged summary; a run the deadline cut is not kept; machine paths rewritten."""
    from experiments import keep_pack

    suite = tmp_path / "outputs" / "smollm2-arith"
    done, cut = suite / "ar-baseline-4xsteps-s0", suite / "ar-baseline-4xdata-s0"
    for run in (done, cut):
        (run / "final").mkdir(parents=True)
        (run / "final" / "config.json").write_text("{}")
        (run / "train.lock").write_text("pid")
        (run / "config.yaml").write_text(f"model:\n  name_or_path: /tmp/cyb/smollm2\ntrain:\n  out_dir: {run}\n"
                                         "data:\n  source: /tmp/cyb/techdocs/train.jsonl.gz\n")
    (done / "task.json").write_text('{"exact_match": 0.9}')
    (suite / "logs").mkdir()
    (suite / "logs" / "ar-baseline-4xsteps-s0.log").write_text(f"run folder: {done}\n")
    (suite / "smollm2-arith" / "configs").mkdir(parents=True)
    (suite / "smollm2-arith" / "configs" / "ar-baseline-4xsteps-s0.yaml").write_text("x: 1\n")
    rows = [{"name": done.name, "final": {}, "returncode": 0}, {"name": cut.name, "returncode": -9}]
    (suite / "summary.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    into = tmp_path / "results"
    assert keep_pack.fold(suite, into) == 1
    kept = sorted(str(p.relative_to(into)) for p in into.rglob("*") if p.is_file())
    assert kept == ["ar-baseline-4xsteps-s0/config.yaml", "ar-baseline-4xsteps-s0/task.json",
                    "logs/ar-baseline-4xsteps-s0.log", "smollm2-arith/configs/ar-baseline-4xsteps-s0.yaml",
                    "summary.jsonl"]
    config = (into / "ar-baseline-4xsteps-s0" / "config.yaml").read_text()
    assert "name_or_path: smollm2-135m" in config and "out_dir: outputs/smollm2-arith/ar-baseline-4xsteps-s0" in config
    assert "source: ../shared/data/techdocs/train.jsonl.gz" in config
    assert str(tmp_path) not in (into / "logs" / "ar-baseline-4xsteps-s0.log").read_text()

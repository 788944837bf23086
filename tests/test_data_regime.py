"""The data-regime study (experiments/data_regime*.py): its cells and their configs, what it runs
next, the data-efficiency factors and tables on synthetic cells, and a CPU smoke test that runs
cells of the suite on a tiny model as the GPU job does."""

from __future__ import annotations

import gzip
import json
import math
import random

import pytest

from cyb.config import RunConfig
from experiments import data_regime as suite
from experiments import data_regime_plan as plan
from experiments import data_regime_cells as dc
from experiments import data_regime_report as rep

pytestmark = pytest.mark.usefixtures("one_thread")

FILES = {"train": "data/train.jsonl.gz", "valid": "data/valid.jsonl.gz", "valid_in": "data/valid-in.jsonl.gz"}


def test_the_plan_holds_every_figure_cell_of_two_seeds_and_the_baselines_convergence(tmp_path):
    cells = plan.planned({}, [0, 1])
    names = [c.name for c, _ in cells]
    assert len(names) == len(set(names)) == 2 * (4 * 4 + 2) + 2 * 2
    assert {c.regime for c, _ in cells if c.row.key == "base4x"} == {"1x1", "1x3"}
    assert {c.regime for c, _ in cells if c.row.key == "base"} == {"1x1", "2x1", "1x2", "1x3", "2x3", "3x3"}
    assert not any(c.row.cyb and c.regime == "2x3" for c, _ in cells)  # the best CYB row is not known yet
    by_name = {j.name: j for j in suite.jobs(cells, FILES, tmp_path, plan.DEFAULT_TIMING)}
    for job in by_name.values():
        cfg = RunConfig.from_dict(job.cfg).validate()
        assert cfg.data.valid_source == FILES["valid_in"] and cfg.data.shuffle == "corpus" and cfg.data.block_len == 256
        assert cfg.train.eval_every == 0 and cfg.train.eval_batches == 0 and cfg.train.seed == job.seed
        assert cfg.train.batch_size == 32 and cfg.optim.lr == 1e-4 and cfg.train.compile
        assert not job.whole_file and job.command.endswith(f"--only {job.name} --out {tmp_path}")
    third, twice, two_thirds, whole = (by_name[f"dr-cyb-{g}-s1"].cfg for g in ("1x1", "2x1", "1x2", "1x3"))
    assert third["data"]["fraction"] == twice["data"]["fraction"] == pytest.approx(1 / 3)
    assert (third["train"]["epochs"], twice["train"]["epochs"], two_thirds["train"]["epochs"]) == (1, 2, 1)
    assert two_thirds["data"]["fraction"] == pytest.approx(2 / 3) and "fraction" not in whole["data"]
    wide = by_name["dr-base4x-1x1-s0"].cfg  # compute-matched: the regime's steps, 4x the context
    assert wide["method"]["seq_multiplier"] == 4 and wide["train"]["epochs"] == 4
    adapters = by_name["dr-cyb-ad16-1x3-s0"].cfg["method"]
    assert adapters["pause_adapter_rank"] == 16 and adapters["pause_visibility"] == "private"
    assert by_name["dr-base-3x3-s0"].cfg["train"]["epochs"] == 3
    order = sorted(by_name.values(), key=lambda j: (-j.priority, -j.cost))
    assert {j.seed for j in order[:18]} == {0} and all("x3-" in j.name for j in order[-4:])


def _result(row, regime, seed, ppl, share=None, es=None, decoded=None):
    return rep.Result(row, regime, seed, ppl, dc.share(regime) if share is None else share, es, decoded, 100, "cmd")


def _synthetic(gain=3.0, tbys=1.0, spread=0.0, seeds=(0, 1)) -> rep.Cells:
    """Curves linear in log share: the baseline at 12 - log(3 x share); CYB reads as if it had
    ``gain`` times the data, TBYS ``tbys`` times; 2x1 between 1x1 and 1x2."""
    results = []
    for seed in seeds:
        for row, times in (("base", 1.0), ("cyb", gain), ("cyb-ad16", gain * 1.2), ("tbys", tbys), ("base4x", 2.0)):
            for regime in dc.BY_KEY[row].regimes:
                x = dc.share(regime) * (1.5 if regime == "2x1" else 1.0) * times
                results.append(_result(row, regime, seed, 12 - math.log(3 * x) + spread * seed, es=1.1,
                                       decoded=1.25 if row == "cyb" else None))
    return rep.cells_of(results)


def test_crossing_reads_a_log_linear_curve_exactly_and_bounds_outside_it():
    curve = [(1 / 3, 12.0), (2 / 3, 12 - math.log(2)), (1.0, 12 - math.log(3))]
    assert rep.crossing(curve, 12 - math.log(1.5)).value == pytest.approx(0.5)
    assert rep.crossing(curve, 12 - math.log(2.5)).value == pytest.approx(2.5 / 3)
    assert rep.crossing(curve, 12.5) == rep.Reading(1 / 3, "<")
    assert rep.crossing(curve, 10.0) == rep.Reading(1.0, ">")
    assert rep.crossing(curve, 12.0) == rep.Reading(1 / 3)
    assert rep.crossing([], 1.0) is None
    assert rep.Reading(0.5).text() == "50%" and rep.Reading(1.0, ">").text(times=True) == "> 1.00x"


def test_the_factors_give_the_papers_33_percent_when_cyb_reads_as_three_times_the_data():
    cells = _synthetic(gain=3.0, tbys=1.5)
    match = rep.share_to_match(cells, "cyb", "base")
    assert [r.value for r in match.values()] == pytest.approx([1 / 3, 1 / 3]) and not any(r.bound for r in match.values())
    tbys = rep.share_to_match(cells, "cyb", "tbys")  # TBYS at 1x3 reads as 1.5x: CYB needs half the data
    assert [r.value for r in tbys.values()] == pytest.approx([0.5, 0.5])
    eq = rep.baseline_equivalent(cells, "cyb", "1x2")  # CYB at 2/3 is the baseline at 2: beyond its curve
    assert all(r.bound == ">" for r in eq.values()) and eq[0].text(times=True) == "> 1.50x"
    small = _synthetic(gain=1.5)
    assert [r.value for r in rep.baseline_equivalent(small, "cyb", "1x1").values()] == pytest.approx([1.5, 1.5])
    assert rep.summary(rep.share_to_match(small, "cyb", "base")).startswith("67% ± 0%")
    lines = rep.factor_table(cells).splitlines()
    assert lines[2].startswith("| CYB 3 pauses, private | 33% ± 0% (33%, 33%) | 50% ± 0% (50%, 50%) |")
    # the adapter row reads as 3.6x the data: it matches the baseline before 1x1, and at 1x1 and 1x2
    # the baseline does not reach it within its curve
    assert lines[3] == ("| CYB 3 pauses, private, pause adapters r16 | < 33% (2 seeds) | 42% ± 0% (42%, 42%) | "
                        "> 3.00x (2 seeds) | > 1.50x (2 seeds) |")


def test_a_third_seed_is_asked_where_two_seeds_differ_by_more_than_a_third_of_the_gap():
    tight = _synthetic(gain=1.1, spread=0.0)
    assert rep.third_seed(tight) == []
    # seed 1 is 0.05 worse everywhere: more than a third of CYB's gap to the baseline (log 1.1 =
    # 0.095, the baseline's smallest too), less than a third of TBYS's (log 0.8 = -0.22)
    loose = _synthetic(gain=1.1, tbys=0.8, spread=0.05)
    asked = rep.third_seed(loose)
    assert ("cyb", "1x1") in asked and ("base", "1x1") in asked and ("tbys", "1x1") not in asked
    cells_now = plan.planned(loose, [0, 1])
    assert any(c.name == "dr-cyb-1x1-s2" and priority == 100 for c, priority in cells_now)


def test_convergence_runs_the_best_cyb_row_and_adds_passes_while_they_improve():
    cells = _synthetic()
    assert rep.best_cyb(cells, [0, 1]) == "cyb-ad16"
    del cells[("cyb", "1x3")][1]
    assert rep.best_cyb(cells, [0, 1]) is None  # not every CYB row has 1x3 yet
    cells = _synthetic()
    assert rep.convergence_regimes(cells, "base", [0, 1]) == ["2x3", "3x3"]
    for seed in (0, 1):
        for regime, ppl in (("2x3", 10.5), ("3x3", 10.4)):
            cells.setdefault(("base", regime), {})[seed] = _result("base", regime, seed, ppl)
    assert rep.convergence_regimes(cells, "base", [0, 1]) == ["2x3", "3x3", "4x3"]
    for seed in (0, 1):
        cells.setdefault(("base", "4x3"), {})[seed] = _result("base", "4x3", seed, 10.45)
    assert rep.convergence_regimes(cells, "base", [0, 1]) == ["2x3", "3x3", "4x3"]  # 4x3 did not improve
    planned = {c.name for c, _ in plan.planned(cells, [0, 1])}
    assert {"dr-cyb-ad16-2x3-s1", "dr-cyb-ad16-3x3-s0", "dr-base-4x3-s1"} <= planned
    assert not any(n.startswith("dr-cyb-2x3") or "5x3" in n for n in planned)


def test_the_convergence_table_compares_each_row_at_its_own_best():
    cells = _synthetic(gain=2.0)
    for seed in (0, 1):
        for regime, b, c in (("2x3", 10.6, 9.8), ("3x3", 10.7, 9.5)):
            cells.setdefault(("base", regime), {})[seed] = _result("base", regime, seed, b + 0.01 * seed)
            cells.setdefault(("cyb-ad16", regime), {})[seed] = _result("cyb-ad16", regime, seed, c)
    text = rep.convergence_table(cells, [0, 1])
    base = next(x for x in text.splitlines() if x.startswith("| Baseline |"))
    assert base.endswith("| 10.61 | 2x3 |")
    assert "| 9.50 | 3x3 |" in text and "adapters r16 3x3" in text
    # at 1x3 10.90 against 10.03; at the bests 10.61 (seed 1: 10.62) against 9.50
    assert "1x3: +8.03%, +8.03%; at each" in text and "+10.38%, +10.46%" in text and "larger at the best" in text


def _write_summary(folder, cells: rep.Cells):
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "summary.jsonl").open("w") as f:
        for seeds in cells.values():
            for r in seeds.values():
                row = {"name": dc.cell_name(r.row, r.regime, r.seed), "final": {"ppl": r.ppl, "mean_steps": r.mean_steps,
                       "step": r.steps}, "returncode": 0, "command": "cmd",
                       "training_state": {"data_fraction": {"share": r.share}} if r.share < 1 else {}}
                if r.decode_positions is not None:
                    row["decode"] = {"positions_per_token": r.decode_positions}
                f.write(json.dumps(row) + "\n")
        f.write(json.dumps({"name": "dr-cyb-1x1-s9", "returncode": -9}) + "\n")  # cut: not a result


def test_the_report_writes_the_tables_and_the_figure_from_the_summary(tmp_path):
    _write_summary(tmp_path, _synthetic(gain=3.0, tbys=1.5))
    loaded = rep.load(tmp_path)
    assert len(loaded) == 2 * 18 and all(r.seed in (0, 1) for r in loaded)
    assert rep.main([str(tmp_path)]) == 0
    text = (tmp_path / "tables.md").read_text()
    assert "| Baseline | 12.00 ± 0.00 | 11.59 ± 0.00 | 11.31 ± 0.00 | 10.90 ± 0.00 | 12.173 | 1 | 1 | 1 |" in text
    # decode positions: counted through the engine where the cells did, else the teacher-forced E[S], marked
    assert "| CYB 3 pauses, private |" in text and "| 11.657 | 4 | 4 | 1.25 |" in text
    assert "| 4 | 4 | 1.10 (E[S], teacher-forced) |" in text
    assert "--rows cyb-ad16 --seeds 0,1" in text and "## Cells that need a third seed\n\nnone" in text
    assert (tmp_path / "data_regime.png").stat().st_size > 10_000
    page = tmp_path / "page.md"  # the record page's markers get the same tables
    page.write_text(rep.DOC.read_text())
    assert rep.main([str(tmp_path), "--doc", str(page)]) == 0
    filled = page.read_text()
    assert rep.figure_table(rep.cells_of(loaded)) in filled and "| 33% ± 0% (33%, 33%) |" in filled
    assert filled.count("<!-- end table -->") == rep.DOC.read_text().count("<!-- end table -->") == 4


# ----------------------------------------------------------------------------- CPU smoke test


def _tiny_pretrained(folder, docs):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from cyb.data.tokenizer import train_bpe_tokenizer

    tok = train_bpe_tokenizer(docs, 320, folder / "tokenizer")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512))
    model.save_pretrained(folder / "model")
    tok.save_pretrained(folder / "model")
    return folder / "model"


def _techdocs_like(folder, n=60):
    rng = random.Random(0)
    words = "the file system kernel module returns a value when the call fails and the user reads it".split()
    folder.mkdir(parents=True)
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(30, 120))) for _ in range(n)]
    for name, part in (("train", docs), ("valid", docs[:6])):
        with gzip.open(folder / f"{name}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps({"text": d, "source": "docs/x"}) + "\n" for d in part)
    return docs


def _tiny_study(tmp_path, monkeypatch) -> None:
    """The study at a CPU's scale in ``tmp_path`` (its working folder): techdocs-like documents, a
    tiny pretrained model, blocks of 16 and batches of 4, no kept cells."""
    docs = _techdocs_like(tmp_path / "techdocs")
    monkeypatch.setenv("CYB_DATA", str(tmp_path / "techdocs"))
    monkeypatch.setenv("CYB_SMOLLM2", str(_tiny_pretrained(tmp_path / "smol", docs)))
    monkeypatch.setattr(plan, "SCALE", dict(block_len=16, batch=4, lr=1e-3, warmup=1, compile=False))
    monkeypatch.setattr(suite, "KEPT", tmp_path / "kept")
    monkeypatch.chdir(tmp_path)


def test_cells_of_the_suite_train_on_a_cpu_and_a_second_call_skips_them(tmp_path, monkeypatch, capsys):
    """Two cells through the driver (each a `cyb train` of its own): a third of the documents
    once, and that third twice; the same held-out rows; the data share and the steps in the
    summary; a second call runs nothing."""
    _tiny_study(tmp_path, monkeypatch)
    args = ["run", "--out", "out", "--gpus", "cpu", "--per-gpu", "2", "--seeds", "0", "--rows", "base", "--regimes", "1x1,2x1"]
    assert suite.main(args) == 0
    rows = {r["name"]: r for r in map(json.loads, (tmp_path / "out" / "summary.jsonl").read_text().splitlines())}
    once, twice = rows["dr-base-1x1-s0"], rows["dr-base-2x1-s0"]
    assert once["returncode"] == twice["returncode"] == 0
    share = once["training_state"]["data_fraction"]["share"]
    assert 0.28 < share < 0.39 and twice["training_state"]["data_fraction"]["share"] == share
    assert 1.9 < twice["final"]["epoch"] <= 2.0 and 0.9 < once["final"]["epoch"] <= 1.0
    assert abs(twice["final"]["step"] - 2 * once["final"]["step"]) <= 1
    assert once["final"]["targets"] == twice["final"]["targets"]  # the same held-out rows
    assert once["command"] == "python experiments/data_regime.py run --seeds 0 --only dr-base-1x1-s0 --out out"
    assert not (tmp_path / "out" / "dr-base-1x1-s0" / "eval-whole-file").exists()
    capsys.readouterr()
    assert suite.main(args) == 0
    assert "2 cells finished of 2 asked for" in capsys.readouterr().out
    assert len((tmp_path / "out" / "summary.jsonl").read_text().splitlines()) == 2
    results = rep.load(tmp_path / "out")
    assert [(r.row, r.regime, r.share) for r in results] == [("base", "1x1", share), ("base", "2x1", share)]
    # the timing of a row (the GPU job's first command), then its estimate of the plan
    capsys.readouterr()
    assert suite.main(["time", "--out", "out", "--gpus", "cpu", "--rows", "base", "--steps", "20"]) == 0
    said = capsys.readouterr().out
    timing = json.loads((tmp_path / "out" / "timing.json").read_text())
    assert set(timing["rows"]) == {"base"} and timing["rows"]["base"]["steps"] == 20 and timing["measured"]
    assert timing["tokenise_chars_per_s"] > 0 and "not timed yet: tbys" in said and "GPU-hours alone" in said
    assert plan.load_timing(tmp_path / "out")["rows"]["base"]["step_s"] == timing["rows"]["base"]["step_s"]


def test_a_cyb_cell_counts_the_positions_its_tokens_cost_through_the_engine(tmp_path, monkeypatch):
    """A CYB cell (private pauses, a dk output) decodes held-out prompts adaptively after training:
    decode.json and its summary row say how many steps its new tokens took (1 to M each)."""
    _tiny_study(tmp_path, monkeypatch)
    assert suite.main(["run", "--out", "out", "--gpus", "cpu", "--seeds", "0", "--only", "dr-cyb-1x1-s0"]) == 0
    [row] = map(json.loads, (tmp_path / "out" / "summary.jsonl").read_text().splitlines())
    decode = row["decode"]
    assert row["returncode"] == 0 and decode["mode"] == "adaptive" and decode["num_steps"] == 4
    assert decode["generation"]["fixed"]["positions_per_token"] == 4.0 and decode["prompts"] >= 1
    assert 1.0 <= decode["positions_per_token"] <= 4.0
    assert decode["teacher_forced_mean_steps"] == row["final"]["mean_steps"]
    [result] = rep.load(tmp_path / "out")
    assert result.decode_positions == decode["positions_per_token"]


def test_a_timing_run_reads_its_steady_step_start_up_evaluation_and_save(tmp_path):
    from experiments.data_regime_timing import read_run

    times = (130.0, 133.0, 134.2, 135.2, 136.2)  # the first window compiles
    lines = [{"split": "train", "step": 10 * (i + 1), "time": t} for i, t in enumerate(times)]
    lines.append({"split": "valid", "step": 50, "time": 143.0})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    got = read_run(tmp_path, launched=100.0, ended=150.0)
    assert got["step_s"] == pytest.approx(0.1)  # the median of the windows after the first: 0.12, 0.10, 0.10
    assert got["startup_s"] == pytest.approx(29.0) and got["eval_s"] == pytest.approx(6.8)
    assert got["save_s"] == pytest.approx(7.0) and got["steps"] == 50
    (tmp_path / "metrics.jsonl").write_text(json.dumps(lines[0]) + "\n")
    with pytest.raises(ValueError, match="too few logged steps"):
        read_run(tmp_path, 100.0, 150.0)


def test_the_estimate_counts_what_is_left_and_the_holds_it_takes():
    cells = plan.planned({}, [0, 1], best="cyb-ad16")
    timing = {**plan.DEFAULT_TIMING, "load": {"2": 1.5}, "measured": True, "device": "NVIDIA H100"}
    done = {c.name for c, _ in cells if c.regime == "1x1"}
    text = plan.estimate(cells, timing, done, hold_s=1500, per_gpu=2)
    assert "measured on NVIDIA H100" in text and "| all | 44 |" in text and "(not counted)" not in text
    assert "it does not fit one hold even alone" in text  # 4,857 adapter steps at the assumed 0.35 s
    left = sum(plan.expected_seconds(c, timing) for c, _ in cells if c.name not in done)
    assert f"left: {left / 3600:.1f} GPU-hours alone; with 2 cell(s) per GPU (each 1.50x slower)" in text
    assert f"{left * 1.5 / 2 / 3600:.1f} hours of one GPU" in text

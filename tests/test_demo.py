"""``cyb demo --quick``: the whole pipeline (three trainings, scoring, table, report folder)."""

from __future__ import annotations

import json

import pytest
import torch

from cyb.cli import main


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["demo", "--quick", "--out", str(out), "--no-progress"])
    return rc, out, buf.getvalue()


def test_quick_demo_writes_report(quick_demo):
    rc, out, _ = quick_demo
    assert rc == 0
    for name in ("metrics.json", "settings.json", "table.md", "latency.png", "examples.html"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for method in ("baseline", "tbys", "cyb"):
        assert (out / "runs" / method / "metrics.jsonl").is_file()
        assert (out / "runs" / method / "final").is_dir()


def test_quick_demo_metrics_and_settings(quick_demo):
    _, out, _ = quick_demo
    metrics = json.loads((out / "metrics.json").read_text())
    settings = json.loads((out / "settings.json").read_text())
    assert list(metrics["methods"]) == ["baseline", "tbys", "cyb", "cyb_decoupled"]
    m = settings["demo"]["num_steps"]
    for name, r in metrics["methods"].items():
        assert 0.0 <= r["exact_match"] <= r["token_accuracy"] + 1e-9 <= 1.0 + 1e-9
        assert r["ppl"] >= 1.0
        assert len(r["per_position_accuracy"]) == len(r["per_position_steps"])
    assert metrics["methods"]["baseline"]["mean_steps"] == pytest.approx(1.0)
    assert metrics["methods"]["tbys"]["mean_steps"] == pytest.approx(m)
    cyb = metrics["methods"]["cyb"]
    assert 1.0 <= cyb["mean_steps"] <= m and 1.0 <= cyb["greedy_steps"] <= m
    # the exact configuration of every run is recorded, and they differ only in the method
    runs = settings["runs"]
    assert runs["cyb"]["train"]["steps"] == runs["baseline"]["train"]["steps"] == settings["demo"]["train_steps"]
    assert runs["cyb"]["data"] == runs["tbys"]["data"] == runs["baseline"]["data"]
    assert runs["cyb"]["method"]["num_steps"] == runs["tbys"]["method"]["num_steps"] == m
    # every method with dk carries its verdict on the criterion, part by part; the others none
    from cyb.demo import verdict

    for name in ("cyb", "cyb_decoupled"):
        stored = metrics["methods"][name]["criterion"]
        assert set(stored) == {"meets_criterion", "beats_baseline", "level_with_tbys", "more_steps_when_hard",
                               "adaptive_keeps_answers"}
        assert stored == json.loads(json.dumps(verdict(metrics["methods"], name)))
    assert "criterion" not in metrics["methods"]["tbys"] and "criterion" not in metrics["methods"]["baseline"]


def test_quick_demo_prints_table(quick_demo):
    _, out, stdout = quick_demo
    table = (out / "table.md").read_text()
    assert table.strip() in stdout
    assert "- cyb_decoupled does not meet the demo's criterion" in stdout or \
        "- cyb_decoupled meets the demo's criterion" in stdout
    assert "criterion: beats the no-pause baseline: " in stdout and "; within 0.5 points of TBYS, or above: " in stdout
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0].startswith("| method")
    assert [r.split("|")[1].strip() for r in rows[1:]] == ["baseline", "tbys", "cyb", "cyb_decoupled"]
    html = (out / "examples.html").read_text()
    assert "legend" in html.lower() and html.count('class="tok"') >= 8
    metrics = json.loads((out / "metrics.json").read_text())["methods"]
    most = max(("cyb", "cyb_decoupled"), key=lambda m: metrics[m]["mean_steps"])
    assert f"<title>Where {most} pauses: addition (digits 3)</title>" in html


def test_the_table_and_the_runs_final_metrics_agree(quick_demo):
    """The demo's answer perplexity and the one cyb report reads (final_metrics.json) are the
    same number: the runs' last held-out evaluation covers the whole test set the demo scores."""
    _, out, _ = quick_demo
    for method, r in json.loads((out / "metrics.json").read_text())["methods"].items():
        final = json.loads((out / "runs" / method / "final_metrics.json").read_text())
        assert final["ppl"] == pytest.approx(r["ppl"], rel=1e-5), method


def test_the_latency_legend_sits_below_the_panels(tmp_path, monkeypatch):
    from cyb.report import plots

    kept = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: kept.setdefault("fig", fig) and path)
    methods = {name: {"per_position_steps": [steps] * 3, "per_position_accuracy": [0.5] * 3, "num_steps": 4}
               for name, steps in (("baseline", 1.0), ("tbys", 4.0), ("cyb", 1.5))}
    plots.steps_per_position_figure({"methods": methods, "task": "addition", "task_kwargs": {"digits": 2}},
                                    tmp_path / "latency.png")
    fig = kept["fig"]
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
    box = fig.legends[0].get_window_extent(fig.canvas.get_renderer())
    for ax in fig.axes:
        assert box.y1 <= ax.get_window_extent(fig.canvas.get_renderer()).y0 + 1  # below every panel


def test_score_model_matches_greedy_generation_on_correct_prefix():
    """Teacher-forced greedy answers equal the step-by-step readout of a fresh forward."""
    from cyb.data.synthetic import CharTokenizer, SyntheticDataset
    from cyb.decision import greedy_decision
    from cyb.demo import score_model
    from cyb.model import PauseModel
    from transformers import LlamaConfig

    torch.manual_seed(0)
    tok = CharTokenizer().to_hf()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, max_position_embeddings=128)
    model = PauseModel.from_config(cfg, tok, num_steps=3, attn_implementation="sdpa")
    test = SyntheticDataset("addition", CharTokenizer(), 6, seed=3, split="test")
    s = score_model(model, test, batch_size=4)
    assert 1.0 <= s["mean_steps"] <= 3.0
    i = 0
    start = int(test.answer_start[i])
    for j in range(start, int(test.lengths[i])):  # each scored token from its own prefix
        prefix = test.ids[i : i + 1, :j]
        out = model(prefix, return_logits=True)
        token, _ = greedy_decision(out.logits[:, -1], dk_id=model.settings.dk_id, dk_bias=model.dk_bias)
        assert int(token) == int(s["predictions"][i, j])


def test_bad_settings_are_named():
    from cyb.demo import demo_settings

    with pytest.raises(ValueError, match="methods"):
        demo_settings(methods=["cyb", "nope"])
    with pytest.raises(ValueError, match="--task"):
        demo_settings("nope")
    with pytest.raises(ValueError, match="num_steps"):
        demo_settings(num_steps=1)
    with pytest.raises(ValueError, match=r"^train_steps \(--steps\) must be >= 1, got 0$"):
        demo_settings(train_steps=0)


@pytest.mark.parametrize("text,message", [
    (b"train_steps: abc\n", "train_steps: expected an integer, got 'abc'"),
    (b"methods: [cyb\n", "demo.yaml: not valid YAML: "),
    (b"seed: \xff\n", "demo.yaml is not UTF-8 text (byte 0xff: invalid start byte)"),
])
def test_a_bad_demo_config_is_a_value_error_naming_it(tmp_path, monkeypatch, text, message):
    from cyb.demo import demo_settings

    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo.yaml").write_bytes(text)
    with pytest.raises(ValueError) as e:
        demo_settings(config="demo.yaml")
    assert str(e.value).startswith(message)


def test_method_options_reach_the_run_configs_and_the_model():
    from cyb.demo import demo_settings, run_config

    s = demo_settings(quick=True, methods=["baseline", "cyb", "cyb_ponder"],
                      method_options={"cyb_ponder": {"ponder_cost": -0.05, "psi_dk": 0.5},
                                      "cyb": {"recipe": 2, "omega": [1, 1, 1, 1]}})
    ponder = run_config(s, "cyb_ponder").method
    assert (ponder.name, ponder.ponder_cost, ponder.psi_dk) == ("cyb_ponder", -0.05, 0.5)
    cyb = run_config(s, "cyb").method
    assert (cyb.recipe, cyb.omega, cyb.psi_dk) == (2, [1, 1, 1, 1], s.psi_dk)
    with pytest.raises(ValueError, match="not in methods"):
        demo_settings(methods=["cyb"], method_options={"cyb_ponder": {"ponder_cost": 0.1}})
    with pytest.raises(ValueError, match="not settable"):
        demo_settings(methods=["cyb"], method_options={"cyb": {"ponder_cost": 0.1}})
    with pytest.raises(ValueError, match="methods"):
        demo_settings(methods=["tbys_original"])
    with pytest.raises(ValueError, match="omega"):  # the run configuration's own checks apply
        demo_settings(methods=["cyb"], method_options={"cyb": {"recipe": 2, "omega": [1, 1]}})


def test_shipped_demo_configs_load():
    from pathlib import Path

    from cyb.demo import demo_settings

    paths = sorted((Path(__file__).resolve().parents[1] / "configs" / "demo").glob("*.yaml"))
    assert paths
    for path in paths:
        s = demo_settings(config=path)
        assert s.out_dir.startswith("runs/") and s.task == "multiplication"


def test_generate_from_prompt_text_matches_teacher_forced_scoring(quick_demo):
    """Text prompts get the ``<bos>`` the models were trained with, so the first greedy token of
    ``cyb.generate`` is the scored prediction at the first answer position."""
    from cyb.run_data import synthetic_sets
    from cyb.config import RunConfig
    from cyb.demo import score_model
    from cyb.generation import generate
    from cyb.model import PauseModel

    _, out, _ = quick_demo
    runs = json.loads((out / "settings.json").read_text())["runs"]
    _, test = synthetic_sets(RunConfig.from_dict(runs["cyb"]))
    rows = list(range(12))
    for method in ("baseline", "tbys", "cyb"):
        model = PauseModel.from_pretrained(out / "runs" / method / "final")
        predicted = score_model(model, test)["predictions"]
        first = [int(predicted[i, test.answer_start[i]]) for i in rows]
        results = generate(model, [test.prompts[i] for i in rows], max_new_tokens=1)
        assert all(r.prompt_ids[0] == test.ids[0, 0] for r in results)  # <bos>
        assert [r.token_ids[0] for r in results] == first, method


def test_decoding_cost_counts_positions_per_mode():
    from cyb.demo import decoding_cost, format_decoding

    class Result:
        def __init__(self, text, steps):
            self.text, self.steps = text, steps

    class Model:
        num_steps = 4

    class Data:
        prompts = ["1+1=", "2+2="]
        answers = ["2", "4"]

    import cyb.generation as generation

    calls = []

    def fake_generate(model, prompts, mode, max_new_tokens, max_batch):
        calls.append((mode, max_new_tokens))
        return [Result("2", [1, 2]), Result("5", [3, 1])]

    original = generation.generate
    generation.generate = fake_generate
    try:
        out = decoding_cost(Model(), Data())
    finally:
        generation.generate = original
    assert calls == [("fixed", 2), ("adaptive", 2)]
    assert out["fixed"]["positions_per_token"] == 4.0 and out["adaptive"]["positions_per_token"] == 7 / 4
    assert out["fixed"]["exact_match"] == 0.5
    assert "adaptive mode: exact match 50.0%, 1.75 positions per token" in format_decoding("cyb", out, 4)
    lost = {**out, "adaptive": {**out["adaptive"], "exact_match": 0.0}}
    assert "Recipe 1" in format_decoding("cyb", lost, 4)
    assert "Recipe 2 training" in format_decoding("cyb", lost, 4, recipe=2)


def _result(exact, acc, steps, decoding=None):
    r = {"exact_match": exact, "per_position_accuracy": acc, "per_position_steps": steps,
         "mean_steps": sum(steps) / len(steps)}
    if decoding:
        r["decoding"] = decoding
    return r


def test_reading_says_what_the_numbers_show():
    from cyb.demo import format_reading, hard_easy_steps, meets_criterion

    dec = {"fixed": {"exact_match": 0.9, "positions_per_token": 4.0},
           "adaptive": {"exact_match": 0.89, "positions_per_token": 1.7}}
    results = {"baseline": _result(0.01, [1.0, 0.4, 0.2, 1.0], [1, 1, 1, 1]),
               "tbys": _result(0.6, [1.0, 0.8, 0.7, 1.0], [4, 4, 4, 4]),
               "cyb": _result(0.01, [1.0, 0.4, 0.2, 1.0], [1, 1, 1, 1]),
               "cyb_decoupled": _result(0.9, [1.0, 0.95, 0.9, 1.0], [1.2, 2.5, 2.9, 1.0], dec)}
    assert hard_easy_steps(results, "cyb_decoupled") == pytest.approx((2.7, 1.2))
    assert meets_criterion(results, "cyb_decoupled") and not meets_criterion(results, "cyb")
    text = format_reading({"methods": results})
    assert "pauses pay: cyb_decoupled answers 90.0% exactly, the no-pause baseline 1.0%" in text
    assert ("\n- cyb_decoupled meets the demo's criterion: beats the no-pause baseline: yes (90.0% exact against 1.0%); "
            "within 0.5 points of TBYS, or above: yes (90.0% against 60.0%); more steps on the hard answer positions "
            "than on the easy ones: yes (E[S] 2.70 against 1.20); beyond the criterion, adaptive decoding keeps fixed "
            "mode's answers: yes (89.0% against 90.0%), at 2.4x fewer positions per token") in text
    assert ("\n- cyb does not meet the demo's criterion: beats the no-pause baseline: no (1.0% exact against 1.0%); "
            "within 0.5 points of TBYS, or above: no (1.0% against 60.0%); more steps on the hard answer positions "
            "than on the easy ones: no (E[S] 1.00 against 1.00)\n") in text
    assert text.startswith("What this run shows (one seed; docs/record/demo.md gives the spread over seeds, "
                           "docs/concepts/demo.md the criterion):\n")
    results["tbys"]["exact_match"] = results["cyb_decoupled"]["exact_match"] = 0.0
    assert "pauses do not pay in this run" in format_reading({"methods": results})


def test_the_verdict_gives_each_part_its_numbers_and_says_what_a_run_cannot_say():
    from cyb.demo import verdict

    lost = {"fixed": {"exact_match": 0.83, "positions_per_token": 4.0},
            "adaptive": {"exact_match": 0.0, "positions_per_token": 1.0}}
    results = {"baseline": _result(0.005, [1.0, 0.4, 0.2, 1.0], [1, 1, 1, 1]),
               "tbys": _result(0.994, [1.0, 1.0, 1.0, 1.0], [4, 4, 4, 4]),
               "cyb": _result(0.842, [1.0, 0.95, 0.9, 1.0], [1.0, 1.0, 1.02, 1.0], lost)}
    v = verdict(results, "cyb")
    assert v["meets_criterion"] is False
    assert v["beats_baseline"] == {"holds": True, "exact_match": 0.842, "baseline": 0.005}
    assert v["level_with_tbys"] == {"holds": False, "exact_match": 0.842, "tbys": 0.994}
    assert v["more_steps_when_hard"]["holds"] is False
    assert v["more_steps_when_hard"]["hard"] == pytest.approx(1.01)
    assert v["adaptive_keeps_answers"] == {"holds": False, "fixed": 0.83, "adaptive": 0.0, "fewer_positions": 4.0}
    json.dumps(v)  # as metrics.json stores it
    alone = verdict({"cyb": results["cyb"]}, "cyb")
    assert alone["meets_criterion"] is None and alone["beats_baseline"]["holds"] is None
    assert alone["more_steps_when_hard"] == {"holds": False, "hard": None, "easy": None}
    from cyb.demo import format_reading

    text = format_reading({"methods": {"cyb": results["cyb"]}})
    assert ("- cyb: the demo's criterion needs the baseline and TBYS in the run: beats the no-pause baseline: cannot "
            "say (no baseline in this run); within 0.5 points of TBYS, or above: cannot say (no TBYS in this run); ") in text
    assert text.endswith("adaptive decoding keeps fixed mode's answers: no (0.0% against 83.0%)")


def _modes(fixed, adaptive, fixed_positions=4.0, adaptive_positions=1.89):
    return {"fixed": {"exact_match": fixed, "positions_per_token": fixed_positions, "seconds": 0.1},
            "adaptive": {"exact_match": adaptive, "positions_per_token": adaptive_positions, "seconds": 0.2}}


def test_decoding_note_says_when_adaptive_mode_keeps_the_answers():
    from cyb.demo import decoding_note, format_decoding

    text = format_decoding("cyb_decoupled", _modes(0.938, 0.939), 4)
    assert "(adaptive mode feeds a pause only after <don't know>: here it keeps the exact match with 2.1x fewer " \
           "positions per token)" in text
    assert "Recipe 1" not in text
    # within two points is kept; nearly every pause taken saves nothing
    assert "keeps the exact match with" in decoding_note(_modes(0.938, 0.920))
    note = decoding_note(_modes(0.938, 0.938, adaptive_positions=3.9))
    assert "keeps the exact match but takes nearly every pause (3.90 positions per token against 4.00)" in note


def test_decoding_note_of_a_model_that_keeps_most_of_its_answers_gives_no_reason_for_failing():
    """cyb_decoupled kept 90.6% of 94.3% adaptively: no note on why adaptive mode fails."""
    from cyb.demo import decoding_note

    note = decoding_note(_modes(0.943, 0.906, adaptive_positions=2.02))
    assert note == ("adaptive mode feeds a pause only after <don't know>: here it keeps most of the exact match, "
                    "90.6% of 94.3% (3.7 points fewer), with 2.0x fewer positions per token")
    assert "Recipe" not in note and "never saw" not in note


def test_decoding_note_says_why_when_adaptive_mode_loses_most_answers():
    from cyb.demo import decoding_note

    lost = _modes(0.926, 0.002, adaptive_positions=1.04)
    note = decoding_note(lost)
    assert "here it loses most of its answers (0.2% against 92.6%)" in note and "Recipe 1" in note
    assert "Recipe 2 training" in decoding_note(lost, recipe=2)
    assert "keeps" not in note


def test_decoding_note_of_a_model_that_learned_little_compares_nothing():
    from cyb.demo import decoding_note

    note = decoding_note(_modes(0.004, 0.006))
    assert "answers only 0.4% of the prompts exactly, too few to say what adaptive mode keeps" in note
    assert "keeps the exact match" not in note and "Recipe" not in note


def test_decoding_note_of_private_pauses():
    from cyb.demo import decoding_note

    same = decoding_note(_modes(0.5, 0.5), visibility="private")
    assert same.startswith("private pauses: no token reads another token's pauses") and "2.1x fewer" in same
    differs = decoding_note(_modes(0.5, 0.3), visibility="private")
    assert "should make fixed mode's decisions, yet it answers 30.0% exactly against 50.0%" in differs
    assert decoding_note({"fixed": _modes(0.5, 0.5)["fixed"]}) == ""


def test_reading_gives_the_mean_steps_where_no_position_is_hard():
    from cyb.demo import format_reading

    flat = [1.0, 1.0, 1.0, 1.0]
    results = {"baseline": _result(0.9, flat, [1, 1, 1, 1]), "tbys": _result(0.9, flat, [4, 4, 4, 4]),
               "cyb": _result(0.9, flat, [1.5, 1.5, 1.5, 1.5])}
    text = format_reading({"methods": results})
    assert ("; more steps on the hard answer positions than on the easy ones: no (no answer position is harder "
            "than the others in this run; E[S] 1.50)") in text
    assert "- cyb does not meet the demo's criterion" in text and "pauses do not pay in this run" in text


def test_the_demo_resumes_when_interrupted_runs_again_and_starts_afresh(quick_demo, tmp_path, capsys):
    """An interrupted demo resumes its run from the last checkpoint; a finished one runs again
    (its runs reused); other settings in the same folder stop with the way out, --fresh."""
    import os
    import subprocess
    import sys

    from cyb.checkpoint import FAULT_ENV, latest_checkpoint
    from cyb.metrics_log import read_metrics

    out = tmp_path / "demo"
    args = ["demo", "--quick", "--out", str(out), "--no-progress"]
    env = {**os.environ, FAULT_ENV: "checkpoint_write@12", "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([sys.executable, "-m", "cyb", *args], env=env, capture_output=True, text=True,
                            timeout=600)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert latest_checkpoint(out / "runs" / "baseline").step == 9
    capsys.readouterr()

    assert main(args) == 0
    printed = capsys.readouterr()
    assert "out_dir " in printed.err and "resumed at step 9" in printed.err
    steps = [r["step"] for r in read_metrics(out / "runs" / "baseline", "train")]
    assert steps == sorted(set(steps)) and steps[-1] == 30
    _, first, _ = quick_demo
    before = json.loads((first / "metrics.json").read_text())["methods"]
    after = json.loads((out / "metrics.json").read_text())["methods"]
    for method, r in after.items():
        assert r["ppl"] == pytest.approx(before[method]["ppl"], rel=1e-3), method

    assert main(args) == 0  # again: every run is reused, the report is written again
    printed = capsys.readouterr().out
    assert printed.count("trained already in ") == 4 and "| cyb_decoupled | 4 |" in printed
    again = json.loads((out / "metrics.json").read_text())["methods"]
    assert {m: r["train_seconds"] for m, r in again.items()} == {m: r["train_seconds"] for m, r in after.items()}

    assert main([*args, "--seed", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "train.seed was 0, now 1" in err and "add --fresh to train them afresh, or give another --out" in err
    assert "\n" not in err
    assert main([*args, "--seed", "1", "--fresh"]) == 0
    printed = capsys.readouterr().out
    assert f"removed {out / 'runs' / 'baseline'} (--fresh)" in printed and "trained already" not in printed


def test_a_gated_demo_records_its_gates_and_what_passes_them(tmp_path):
    out = tmp_path / "gated"
    rc = main(["demo", "--quick", "--visibility", "gated", "--methods", "cyb", "--out", str(out), "--no-progress"])
    assert rc == 0
    cyb = json.loads((out / "metrics.json").read_text())["methods"]["cyb"]
    layers = len(cyb["pause_gates"])
    assert len(cyb["foreign_attention"]) == layers and all(0 <= x < 1 for x in cyb["foreign_attention"])

"""``cyb eval``: perplexity, latency, calibration, pause statistics and shaded text."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from cyb import losses
from cyb.analysis import (calibration, latency_summary, pause_statistics, perplexity_summary, quadrant_table,
                          relative_improvement, spearman, token_pause_stats)
from cyb.eval.data import resolve_data
from cyb.cli import main
from cyb.config import RunConfig
from cyb.eval import evaluate, resolve_target
from cyb.report import html

METHODS = ("baseline", "tbys", "cyb")
M = 3


def tiny_config(method: str, out_dir: Path) -> RunConfig:
    """A run that trains in about a second on a CPU: addition, hidden 32, 2 layers."""
    return RunConfig.from_dict({
        "model": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "max_position_embeddings": 128},
        "method": {"name": method, "num_steps": M},
        "data": {"task": "addition", "task_kwargs": {"digits": 2}, "num_train_examples": 128,
                 "num_valid_examples": 20},
        "optim": {"lr": 3e-3, "warmup_steps": 2},
        "train": {"out_dir": str(out_dir), "steps": 8, "batch_size": 8, "eval_every": 0, "eval_batches": 2,
                  "save_every": 0, "log_every": 4, "progress": False, "device": "cpu"},
    }).validate()


def make_tiny_runs(root: Path) -> dict[str, Path]:
    """Train baseline, TBYS and CYB tiny runs under ``root`` (once per test session)."""
    from cyb.train import train

    runs = {}
    for method in METHODS:
        out = root / method
        if not (out / "final_metrics.json").is_file():
            train(tiny_config(method, out))
        runs[method] = out
    return runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    return make_tiny_runs(tmp_path_factory.getbasetemp() / "cyb-tiny-runs")


# ------------------------------------------------------------------ end to end


@pytest.mark.parametrize("method", METHODS)
def test_eval_writes_outputs(runs, method, tmp_path):
    out = tmp_path / "eval"
    metrics = evaluate(runs[method], out_dir=out, progress=False, max_tokens=None)
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["target"]["method"] == method
    ppl = saved["perplexity"]
    assert math.isfinite(ppl["ppl"]) and ppl["ppl"] > 1 and ppl["tokens"] > 0
    assert all(math.isfinite(x) for x in ppl["by_step"])
    assert (out / "summary.txt").read_text().startswith(metrics["target"]["name"])
    if method == "cyb":
        lat = saved["latency"]
        assert 1.0 <= lat["mean_steps"] <= M
        assert sum(lat["stop_dist"]) == pytest.approx(1.0, abs=1e-6)
        assert sum(lat["pauses_hist"]["counts"]) == ppl["tokens"]
        assert [c["step"] for c in saved["calibration"]] == list(range(1, M))
        assert saved["pause_stats"]["tokens"] > 0
        for name in ("latency.png", "calibration.png", "shaded.html", "pause_stats.md"):
            assert (out / name).stat().st_size > 0, name
        page = (out / "shaded.html").read_text()
        assert 'id="legend"' in page
        values = [float(v) for v in re.findall(r'data-pauses="([0-9.]+)"', page)]
        assert values and all(0.0 <= v <= M - 1 + 1e-6 for v in values)
    else:
        assert "latency" not in saved and not (out / "shaded.html").exists()


@pytest.mark.parametrize("method", METHODS)
def test_eval_perplexity_equals_training_held_out(runs, method):
    """By default cyb eval reads the rows of training's final evaluation (eval_batches x
    batch_size) -> the same perplexity, token count and step."""
    final = json.loads((runs[method] / "final_metrics.json").read_text())
    cfg = RunConfig.load(runs[method] / "config.yaml")
    rows = cfg.train.eval_batches * cfg.train.batch_size
    metrics = evaluate(runs[method], batch_size=5, progress=False, write=False)
    assert metrics["data"]["sequences"] == rows < cfg.data.num_valid_examples
    assert metrics["target"]["step"] == final["step"] == cfg.train.steps
    assert metrics["perplexity"]["tokens"] == final.get("targets", final.get("tokens"))
    assert metrics["perplexity"]["ppl"] == pytest.approx(final["ppl"], rel=1e-5)
    if method == "cyb":
        assert metrics["latency"]["mean_steps"] == pytest.approx(final["mean_steps"], rel=1e-5)


def _text_run(root: Path, method: str, **method_kw) -> Path:
    from cyb.data.tokenizer import train_bpe_tokenizer
    from cyb.train import train

    words = "the kernel pause token model step loss data block of to and is in".split()
    docs = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(30 + i % 17)) for i in range(80)]
    for name, part in (("train", docs[:60]), ("valid", docs[60:])):
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in part))
    if not (root / "bpe" / "tokenizer.json").is_file():
        train_bpe_tokenizer(docs, 300, root / "bpe")
    out = root / method
    train(RunConfig.from_dict({
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "max_position_embeddings": 256},
        "method": {"name": method, "num_steps": M, **method_kw},
        "data": {"source": str(root / "train.jsonl"), "valid_source": str(root / "valid.jsonl"),
                 "tokenizer": str(root / "bpe"), "block_len": 12},
        "optim": {"lr": 3e-3, "warmup_steps": 2},
        "train": {"out_dir": str(out), "steps": 6, "batch_size": 4, "eval_every": 0, "eval_batches": 0,
                  "save_every": 0, "log_every": 3, "progress": False, "device": "cpu"},
    }).validate())
    return out


@pytest.mark.parametrize("method,kw", [("cyb", {}), ("baseline_nx", {"seq_multiplier": 2})])
def test_eval_of_a_text_run_matches_its_final_evaluation(tmp_path, method, kw):
    """Whole held-out file (eval_batches 0), rows of data.block_len for every method."""
    run = _text_run(tmp_path, method, **kw)
    final = json.loads((run / "final_metrics.json").read_text())
    metrics = evaluate(run, batch_size=3, progress=False, write=False)
    assert metrics["data"]["block_len"] == 12
    assert metrics["perplexity"]["tokens"] == final["targets"]
    assert metrics["perplexity"]["ppl"] == pytest.approx(final["ppl"], rel=1e-5)
    state = json.loads((run / "final" / "training_state.json").read_text())
    assert state["step"] == final["step"] == 6 and state["epochs"] > 0
    assert metrics["target"]["epochs"] == pytest.approx(state["epochs"])


@pytest.mark.parametrize("method", ["cyb", "baseline"])
def test_eval_data_scores_every_token_of_every_document(tmp_path, method):
    """--data FILE: a document longer than a row and two shorter than one (an empty one has no
    token): every token of each, and the end-of-sequence token after it, is a target exactly once."""
    from cyb.data.tokenizer import eos_token_id
    from cyb.eval.collect import collect_records
    from cyb.eval import load_model

    run = _text_run(tmp_path, method)
    docs = ["the kernel pause token model step loss data block of to and is in " * 3, "the loss", "", "data block"]
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    metrics = evaluate(run, data=str(small), max_tokens=None, batch_size=3, progress=False, write=False)
    target = resolve_target(run)
    model = load_model(target, device="cpu")
    tok = model.tokenizer
    eos = eos_token_id(tok)
    stream = [i for d in docs if d for i in [*tok(d, add_special_tokens=False)["input_ids"], eos]]
    assert metrics["perplexity"]["tokens"] == len(stream) and len(stream) > 12  # more than one row of block_len 12
    assert metrics["data"]["documents"] == 3 and metrics["data"]["complete"]
    spec = resolve_data(target.config, str(small))
    assert spec.whole and spec.block_len == 12
    rec = collect_records(model, target.config.method, spec.batches(tok, 3), progress=False)
    assert rec.target_ids.tolist() == stream  # in order, none twice, none left out
    assert "(every token of its 3 document(s))" in evaluate.__globals__["format_summary"](metrics)
    one = tmp_path / "one.txt"
    one.write_text("the loss")  # shorter than any block: still scored
    short = evaluate(run, data=str(one), block_len=256, progress=False, write=False)
    assert short["perplexity"]["tokens"] == len(tok("the loss", add_special_tokens=False)["input_ids"]) + 1
    cut = evaluate(run, data=str(small), max_tokens=5, batch_size=1, progress=False, write=False)
    assert not cut["data"]["complete"] and "--tokens 0 scores them all" in evaluate.__globals__["format_summary"](cut)


@pytest.mark.parametrize("method,visibility", [("cyb", "private"), ("cyb", "shared"), ("tbys", "shared"),
                                               ("baseline", "shared")])
def test_eval_generate_on_a_text_run_counts_the_positions_of_its_continuations(tmp_path, method, visibility):
    """--generate N on a text run: N held-out rows continued in fixed mode (M positions a token)
    and, with dk, adaptively (1 to M), each continuation what generate() gives its prompt alone;
    the summary says so; the perplexity is the one without --generate."""
    from cyb.eval import load_model
    from cyb.eval.text_generation import NEW_TOKENS, held_out_prompts
    from cyb.generation import generate

    kw = {"pause_visibility": visibility} if method == "cyb" else {}
    run = _text_run(tmp_path, method, **({"num_steps": 1} if method == "baseline" else kw))
    plain = evaluate(run, batch_size=3, progress=False, write=False)
    metrics = evaluate(run, batch_size=3, progress=False, write=False, generate=5)
    assert metrics["perplexity"] == plain["perplexity"] and "generation" not in plain
    g = metrics["generation"]
    m = 1 if method == "baseline" else M
    assert g["prompts"] == 5 and g["new_tokens"] == NEW_TOKENS and g["prompt_tokens"] == 6  # half a row of 12
    assert g["fixed"]["positions_per_token"] == m
    if method == "cyb":
        assert 1.0 <= g["adaptive"]["positions_per_token"] <= M and 0.0 <= g["adaptive"]["same_as_fixed"] <= 1.0
    else:
        assert "adaptive" not in g
    target = resolve_target(run)
    model = load_model(target, device="cpu")
    spec = resolve_data(target.config)
    prompts = held_out_prompts(spec.batches(model.tokenizer, 3), 5)
    [first] = generate(model, [prompts[0]], mode="adaptive" if method == "cyb" else "fixed",
                       max_new_tokens=NEW_TOKENS, eos_token_ids=())
    assert len(first.token_ids) == NEW_TOKENS  # an end-of-sequence token does not stop it
    lines = evaluate.__globals__["format_summary"](metrics)
    assert f"generation: {NEW_TOKENS} tokens after the first 6 tokens (mean) of 5 held-out rows" in lines
    assert f"fixed mode: {m:.2f} positions per token" in lines


def test_held_out_prompts_take_at_most_half_a_row():
    import torch

    from cyb.eval.text_generation import held_out_prompts

    rows = [{"ids": torch.arange(12).view(2, 6)},
            {"ids": torch.arange(300).view(1, 300), "attention_mask": torch.ones(1, 300, dtype=torch.long)},
            {"ids": torch.arange(8).view(1, 8), "attention_mask": torch.tensor([[1, 0, 0, 0, 0, 0, 0, 0]])}]
    got = held_out_prompts(rows, 10)
    assert got == [[0, 1, 2], [6, 7, 8], list(range(128))]  # a row of one real token gives none
    assert held_out_prompts(rows, 1) == [[0, 1, 2]]


def test_eval_of_held_out_blocks_too_long_for_the_data_names_block_len(tmp_path):
    from cyb.eval.data import EvalData

    run = _text_run(tmp_path, "baseline")
    cfg = RunConfig.load_run(run)
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("the loss")
    spec = EvalData("text", str(tiny), cfg, str(tiny), block_len=64)  # blocks as the run's evaluations cut them
    model = evaluate.__globals__["load_model"](resolve_target(run), device="cpu")
    with pytest.raises(ValueError, match=r"holds 0 block\(s\) of block_len=64 .*give a smaller --block-len, or "
                                         r"--data FILE, which scores every token"):
        list(spec.batches(model.tokenizer, 2))


def test_eval_of_a_gated_run_reports_what_its_gates_let_through(tmp_path):
    """A gated run's evaluation gives each layer's gates and the share of attention on other
    tokens' pauses (a few tenths of a percent at the starting -8 after 6 steps), and says so."""
    from cyb.eval.evaluate import format_summary

    run = _text_run(tmp_path, "cyb", pause_visibility="gated")
    final = json.loads((run / "final_metrics.json").read_text())
    metrics = evaluate(run, batch_size=3, progress=False, write=False)
    assert metrics["perplexity"]["ppl"] == pytest.approx(final["ppl"], rel=1e-5)  # the recorder changes nothing
    gated = metrics["gated"]
    assert len(gated["gate_bias"]) == len(gated["foreign_attention"]) == 1
    assert all(-9 < b < -7 for b in gated["gate_bias"][0]) and 0 < gated["foreign_attention"][0] < 0.05
    assert "attention on other tokens' pauses, per layer:" in format_summary(metrics)


def test_eval_reference_and_relative_improvement(runs, tmp_path):
    tbys = evaluate(runs["tbys"], out_dir=tmp_path / "tbys", max_tokens=30, progress=False)
    by_dir = evaluate(runs["cyb"], reference=runs["tbys"], max_tokens=30, progress=False, write=False)
    assert by_dir["reference"]["ppl"] == pytest.approx(tbys["perplexity"]["ppl"], rel=1e-9)
    assert "warning" not in by_dir["reference"]
    ref = tbys["perplexity"]["ppl"]
    want = (ref - by_dir["perplexity"]["ppl"]) / ref * 100
    assert by_dir["relative_improvement_pct"] == pytest.approx(want)
    by_file = evaluate(runs["cyb"], reference=tmp_path / "tbys" / "metrics.json", max_tokens=30, progress=False,
                       write=False)
    assert by_file["relative_improvement_pct"] == pytest.approx(want)


def test_eval_accepts_final_folder_and_task_data(runs):
    metrics = evaluate(runs["cyb"] / "final", data="task:addition", max_tokens=10, batch_size=4,
                       progress=False, write=False)
    assert metrics["target"]["run_dir"] == str(runs["cyb"])
    assert metrics["perplexity"]["tokens"] >= 10
    assert metrics["data"]["kind"] == "synthetic"


def test_cli_eval(runs, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["eval", str(runs["cyb"]), "--out", str(out), "--tokens", "20", "--batch-size", "4",
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "perplexity" in text and "calibration step 1" in text
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["command"].startswith("cyb eval")
    assert saved["data"]["batch_size"] == 4


def test_cli_eval_errors(runs, tmp_path, capsys):
    assert main(["eval", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["eval", str(tmp_path / "empty")]) == 2
    assert "neither a run folder" in capsys.readouterr().err
    assert main(["eval", str(runs["cyb"]), "--data", "some/text.jsonl", "--no-progress"]) == 2
    assert "synthetic task" in capsys.readouterr().err
    assert main(["eval", str(runs["cyb"]), "--batch-size", "0", "--no-progress"]) == 2
    assert "--batch-size" in capsys.readouterr().err


def test_resolve_target_errors(tmp_path):
    with pytest.raises(ValueError, match="is a file"):
        (tmp_path / "x.txt").write_text("x")
        resolve_target(tmp_path / "x.txt")
    run = tmp_path / "unfinished"
    run.mkdir()
    RunConfig().dump(run / "config.yaml")
    (run / "run.json").write_text("{}")
    with pytest.raises(ValueError, match="training has not finished"):
        resolve_target(run)
    with pytest.raises(ValueError, match="needs --data"):
        resolve_data(None, None)


# ------------------------------------------------------------------ analyses on hand-made numbers


def _terms(n=50, m=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    lt = torch.log(torch.rand(n, m, generator=g).clamp(1e-3, 1))
    d = torch.rand(n, m, generator=g).clamp(1e-3, 1 - 1e-3)
    return lt, d.log(), (-d).log1p()


def test_perplexity_summary_matches_losses():
    lt, ld, lnd = _terms()
    out = perplexity_summary(lt, ld, lnd, method="cyb")
    assert out["loss"] == pytest.approx(float(losses.cyb_loss(lt.double(), ld.double(), lnd.double()).mean()))
    assert out["ppl"] == pytest.approx(math.exp(out["loss"]))
    assert out["by_step"] == pytest.approx([math.exp(float(-lt[:, i].double().mean())) for i in range(4)])
    assert "train_setting" not in out
    omega, gamma = [1, 1, 1, 1], [1, 0.9, 0.81, 0.729]
    ts = perplexity_summary(lt, ld, lnd, method="cyb", omega=omega, gamma=gamma)["train_setting"]
    want = losses.cyb_loss(lt.double(), ld.double(), lnd.double(), omega=omega, gamma=gamma).mean()
    assert ts["loss"] == pytest.approx(float(want))
    plain = perplexity_summary(lt, ld, lnd, method="tbys")
    assert plain["loss"] == pytest.approx(float(-lt[:, -1].double().mean()))


def test_relative_improvement_reproduces_paper_table():
    # appendix F, fine-tuned Gemma3-4B: reference TBYS 3 pauses at 10.359
    for ppl, printed in ((10.670, -3.00), (10.512, -1.48), (10.351, 0.08), (10.131, 2.20)):
        assert round(relative_improvement(ppl, 10.359), 2) == printed
    with pytest.raises(ValueError, match="reference perplexity"):
        relative_improvement(10.0, 0.0)


def test_latency_summary_known_distribution():
    # d = (0.5, 0.5, .): Pr(S) = (0.5, 0.25, 0.25), E[S] = 1.75
    d = torch.tensor([[0.5, 0.5, 0.3]] * 4)
    lat = latency_summary(d.log(), (-d).log1p())
    assert lat["stop_dist"] == pytest.approx([0.5, 0.25, 0.25])
    assert lat["mean_steps"] == pytest.approx(1.75)
    assert lat["mean_pauses"] == pytest.approx(0.75)
    assert sum(lat["pauses_hist"]["counts"]) == 4
    assert lat["pauses_hist"]["edges"][0] == 0 and lat["pauses_hist"]["edges"][-1] == 2


def test_spearman_positive_correlation():
    rng = np.random.default_rng(0)
    x = rng.normal(size=500)
    rho, p = spearman(x, x + 0.5 * rng.normal(size=500))
    assert rho > 0.8 and p < 1e-10
    assert all(math.isnan(v) for v in spearman(np.ones(10), x[:10]))


def test_calibration_detects_helpful_pauses():
    """d_1 large exactly where t rises from step 1 to step 2."""
    rng = np.random.default_rng(1)
    n = 400
    gain = rng.uniform(0, 0.5, n)
    t1 = rng.uniform(0.1, 0.4, n)
    t = np.stack([t1, t1 + gain, t1 + gain], 1)
    d = np.stack([np.clip(gain * 1.8 + rng.normal(0, 0.05, n), 0.01, 0.99), np.full(n, 0.5), np.full(n, 0.2)], 1)
    d[:, 1] += rng.uniform(-0.01, 0.01, n)
    steps = calibration(torch.tensor(np.log(t)), torch.tensor(np.log(d)), bins=10)
    assert [s["step"] for s in steps] == [1, 2]
    assert steps[0]["spearman"] > 0.8 and steps[0]["p_value"] < 1e-10
    assert math.isnan(steps[1]["spearman"])  # t_3 - t_2 is constant
    assert sum(map(sum, steps[0]["density"]["counts"])) == n


def test_pause_quadrants_hand_made():
    keys, values = [], []
    data = {"lowlow": [0.1] * 6, "highlow": [2.0] * 6, "lowhigh": [0.0, 1.0] * 3, "highhigh": [1.0, 3.0] * 3,
            "mid": [0.5, 0.6, 0.5, 0.6, 0.5, 0.6], "rare": [3.0]}
    for k, vs in data.items():
        keys += [k] * len(vs)
        values += vs
    stats = token_pause_stats(keys, values, min_count=5)
    assert {s.token for s in stats} == set(data) - {"rare"}
    by = {s.token: s for s in stats}
    assert by["highhigh"].median == pytest.approx(2.0) and by["highhigh"].variance == pytest.approx(1.0)
    table = quadrant_table(stats, top_k=3)
    cells = {c: [s["token"] for s in v] for c, v in table["cells"].items()}
    assert "lowlow" in cells["low_median_low_variance"]
    assert cells["high_median_low_variance"] == ["highlow"]
    assert cells["low_median_high_variance"] == ["lowhigh"]
    assert cells["high_median_high_variance"] == ["highhigh"]
    assert table["split"]["median"] == pytest.approx(0.55)
    full = pause_statistics(keys, values, min_count=5, top_k=2, attribution="target")
    assert full["attribution"] == "target" and [s["token"] for s in full["highest_median"]] == ["highhigh", "highlow"]
    with pytest.raises(ValueError, match="attribution"):
        pause_statistics(keys, values, attribution="next")


def test_shaded_html_spans_legend_and_monotone_colours():
    values = [None, 0.0, 0.4, 1.1, 2.0, 2.9, 3.0]
    passage = [(f"t{i}<&", v) for i, v in enumerate(values)]
    page = html.shaded_text_page([passage], 3.0)
    assert "Legend" in page and 'id="legend"' in page
    spans = re.findall(r'<span class="tok[^"]*"[^>]*>', page)
    assert len(spans) == len(values)
    assert page.count("t1&lt;&amp;") == 1  # text is escaped
    colours = [html.shade_color(v, 3.0) for v in values[1:]]
    rgb = [tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in colours]
    for a, b in zip(rgb, rgb[1:]):
        assert all(x >= y for x, y in zip(a, b))
    assert colours[0] == "#ffffff" and colours[-1] == "#08306b"
    for span, v in zip(spans[1:], values[1:]):
        assert html.shade_color(v, 3.0) in span


def test_fused_readout_gives_the_same_numbers(runs):
    naive = evaluate(runs["cyb"], impl="naive", progress=False, write=False, max_tokens=None)
    fused = evaluate(runs["cyb"], impl="fused", progress=False, write=False, max_tokens=None)
    assert fused["perplexity"]["ppl"] == pytest.approx(naive["perplexity"]["ppl"], rel=1e-5)
    assert fused["latency"]["stop_dist"] == pytest.approx(naive["latency"]["stop_dist"], abs=1e-5)


def test_bare_model_on_text(runs, tmp_path):
    """A model folder outside its run, on a text file packed into blocks (of its task's characters:
    others it never saw are refused, tests/test_text_check.py)."""
    model_dir = tmp_path / "model"
    shutil.copytree(runs["cyb"] / "final", model_dir)
    text = tmp_path / "held_out.txt"
    text.write_text("12+34=46=5+5=10=7+8=15=" * 20)
    metrics = evaluate(model_dir, data=str(text), block_len=16, batch_size=3, max_tokens=100,
                       out_dir=tmp_path / "out", progress=False)
    assert metrics["target"]["run_dir"] is None and metrics["target"]["name"] == "CYB 2 pauses"
    assert metrics["data"]["kind"] == "text" and metrics["data"]["block_len"] == 16
    assert metrics["perplexity"]["tokens"] >= 100 and math.isfinite(metrics["perplexity"]["ppl"])
    page = (tmp_path / "out" / "shaded.html").read_text()
    assert page.count('class="tok') == 3 * 16  # three passages of one block each


def test_collect_records_original_tbys_layout(runs):
    """tbys_original rows (random pauses, advancing positions): one readout per target."""
    from cyb.eval.collect import collect_records
    from cyb.eval.data import resolve_data
    from cyb.config import MethodConfig
    from cyb.eval import load_model, resolve_target

    target = resolve_target(runs["tbys"])
    model = load_model(target, device="cpu")
    data = resolve_data(target.config)
    method = MethodConfig(name="tbys_original", num_steps=M, random_pause_fraction=0.5)
    rec = collect_records(model, method, data.batches(model.tokenizer, 8), progress=False)
    direct = collect_records(model, target.config.method, data.batches(model.tokenizer, 8), progress=False)
    assert rec.num_steps == 1 and rec.num_tokens == direct.num_tokens
    assert torch.equal(rec.target_ids, direct.target_ids)
    assert bool(torch.isfinite(rec.log_t).all()) and not rec.passages

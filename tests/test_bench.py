"""Benchmarks (``cyb bench``), the previous release's static-batch decoder, make_docs and the
kernel changes.

CPU only (tiny shapes): every benchmark command runs ``--quick`` and writes JSON; the static-batch
baseline gives the library decoder's greedy tokens; the Hugging Face labels of the TBYS variant
give the objective's TBYS loss; targets and tables come out of small hand-made results; the
fused loss keeps its errors when its checks are deferred (as on CUDA) and runs in the autocast
dtype under autocast.  Tests marked ``gpu`` run the CUDA-graph decoder and the autocast fused
loss on a GPU.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from benchmarks import make_docs
from cyb.bench import flops, targets
from cyb.bench.models import spread_weights
from cyb.bench.models import SHAPE_TINY, build_hf_model, pause_settings, random_ids, wrap
from cyb.bench.static_batches import StaticFixedDecoder
from cyb.bench.markdown import decode_table, loss_table, train_table
from cyb.bench.timing import Budget, guarded, median, time_calls
from cyb.cli import main
from cyb.generation.decoders import FixedDecoder, StepReadout

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_thread")


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------ the commands


def test_bench_train_quick_writes_json(tmp_path, capsys):
    out = tmp_path / "train.json"
    assert main(["bench", "train", "--quick", "--out", str(out), "--warmup", "0",
                 "--real-tokens", "8"]) == 0
    res = _read(out)
    assert res["kind"] == "train" and res["command"].startswith("cyb bench train")
    assert "--quick" in res["command"] and "--warmup 0" in res["command"]
    rows = {r["variant"]: r for r in res["results"]}
    assert set(rows) == {"baseline_hf", "tbys_hf", "tbys_liger", "cyb_naive", "cyb_fused",
                         "cyb_fused_lowmem", "cyb_private", "tbys_private", "cyb_private_split",
                         "cyb_gated", "cyb_gated_dense", "cyb_gated_flex", "cyb_gated_split"}
    assert rows["tbys_liger"]["status"] == "skipped"  # needs CUDA
    assert rows["cyb_gated_flex"]["status"] == "skipped"  # (FlexAttention has no backward on the CPU)
    for name in ("baseline_hf", "tbys_hf", "cyb_naive", "cyb_fused", "cyb_fused_lowmem", "cyb_private",
                 "tbys_private", "cyb_private_split", "cyb_gated", "cyb_gated_dense", "cyb_gated_split"):
        r = rows[name]
        assert r["status"] == "ok", r
        assert r["ms"] > 0 and math.isfinite(r["first_loss"])
        assert r["kernel_ms"] is None and r["gpu_busy"] is None  # (CUDA only)
        assert r["real_tokens_per_step"] == 2 * 8
        assert r["positions_per_step"] == 2 * 8 * (1 if name == "baseline_hf" else 4)
    # same weights and batch: the fused and the naive CYB loss agree at the first step
    for name in ("cyb_fused", "cyb_fused_lowmem"):
        assert rows[name]["first_loss"] == pytest.approx(rows["cyb_naive"]["first_loss"], rel=1e-5)
    # the kernels of one layout agree with each other
    assert rows["cyb_gated"]["first_loss"] == pytest.approx(rows["cyb_gated_dense"]["first_loss"], rel=1e-5)
    assert rows["cyb_private_split"]["first_loss"] == pytest.approx(rows["cyb_private"]["first_loss"], rel=1e-5)
    assert any("first-step loss" in c["target"] and c["met"] for c in res["targets"])
    assert "| cyb_fused |" in capsys.readouterr().out


def test_bench_decode_quick_writes_json(tmp_path):
    """Every layout: the rows each implementation has, the float32 checks, the offline job and
    the loglikelihood scoring run."""
    out = tmp_path / "decode.json"
    assert main(["bench", "decode", "--quick", "--out", str(out), "--batches", "1", "2", "--prompt-len", "4",
                 "--new-tokens", "3", "--visibility", "shared", "private", "gated", "--offline", "6"]) == 0
    res = _read(out)
    assert res["kind"] == "decode"
    assert all(r["status"] == "ok" for r in res["results"]), res["results"]
    cases = {(r["impl"], r["visibility"], r["mode"], r["num_steps"]) for r in res["results"]}
    want = {(i, "none", "fixed", 1) for i in ("hf_eager", "eager", "static_batches", "engine_one")}
    want.add(("hf_eager", "shared", "fixed", 4))
    for vis in ("shared", "private", "gated"):
        impls = ("eager", "engine_block") + (() if vis == "gated" else ("static_batches",))
        want |= {(i, vis, "fixed", 4) for i in impls}
        want |= {(i, vis, "adaptive", 4) for i in impls + ("eager_pos", "engine_one")}
    assert cases == want
    for r in res["results"]:
        assert r["real_tokens_per_s"] > 0 and 1 <= r["steps_per_token"] <= r["num_steps"]
        if r["impl"] == "engine_one" and r["mode"] == "adaptive":  # a position per step
            assert 1 <= r["positions_per_token"] <= r["num_steps"]
        if r["impl"] == "engine_block":
            assert r["positions_per_token"] == r["num_steps"]
    for vis in ("shared", "private", "gated"):
        check = res[f"agreement_fp32 {vis}"]
        assert check["status"] == "ok" and check["equal"], check
    jobs = {(j["impl"], j["visibility"]): j for j in res["offline"]}
    assert set(jobs) == {("engine", v) for v in ("shared", "private", "gated")} | {
        ("static_batches", v) for v in ("shared", "private")}
    assert all(j["status"] == "ok" and j["real_tokens"] > 0 for j in jobs.values())
    assert jobs[("engine", "shared")]["real_tokens"] == jobs[("static_batches", "shared")]["real_tokens"]
    ll = res["loglikelihood"]
    assert ll["status"] == "ok" and ll["max_abs_difference"] < 1e-3
    names = [c["target"] for c in res["targets"]]
    assert any("best engine" in n for n in names) and any("offline job" in n for n in names)
    assert any("recompute decoder" in n for n in names)
    assert sum(n.startswith("engine tokens == eager") for n in names) == 3


def test_bench_decode_times_a_saved_model(tmp_path, capsys):
    """``cyb bench decode --model DIR --prompts FILE``: the rows of a trained model, its own
    ``M`` and dk decisions, text prompts of different lengths (no plain HF rows)."""
    from generation_helpers import build

    pm = build("llama", "cyb")
    folder = pm.save_pretrained(tmp_path / "model")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("12+34=\n7+8=\n\n", encoding="utf-8")
    out = tmp_path / "decode.json"
    assert main(["bench", "decode", "--quick", "--model", str(folder), "--prompts", str(prompts),
                 "--batches", "2", "--new-tokens", "3", "--impls", "eager", "engine_one", "engine_block",
                 "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["trained_model"]["num_steps"] == pm.num_steps and "2 prompts" in res["trained_model"]["prompts"]
    rows = {(r["impl"], r["mode"], r["num_steps"]): r for r in res["results"]}
    assert set(rows) == {("eager", "fixed", 3), ("engine_block", "fixed", 3), ("eager", "adaptive", 3),
                         ("engine_one", "adaptive", 3), ("engine_block", "adaptive", 3)}
    assert all(r["status"] == "ok" for r in rows.values())
    assert "agreement_fp32 shared" not in res and "offline" not in res
    assert main(["bench", "decode", "--quick", "--prompts", str(prompts)]) == 2
    prompts.write_bytes("café\n".encode("latin-1"))
    assert main(["bench", "decode", "--quick", "--model", str(folder), "--prompts", str(prompts)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"{prompts} is not UTF-8 text (byte 0xe9: invalid continuation byte)")


def test_bench_decode_takes_a_run_folder_as_eval_and_generate_do(tmp_path, capsys):
    import shutil

    from generation_helpers import build

    run = tmp_path / "run"
    build("llama", "cyb").save_pretrained(run / "final")
    (run / "config.yaml").write_text("train: {out_dir: run}\n")
    out = tmp_path / "decode.json"
    assert main(["bench", "decode", "--quick", "--model", str(run), "--batches", "1", "--new-tokens", "2",
                 "--impls", "eager", "--modes", "fixed", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["trained_model"]["path"] == str(run / "final")
    shutil.rmtree(run / "final")
    for model, message in [(run, "is a run folder whose training has not finished"),
                           (tmp_path / "nothing", "--model " + str(tmp_path / "nothing") + " does not exist")]:
        capsys.readouterr()
        assert main(["bench", "decode", "--quick", "--model", str(model)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("cyb bench: error: ") and message in err and "\n" not in err


def test_bench_loss_quick_writes_json(tmp_path, monkeypatch):
    # the script imports triton to record its version: keep a later interpreted-triton test
    # possible (TRITON_INTERPRET counts only when set before the first import)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "loss.json"
    assert main(["bench", "loss", "--quick", "--out", str(out), "--methods", "naive_cyb",
                 "fused_torch", "liger_flce", "--skip-check"]) == 0
    res = _read(out)
    assert res["kind"] == "loss" and res["command"].startswith("cyb bench loss")
    by = {(r["method"], r["positions"]): r for r in res["results"]}
    assert by[("fused_torch", 128)]["status"] == "ok"
    assert by[("liger_flce", 128)]["status"] == "skipped"
    assert "| fused_torch" in loss_table(res).splitlines()[0]


def test_bench_loss_says_what_it_will_measure_and_shows_each_row(tmp_path, monkeypatch, capsys):
    import torch

    from cyb.bench.loss import CPU_SIZES, LossBenchConfig, start_lines

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # as above
    assert main(["bench", "loss", "--quick", "--out", str(tmp_path / "l.json"), "--methods", "naive_cyb",
                 "fused_torch"]) == 0
    printed = capsys.readouterr()
    assert printed.err.startswith("cyb bench loss: 4 rows (2 methods x 1 vocabulary size x 2 position counts), "
                                  "1 timed run each, fp32 on cpu; a line per row as it is measured\n"
                                  "first the check of the fused paths against the naive one (N=64, V=256, H=16)\n")
    assert "take minutes" not in printed.err  # the quick sizes take seconds
    assert [line.split()[0] for line in printed.out.splitlines() if line.startswith("[")] == \
        ["[1/4]", "[2/4]", "[3/4]", "[4/4]"]
    cpu = torch.device("cpu")
    default = LossBenchConfig(device="cpu").resolved(cpu)
    assert default.vocab == CPU_SIZES["vocab"]
    assert start_lines(default, cpu)[-1] == "on a CPU these sizes take minutes (--quick runs every path in seconds)"
    assert "take minutes" not in " ".join(start_lines(default, torch.device("cuda")))


def test_bench_needs_a_benchmark(capsys):
    assert main(["bench"]) == 2
    assert "loss, train, decode, memory or serve" in capsys.readouterr().err


def test_bench_train_budget_skips_rows(tmp_path):
    out = tmp_path / "t.json"
    assert main(["bench", "train", "--quick", "--out", str(out), "--budget-s", "0"]) == 0
    rows = _read(out)["results"]
    assert rows and all(r["status"] == "skipped" for r in rows)
    assert any("time budget" in r["reason"] for r in rows)


# ------------------------------------------------------------------------- train-step pieces


def test_hf_labels_give_the_objective_loss():
    """The Hugging Face loss with last-step labels is TBYS (and plain CE for the baseline)."""
    from cyb.bench.train_step import TrainBenchConfig, _Case, _objective

    case = _Case(TrainBenchConfig.quick(real_tokens=6), 64, 2, CPU)
    with torch.no_grad():
        for method in ("baseline", "tbys"):
            model, prep = case.models[method], case.preps[method]
            out = _objective(method, model, "naive").loss(model, prep)
            hf_loss = case.loss_fn(f"{method}_hf")()
            assert float(hf_loss) == pytest.approx(float(out.loss_sum / out.num_targets), rel=1e-5)


def test_flop_formula_reproduces_the_anchor():
    """134 M parameters, 4 x 8192 positions at 222k positions/s on an H200: MFU 0.385."""
    f = flops.train_step_flops(params=134_000_000, layers=12, hidden=768,
                               positions=4 * 8192, seq=8192)
    mfu = flops.mfu(f, 4 * 8192 / 222e3, flops.peak_tflops("NVIDIA H200"))
    assert mfu == pytest.approx(0.385, abs=0.003)
    assert flops.peak_tflops("NVIDIA H100 80GB HBM3") == 989.5
    assert flops.peak_tflops("cpu") is None and flops.mfu(f, 1.0, None) is None


def test_pause_settings_put_ids_on_top():
    s = pause_settings("cyb", 100, 4)
    assert s.pause_ids == (96, 97, 98) and s.dk_id == 99
    assert pause_settings("tbys", 100, 4).dk_id is None
    assert pause_settings("baseline", 100, 4).num_steps == 1
    with pytest.raises(ValueError, match="method"):
        pause_settings("other", 100, 4)


# ------------------------------------------------------------------------------ timing


def test_timing_helpers():
    calls = []
    res = time_calls(lambda: calls.append(1), device=CPU, warmup=2, repeats=3)
    assert len(calls) == 5 and len(res["ms_all"]) == 3 and res["peak_gib"] is None
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([1.0, 2.0, 3.0, 4.0]) == 2.5
    assert math.isnan(median([]))
    assert Budget(None).allows(1e9) and not Budget(0).allows(1.0)

    def oom():
        raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")

    def broken():
        raise ValueError("bad shape")

    assert guarded(oom, CPU) == {"status": "oom"}
    row = guarded(broken, CPU)
    assert row["status"] == "error" and "bad shape" in row["reason"]
    assert guarded(lambda: {"ms": 1.0}, CPU) == {"status": "ok", "ms": 1.0}


# ----------------------------------------------------------------------- static decoder


def _mixed_cyb(hf_model):
    """A CYB wrapper whose greedy readout says dk at some steps and answers at others."""
    from cyb.model import PauseModel, PauseSettings

    v = hf_model.get_output_embeddings().weight.shape[0]
    with torch.no_grad():
        hf_model.get_output_embeddings().weight[v - 1] *= 2.5
    settings = PauseSettings(num_steps=4, pause_ids=(v - 4, v - 3, v - 2), vocab_size=v,
                             dk_id=v - 1, psi_dk=None, method="cyb")
    return PauseModel(hf_model, settings)


def _decode(decoder, n):
    out = decoder.start()
    got = [(out.token.tolist(), out.steps.tolist())]
    for _ in range(n - 1):
        out = decoder.step()
        got.append((out.token.tolist(), out.steps.tolist()))
    return got


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_static_decoder_matches_library_decoder(attn):
    hf_model = build_hf_model(SHAPE_TINY, 64, dtype=torch.float32, device=CPU,
                              attn_implementation=attn).eval()
    spread_weights(hf_model, seed=3)
    ids = random_ids(3, 6, 60, seed=2)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    mask[2, :5] = 0
    models = [_mixed_cyb(hf_model), wrap(hf_model, "tbys", 3), wrap(hf_model, "baseline", 1)]
    for model in models:
        with torch.inference_mode():
            want = _decode(FixedDecoder(model, ids, mask, StepReadout(model.vocab, model.dk_bias)), 6)
            got = _decode(StaticFixedDecoder(model, ids, mask, max_new_tokens=6), 6)
        assert got == want, model.settings.method
        if model.settings.method == "cyb":  # dk at some steps, answers at others
            assert len({s for _, steps in got for s in steps}) > 1


def test_static_decoder_limits():
    hf_model = build_hf_model(SHAPE_TINY, 64, dtype=torch.float32, device=CPU).eval()
    model = wrap(hf_model, "cyb", 4)
    ids = random_ids(1, 3, 60)
    dec = StaticFixedDecoder(model, ids, torch.ones_like(ids), max_new_tokens=2)
    with pytest.raises(RuntimeError, match="start"):
        dec.step()
    with torch.inference_mode():
        dec.start()
        dec.step()
        with pytest.raises(RuntimeError, match="max_new_tokens"):
            dec.step()
    with pytest.raises(ValueError, match="CUDA"):
        StaticFixedDecoder(model, ids, torch.ones_like(ids), max_new_tokens=2, cuda_graph=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_decoder_matches_library_decoder(dtype):
    device = torch.device("cuda")
    hf_model = build_hf_model(SHAPE_TINY, 64, dtype=torch.float32, device=device).eval()
    spread_weights(hf_model, seed=3)
    hf_model.to(dtype)
    ids = random_ids(2, 6, 60, seed=2).to(device)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    for model in (_mixed_cyb(hf_model), wrap(hf_model, "baseline", 1)):
        with torch.inference_mode():
            want = _decode(FixedDecoder(model, ids, mask, StepReadout(model.vocab, model.dk_bias)), 8)
            dec = StaticFixedDecoder(model, ids, mask, max_new_tokens=8)
            got = _decode(dec, 8)
        assert dec.graph is not None
        if dtype == torch.float32:
            assert got == want
        else:  # bf16 rounding may flip a near-tie; most decisions must agree
            same = sum(a == b for a, b in zip(got, want))
            assert same >= len(want) - 2


# ------------------------------------------------------------------------ targets, tables


def _train_row(vocab, batch, mode, variant, tps, peak, mfu, loss=5.0, status="ok"):
    return {"vocab": vocab, "batch": batch, "mode": mode, "variant": variant, "status": status,
            "ms": 100.0, "real_tokens_per_s": tps, "positions_per_s": 4 * tps, "mfu": mfu,
            "peak_gib": peak, "first_loss": loss, "loss": loss}


TRAIN_RESULT = {
    "kind": "train", "command": "cyb bench train", "env": {"device_name": "NVIDIA H200", "torch": "2.11"},
    "config": {"num_steps": 4},
    "results": [
        _train_row(32768, 4, "eager", "cyb_fused", 60000.0, 14.0, 0.45, 10.0),
        _train_row(32768, 4, "eager", "cyb_naive", 40000.0, 30.0, 0.30, 10.001),
        _train_row(32768, 4, "eager", "tbys_liger", 55000.0, 15.0, 0.41),
        _train_row(32768, 4, "compile", "cyb_fused", 70000.0, 13.0, 0.52),
        _train_row(32768, 4, "compile", "tbys_liger", 75000.0, 12.0, 0.55),
        {"vocab": 262144, "batch": 8, "mode": "eager", "variant": "tbys_hf", "status": "oom"},
    ],
}


def test_train_targets_and_table():
    checks = {c["target"]: c for c in targets.train_targets(TRAIN_RESULT)}
    speed = checks["CYB fused tokens/s >= HF+Liger TBYS (V=32768, B=4, eager)"]
    assert speed["value"] == pytest.approx(60 / 55) and speed["met"]
    assert not checks["CYB fused tokens/s >= HF+Liger TBYS (V=32768, B=4, compile)"]["met"]
    memory = checks["CYB fused peak memory <= HF+Liger TBYS (V=32768, B=4, compile)"]
    assert memory["value"] == pytest.approx(13 / 12) and memory["met"] is False
    assert checks["CYB fused MFU >= 0.5 (V=32768, B=4, best: compile)"]["met"]
    agree = [c for c in checks.values() if "first-step loss" in c["target"]]
    assert len(agree) == 1 and agree[0]["met"]
    missing = [c for c in checks.values() if "V=262144" in c["target"]]
    assert missing and all(c["met"] is None for c in missing)
    text = train_table(TRAIN_RESULT)
    assert text.splitlines()[0].startswith("| V | B | mode | variant |")
    assert "| 262144 | 8 | eager | tbys_hf | oom |" in text
    assert targets.format_check(speed).startswith("MET")


def test_decode_targets_and_table():
    def row(impl, b, m, ms, mode="fixed", spt=1.0, vis="shared", frac=None):
        return {"impl": impl, "visibility": vis if m > 1 else "none", "mode": mode, "batch": b, "num_steps": m,
                "pause_fraction": frac, "status": "ok", "step_ms": ms, "ms_per_token": ms, "new_tokens": 64,
                "real_tokens_per_s": b * 1e3 / ms, "positions_per_token": spt, "steps_per_token": spt}
    result = {"kind": "decode", "config": {"num_steps": 4},
              "agreement_fp32 shared": {"status": "ok", "equal": True,
                                        "shared fixed greedy": {"equal": True, "rows_equal": 16, "rows": 16,
                                                                "tokens": 24, "mean_steps": 1.5}},
              "offline": [{"impl": "engine", "visibility": "shared", "prompts": 2000, "status": "ok",
                           "seconds": 10.0, "real_tokens_per_s": 30000.0, "slots": 300, "cache_gib": 5.0,
                           "speedup_vs_static_batches": 1.8},
                          {"impl": "static_batches", "visibility": "shared", "prompts": 2000, "status": "ok",
                           "seconds": 18.0, "real_tokens_per_s": 16666.0, "slots": 256, "cache_gib": 5.0}],
              "results": [row("engine_one", 1, 1, 1.4), row("engine_one", 256, 1, 2.5),
                          row("engine_one", 256, 4, 3.0, "adaptive", 1.11, frac=0.1),
                          row("engine_block", 1, 4, 1.5, "adaptive", 1.11, frac=0.1),
                          row("engine_one", 1, 4, 1.6, "adaptive", 1.11, frac=0.1),
                          row("eager_pos", 32, 4, 50.0, "adaptive", 1.2, vis="gated", frac=0.1),
                          row("engine_one", 32, 4, 2.0, "adaptive", 1.2, vis="gated", frac=0.1)]}
    checks = {c["target"]: c for c in targets.decode_targets(result)}
    big = checks["engine_one shared B=256 dk share 0.1: ms/token <= 1.15 x E[S] (1.11) x M=1"]
    assert big["value"] == pytest.approx(3.0 / (1.11 * 2.5)) and big["met"]
    one = checks["adaptive shared B=1 dk share 0.1: best engine (engine_block) <= 1.12 x M=1"]
    assert one["value"] == pytest.approx(1.5 / 1.4) and one["met"]
    gated = checks["gated B=32: the engine's cache >= 10.0 x the recompute decoder (64 tokens)"]
    assert gated["value"] == pytest.approx(25.0) and gated["met"]
    assert checks["offline job (2000 prompts, shared): engine >= 1.5 x static batches"]["met"]
    assert [c for t, c in checks.items() if t.startswith("engine tokens == eager")][0]["met"]
    text = decode_table(result)
    assert "| engine_one | shared | adaptive | 256 | 4 | 0.1 | 3.000 |" in text
    assert "| engine | shared | 2000 | 10.0 | 30,000 | 300 | 5.00 | 1.80 |" in text
    assert "| shared fixed greedy | yes | 16/16 | 24 | 1.50 |" in text


def test_make_docs_renders_results(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "train.json").write_text(json.dumps(TRAIN_RESULT))
    (results / "notes.json").write_text(json.dumps({"something": "else"}))
    out = tmp_path / "benchmarks.md"
    assert make_docs.main(["--results", str(results), "--out", str(out)]) == 0
    text = out.read_text()
    assert "## Training step: `train.json`" in text
    assert "- Device: NVIDIA H200 (torch 2.11)" in text
    assert "- Command: `cyb bench train`" in text
    assert "| 32768 | 4 | eager | cyb_fused | 100.0 | - | 60,000 |" in text
    assert "**met**" in text and "**missed**" in text
    assert "notes.json" not in text


# ------------------------------------------------------------------- fused loss changes


def _loss_inputs():
    from cyb.losses import cyb_loss

    g = torch.Generator().manual_seed(0)
    v, h, m, nb = 13, 5, 2, 6
    hidden = torch.randn(nb * m, h, generator=g, requires_grad=True)
    weight = torch.randn(v, h, generator=g, requires_grad=True)
    tgt = torch.randint(0, v - 1, (nb,), generator=g).repeat_interleave(m)
    return hidden, weight, tgt, (lambda lt, ld, lnd: cyb_loss(lt, ld, lnd)), v, m


def test_fused_checks_keep_their_errors_when_deferred(monkeypatch):
    """On CUDA the target checks are read after the work is queued; same errors, no crash."""
    from cyb.kernels import chunked, fused_linear_loss, fused_readout

    monkeypatch.setattr(chunked, "_defer_checks", lambda device: True)
    hidden, weight, tgt, fn, v, m = _loss_inputs()
    cases = [(tgt.masked_fill(tgt == tgt[0], v), "vocabulary"),
             (tgt.masked_fill(tgt == tgt[0], v - 1), "dk_id"),
             (tgt.masked_fill(tgt == tgt[0], -7), "vocabulary")]
    for bad, match in cases:
        with pytest.raises(ValueError, match=match):
            fused_linear_loss(hidden, weight, bad, fn, m, dk_id=v - 1, chunk_blocks=2)
        with pytest.raises(ValueError, match=match):
            fused_readout(hidden, weight, bad, dk_id=v - 1)
    with pytest.raises(ValueError, match="equal within each block"):
        fused_linear_loss(hidden, weight, tgt.roll(1), fn, m, dk_id=v - 1)
    loss, _ = fused_linear_loss(hidden, weight, tgt, fn, m, dk_id=v - 1, chunk_blocks=2)
    assert torch.isfinite(loss)


def test_fused_loss_under_autocast_runs_in_the_autocast_dtype(monkeypatch):
    from cyb.kernels import chunked, fused_linear_loss

    hidden, weight, tgt, fn, v, m = _loss_inputs()
    ref, _ = fused_linear_loss(hidden, weight, tgt, fn, m, dk_id=v - 1, chunk_blocks=2)
    ref_grads = torch.autograd.grad(ref, [hidden, weight])
    seen = []
    real_mm = torch.mm
    monkeypatch.setattr(chunked.torch, "mm", lambda a, b, **kw: seen.append(a.dtype) or real_mm(a, b, **kw))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = fused_linear_loss(hidden, weight, tgt, fn, m, dk_id=v - 1, chunk_blocks=2)
    grads = torch.autograd.grad(loss, [hidden, weight])
    assert seen and set(seen) == {torch.bfloat16}  # the gradient matmuls, not float32
    assert loss.dtype == torch.float32
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=2e-2)
    for got, want in zip(grads, ref_grads):
        assert got.dtype == torch.float32
        assert (got - want).abs().max() <= 3e-2 * want.abs().max()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_loss_under_autocast_on_cuda():
    from cyb.kernels import fused_linear_loss

    hidden, weight, tgt, fn, v, m = _loss_inputs()
    hidden, weight = (x.detach().cuda().requires_grad_() for x in (hidden, weight))
    tgt = tgt.cuda()
    ref, _ = fused_linear_loss(hidden, weight, tgt, fn, m, dk_id=v - 1, backend="torch")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss, _ = fused_linear_loss(hidden, weight, tgt, fn, m, dk_id=v - 1)
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=2e-2)
    g = torch.autograd.grad(loss, [hidden, weight])
    assert all(x.dtype == torch.float32 and torch.isfinite(x).all() for x in g)


@pytest.mark.slow
def test_bench_train_quick_compiled(tmp_path, monkeypatch):
    """Compiled decoder layers (about a minute on a CPU: inductor builds C++ kernels)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # torch._dynamo imports triton
    out = tmp_path / "train.json"
    assert main(["bench", "train", "--quick", "--modes", "compile", "--variants", "cyb_fused",
                 "--out", str(out)]) == 0
    [row] = _read(out)["results"]
    assert row["mode"] == "compile" and row["status"] == "ok", row
    assert len(row["warmup_ms"]) == 1  # the compiling step


def test_engine_rate_times_a_second_fill_that_repeats_the_first():
    """engine_rate's timed prefill repeats its untimed one (same slots, same prefill forwards), so
    on CUDA it replays the graphs the first fill captured rather than subtracting captures."""
    from cyb.bench.engine_runs import _end, _fill, engine_rate
    from cyb.engine import Engine, EngineOptions, Request
    from engine_helpers import layout_model

    pm = layout_model("shared")
    prompts = [[5 + i % 7] * n for i, n in enumerate((3, 9, 5, 12))]
    reqs = [Request(tuple(p), 8, mode="fixed") for p in prompts]
    # (without prefix caching, as engine_rate runs: the second fill writes every prompt again)
    engine = Engine.sized_for(pm, reqs, options=EngineOptions(prefill_chunk=8, prefill_rows=2, prefix_caching=False))
    fills = []
    for _ in range(2):
        before = dict(engine.stats)
        ids = _fill(engine, reqs)
        fills.append(({t.slot: t.request.prompt for t in engine.scheduler.decoding.values()},
                      engine.stats["prefill_forwards"] - before["prefill_forwards"]))
        _end(engine, ids)
    assert fills[0] == fills[1] and fills[0][1] > 1
    out = engine_rate(pm, prompts, mode="fixed", positions="block", warmup=1, timed=2)
    assert out["prefill_s"] > 0 and out["real_tokens"] == 2 * len(prompts)

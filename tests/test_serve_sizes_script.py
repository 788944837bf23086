"""benchmarks/serve_sizes.py --quick: tiny models on the CPU through every piece of the size
benchmark (batch 1, the jobs with their ceiling, transformers' continuous batching, the
preemption check), one JSON file per piece, the table and the goal lines."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import serve_sizes as script
from cyb.bench.jobs import make_job
from cyb.bench.models import real_ids_limit

pytestmark = pytest.mark.usefixtures("one_thread")


def test_quick_run_writes_every_piece_and_its_goals(tmp_path, capsys):
    out = tmp_path / "sizes"
    assert script.main(["--quick", "--out", str(out), "--models", "tiny", "--jobs", "mixed", "fewshot",
                        "--cases", "none", "private-adaptive"]) == 0
    printed = capsys.readouterr().out
    names = sorted(p.name for p in out.glob("*.json"))
    assert names == sorted(["tiny-batch1.json", "tiny-mixed-none.json", "tiny-mixed-anchor.json",
                            "tiny-mixed-private-adaptive.json", "tiny-fewshot-none.json", "tiny-fewshot-anchor.json",
                            "tiny-fewshot-private-adaptive.json", "tiny-preemption-none.json",
                            "tiny-preemption-private-adaptive.json", "summary.json"])
    limit = real_ids_limit(256, 3)
    for job in ("mixed", "fewshot"):
        answers = sum(make_job(job, limit, quick=True).answers)
        for case in ("none", "private-adaptive"):
            r = json.loads((out / f"tiny-{job}-{case}.json").read_text())
            e = r["engine"]
            assert r["status"] == "ok" and r["kind"] == "serve_sizes_run" and r["job_summary"]["name"] == job
            # every request decoded its whole answer, C = 4 at most in flight
            assert e["real_tokens"] == answers and e["failed"] == 0 and not e["stopped_early"]
            assert 1 <= e["slots_in_use_peak"] <= 4 and e["today_slots"] > 0
            assert e["itl_ms_p99"] >= e["itl_ms_p50"] > 0 and e["ttft_ms_p50"] > 0
            assert r["vs_ceiling"] == pytest.approx(e["real_tokens_per_s"] / r["ceiling_tok_s"])
            assert r["engine_features"]["options"].keys() == {"block_size", "prefix_caching", "step_budget"}
        anchor = json.loads((out / f"tiny-{job}-anchor.json").read_text())["anchor"]
        assert anchor["status"] == "ok" and anchor["failed"] == 0 and anchor["real_tokens"] == answers
        assert anchor["attn_implementation"] == "sdpa"
    fewshot = json.loads((out / "tiny-fewshot-none.json").read_text())
    if fewshot["engine_features"]["options"]["prefix_caching"]:
        assert fewshot["prefix_off"]["status"] == "ok"
    else:
        assert fewshot["prefix_off"]["status"] == "n/a"
    check = json.loads((out / "tiny-preemption-private-adaptive.json").read_text())["check"]
    assert check["status"] == "ok" and check["failed"] == 0 and check["changed"] == 0
    assert check["small_cache"]["cache_gib"] < check["reference"]["cache_gib"]
    batch1 = json.loads((out / "tiny-batch1.json").read_text())
    assert batch1["weights_read_ms"] is None and batch1["cases"]["none"]["ms_per_token"] > 0
    # the table, then a goal line per goal; the summary holds the same goals
    assert "| model | job | case | tok/s |" in printed and "| tiny | fewshot | private-adaptive |" in printed
    lines = [x for x in printed.splitlines() if x.split(" ")[0] in ("MET", "MISSED", "N/A")]
    summary = json.loads((out / "summary.json").read_text())
    assert len(lines) == len(summary["goals"]) == 4 + 4 + 2 + 1 + 2 + 1
    assert (out / "goals.txt").read_text().splitlines() == lines
    # the goals of earlier runs, printed again from their files (in the files' order)
    assert script.main(["--from", str(out)]) == 0
    again = [x for x in capsys.readouterr().out.splitlines() if x.split(" ")[0] in ("MET", "MISSED", "N/A")]
    assert sorted(again) == sorted(lines)


def test_a_gemma3_model_with_sliding_windows_runs_the_eval_job(tmp_path):
    out = tmp_path / "gemma"
    assert script.main(["--quick", "--out", str(out), "--models", "tiny-gemma3", "--jobs", "eval", "--cases",
                        "shared-fixed", "--no-anchor", "--no-check", "--no-batch1", "--no-ceiling",
                        "--prefill-chunk", "32", "--prefill-rows", "1"]) == 0
    r = json.loads((out / "tiny-gemma3-eval-shared-fixed.json").read_text())
    assert r["status"] == "ok" and r["engine"]["failed"] == 0 and r["num_steps"] == 3
    assert r["engine"]["options"]["prefill_chunk"] == 32 and r["engine"]["options"]["prefill_rows"] == 1
    stats = r["engine"]["stats"]  # a forward writes one row's 32 columns at most
    assert stats["prefill_forwards"] * 32 >= stats["prefill_positions"] > 32
    assert r["engine"]["positions_per_step"] == 3  # fixed mode: every pause fed, a whole block a step


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        script.main(["--quick"])
    assert "--out is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--quick", "--out", "x", "--models", "gpt-5"])
    assert "--models: choose from" in capsys.readouterr().err


def test_token_gaps_count_each_token_of_an_event():
    from types import SimpleNamespace

    from cyb.bench.size_serve import token_gaps

    stream = SimpleNamespace(events=[(1.0, 1), (1.5, 1), (2.5, 2), (2.6, 0), (3.0, 1)])
    assert token_gaps(stream) == [0.5, 0.5, 0.5, pytest.approx(0.4)]


@pytest.mark.slow  # a server in a child process: about 40 s on a busy CPU
def test_the_mixed_job_through_cyb_serve(tmp_path):
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    out = tmp_path / "served"
    assert script.main(["--quick", "--out", str(out), "--models", "tiny", "--jobs", "mixed", "--cases", "none",
                        "--serve", "--no-anchor", "--no-check", "--no-batch1"]) == 0
    r = json.loads((out / "tiny-mixed-none.json").read_text())
    served = r["serve"]
    assert served["status"] == "ok" and served["errors"] == 0
    assert served["real_tokens"] == r["engine"]["real_tokens"]
    assert served["itl_token_ms_p99"] >= served["itl_token_ms_p50"] > 0
    assert r["serve_vs_ceiling"] == pytest.approx(served["real_tokens_per_s"] / r["ceiling_tok_s"])
    goals = json.loads((out / "summary.json").read_text())["goals"]
    assert any(g["target"].startswith("served inter-token p99") for g in goals)


def test_variants_run_again_under_their_options_against_the_same_ceiling(tmp_path, capsys):
    out = tmp_path / "variants"
    assert script.main(["--quick", "--out", str(out), "--models", "tiny", "--jobs", "mixed", "--cases", "none",
                        "--variants", "prefill_chunk=16,prefill_rows=1", "--no-anchor", "--no-check",
                        "--no-batch1"]) == 0
    printed = capsys.readouterr().out
    base = json.loads((out / "tiny-mixed-none.json").read_text())
    other = json.loads((out / "tiny-mixed-none--prefill_chunk-16_prefill_rows-1.json").read_text())
    assert "variant" not in base and other["variant"] == "prefill_chunk=16,prefill_rows=1"
    assert other["engine"]["options"]["prefill_chunk"] == 16 and other["engine"]["failed"] == 0
    assert other["ceiling_tok_s"] == base["ceiling_tok_s"]  # measured once
    assert "| tiny | mixed | none [prefill_chunk=16,prefill_rows=1] |" in printed
    assert any(x.startswith(("MET", "MISSED")) and "(tiny, mixed, none [prefill_chunk=16,prefill_rows=1])" in x
               for x in printed.splitlines())


def test_records_packed_as_the_gpu_script_packs_them_are_read_back(tmp_path, capsys):
    """benchmarks/serve_sizes_gpu.sh packs a call's records into records.tar.gz (a device call
    returns 8 files); --from reads them there as it reads loose files."""
    import subprocess

    out = tmp_path / "packed"
    assert script.main(["--quick", "--out", str(out), "--models", "tiny", "--jobs", "mixed", "--cases", "none",
                        "private-adaptive", "--no-anchor", "--no-check", "--no-batch1"]) == 0
    first = [x for x in capsys.readouterr().out.splitlines() if x.startswith(("MET", "MISSED", "N/A"))]
    loose = sorted(p.name for p in out.glob("*.json") if p.name != "summary.json")
    assert len(loose) == 2
    subprocess.run(["tar", "-czf", str(out / script.RECORDS_ARCHIVE), "-C", str(out), *loose], check=True)
    for name in loose:
        (out / name).unlink()
    assert [r["case"] for r in script.load_records([str(out)])] == ["none", "private-adaptive"]
    assert script.main(["--from", str(out)]) == 0
    again = [x for x in capsys.readouterr().out.splitlines() if x.startswith(("MET", "MISSED", "N/A"))]
    assert again == first


def test_a_profiled_run_says_where_the_engine_spends_its_time(tmp_path):
    """--profile: the record holds the engine's phases (host and device time, calls) and the
    profiler's tables; the engine's methods are its own again afterwards."""
    from cyb.engine.engine import Engine

    step = Engine.__dict__["step"]
    out = tmp_path / "profiled"
    assert script.main(["--quick", "--out", str(out), "--models", "tiny", "--jobs", "mixed", "--cases", "none",
                        "--no-anchor", "--no-check", "--no-batch1", "--profile"]) == 0
    record = json.loads((out / "tiny-mixed-none.json").read_text())
    phases = record["profile"]["phases"]
    assert record["status"] == "ok" and phases["Engine.step"]["calls"] >= 1
    assert phases["Runner.decode"]["cpu_ms"] > 0 and phases["Engine.submit"]["calls"] == record["engine"]["requests"]
    assert "| phase | calls | host ms | device ms |" in record["profile"]["text"]
    assert Engine.__dict__["step"] is step


def test_profiled_restores_the_methods_when_the_block_fails():
    from cyb.bench.engine_profile import profiled
    from cyb.engine.runner import Runner

    decode = Runner.__dict__["decode"]
    with pytest.raises(RuntimeError, match="inside"):
        with profiled(torch.device("cpu")):
            assert Runner.__dict__["decode"] is not decode
            raise RuntimeError("inside")
    assert Runner.__dict__["decode"] is decode


@pytest.mark.parametrize("spec", ["step_budget", "step_budget=0", "temperature=1", "prefill_chunk=x"])
def test_bad_variants_are_refused(spec, capsys):
    with pytest.raises(SystemExit):
        script.main(["--quick", "--out", "/tmp/x", "--variants", spec])
    assert "a variant is OPTION=N" in capsys.readouterr().err

"""``cyb bench serve --quick``: the load client against the server in a thread, the engine
offline and generate() in static batches on the same prompts, the table and the targets."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from cyb.bench.load import percentile, step_gaps, summarise  # noqa: E402
from cyb.cli import main  # noqa: E402
from cyb.serve.client import StreamResult  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def test_quick_run_of_every_case(tmp_path, capsys):
    out = tmp_path / "serve.json"
    assert main(["bench", "serve", "--quick", "--concurrency", "1", "3", "--requests", "4", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert result["kind"] == "serve" and result["command"].startswith("cyb bench serve")
    rows = result["results"]
    assert [(r["case"], r["concurrency"]) for r in rows] == [(c, n) for c in ("none", "shared-fixed", "shared-adaptive",
                                                                              "private-fixed", "private-adaptive")
                                                            for n in (1, 3)]
    for r in rows:
        assert r["status"] == "ok" and r["serve"]["errors"] == 0 and r["serve"]["requests"] == 4
        assert r["offline_engine"]["status"] == "ok" and r["static_generate"]["status"] == "ok"
        # the same work: every answer decoded to its length, through the server and offline
        assert r["serve"]["real_tokens"] == r["offline_engine"]["real_tokens"] == r["static_generate"]["real_tokens"]
        assert r["serve"]["mean_steps"] == pytest.approx(r["offline_engine"]["mean_steps"])
        # the engine against static batches and against its ceiling, in the same run
        assert r["offline_vs_static"] == pytest.approx(r["offline_engine"]["real_tokens_per_s"]
                                                       / r["static_generate"]["real_tokens_per_s"])
        assert r["steady"]["status"] == "ok" and r["ceiling_tok_s"] > 0
        assert r["offline_vs_ceiling"] == pytest.approx(r["offline_engine"]["real_tokens_per_s"] / r["ceiling_tok_s"])
    assert {r["serve"]["mean_steps"] for r in rows if r["case"] == "none"} == {1.0}
    assert "| case | C | serve tok/s |" in printed and "inter-token latency" in printed
    assert "offline / ceiling" in printed
    names = [t["target"] for t in result["targets"]]
    assert len(names) == 21 and all(t["value"] is not None for t in result["targets"])
    assert [n for n in names if n.startswith("p99 gap a decoding step")] == [
        "p99 gap a decoding step <= 3.0 x p50 (shared-adaptive, C=3)",
        "p99 gap a decoding step <= 3.0 x p50 (private-adaptive, C=3)"]
    assert "engine offline tokens/s >= 1.7 x generate() static (none, C=3)" in names
    assert "engine offline tokens/s >= 0.5 x its ceiling (none, C=3)" in names
    assert "engine offline tokens/s >= 1.5 x generate() static (shared-fixed, C=3)" in names


def test_the_ceiling_and_the_adaptive_target():
    from types import SimpleNamespace

    from cyb.bench.engine_runs import ceiling_tokens_per_s
    from cyb.bench.serve import serve_targets
    from cyb.engine.layout import RowLayout
    from cyb.layout import PauseVocab

    model = SimpleNamespace(vocab=PauseVocab(vocab_size=100, num_steps=1), pause_visibility="shared")
    steady = {"step_ms": 10.0, "positions_per_step": 1, "prefill_columns_s": 1000.0}
    # 2 prompts of 250 tokens (the last one is fed by the first decode step): 2 x 249 columns
    # prefilled at 1000 per second; 40 positions over 2 slots: 20 steps of 10 ms
    got = ceiling_tokens_per_s(model, [[1] * 250, [2] * 250], [10, 30], steady, decode_positions=40, slots=2)
    assert RowLayout.of(model.vocab, "shared").prefill([1] * 250).columns == 249
    assert got == pytest.approx(40 / (0.498 + 0.2))

    def row(case, tok_s, steps):
        serve = {"real_tokens_per_s": 1.0, "itl_ms_p50": 1.0, "itl_ms_p99": 4.0, "errors": 0,
                 "itl_step_ms_p50": 1.0, "itl_step_ms_p99": 2.0}
        return {"case": case, "mode": case.split("-")[-1], "concurrency": 8, "status": "ok", "serve": serve,
                "offline_engine": {"status": "ok", "real_tokens_per_s": tok_s, "mean_steps": steps}}
    checks = serve_targets({"results": [row("none", 1000.0, 1.0), row("private-adaptive", 600.0, 1.6)]})
    per_step = [c for c in checks if c["target"].startswith("p99 gap a decoding step")]
    assert len(per_step) == 1 and "private-adaptive" in per_step[0]["target"] and per_step[0]["met"] is True
    assert all(not c["met"] for c in checks if c["target"].startswith("p99 inter-token latency"))
    adaptive = [c for c in checks if c["target"].startswith("engine offline tokens/s >= 0.85 / E[S]")]
    assert len(adaptive) == 1 and adaptive[0]["value"] == pytest.approx(600 / (0.85 / 1.6 * 1000))
    assert adaptive[0]["met"] is True


def test_percentiles_and_summary():
    assert percentile([], 50) is None and percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    r = StreamResult(status=200, start=0.0, events=[(0.1, 1), (0.3, 2), (0.4, 1)], steps=[1, 2, 1, 1], end=0.5)
    bad = StreamResult(status=400, error="max_tokens: ...", start=0.0, end=0.1)
    s = summarise([r, bad], 0.5)
    assert (s["requests"], s["errors"], s["real_tokens"], s["first_error"]) == (2, 1, 4, "max_tokens: ...")
    assert s["ttft_ms_p50"] == pytest.approx(100.0) and s["itl_ms_p50"] == pytest.approx(150.0)
    assert s["tpot_ms_p50"] == pytest.approx(100.0) and s["mean_steps"] == 1.25
    # a gap over the steps of the tokens its event carries: 200 ms / (2 + 1) steps, 100 ms / 1 step
    assert step_gaps(r) == pytest.approx([0.2 / 3, 0.1])
    assert s["itl_step_ms_p50"] == pytest.approx((200 / 3 + 100) / 2)


def test_load_from_two_processes_and_the_probe(tmp_path_factory):
    """The load spread over two client processes answers every request, in the items' order; the
    probe reads the server's gauges over the load's window."""
    import math

    from cyb.bench.load import ServerProbe, client_processes, load_from_processes
    from serve_helpers import pause_model, running, tokenizer

    assert (client_processes(256), client_processes(64), client_processes(3), client_processes(4, wanted=8)) \
        == (8, 2, 1, 4)
    pm = pause_model(tokenizer(tmp_path_factory.mktemp("tok")))
    real = min(pm.vocab.special_ids)
    items = [([3 + i % (real - 3)] * (2 + i), 3 + i % 4) for i in range(10)]
    with running(pm, served_kw={"aliases": ("bench",)}, slots=4) as srv, ServerProbe(srv.url, period=0.02) as probe:
        results, wall = load_from_processes(srv.url, items, concurrency=4, processes=2, mode="fixed")
        poisson, _ = load_from_processes(srv.url, items, concurrency=4, processes=2, arrivals="poisson", rate=200.0,
                                         mode="fixed")
    assert [r.tokens for r in results] == [n for _, n in items] and all(r.ok for r in results)
    assert [r.tokens for r in poisson] == [n for _, n in items] and all(r.ok for r in poisson)
    assert wall == pytest.approx(max(r.end for r in results) - min(r.start for r in results))
    # one list for both processes: the 5th item starts only when one of the first four has ended
    assert min(r.start for r in results[4:]) >= min(r.end for r in results[:4])
    summary = probe.summary()
    assert summary["samples"] >= 2 and 0 <= summary["slots_in_use_mean"] <= 4
    assert not math.isnan(summary["engine_steps_per_s"]) and probe.summary(0.0, 0.0) == {}


def test_offline_engine_from_closed_loop_clients(tmp_path_factory):
    """The engine fed by two closed-loop clients decodes every answer to its length, as with every
    request submitted at once."""
    from cyb.bench.offline import offline_engine
    from serve_helpers import pause_model, tokenizer

    pm = pause_model(tokenizer(tmp_path_factory.mktemp("tok")))
    items = [([5] * (3 + i), 2 + i) for i in range(6)]
    at_once = offline_engine(pm, items, slots=2, mode="fixed", capacity=128)
    closed = offline_engine(pm, items, slots=2, mode="fixed", capacity=128, clients=2, refill_wait=0)
    assert at_once["real_tokens"] == closed["real_tokens"] == sum(n for _, n in items)
    assert closed["clients"] == 2 and closed["itl_ms_p50"] > 0


def test_offline_engine_readied_as_a_server_is(tmp_path_factory):
    """With ``warm`` the engine decodes the warm-up requests first, outside the timed run, and its
    counts cover the timed job only; the job's tokens are those of an engine built for it alone."""
    from cyb.bench.offline import offline_engine
    from cyb.engine.layout import RowLayout
    from serve_helpers import pause_model, tokenizer

    pm = pause_model(tokenizer(tmp_path_factory.mktemp("tok")))
    items = [([5] * (3 + i), 2 + i) for i in range(5)]
    cold = offline_engine(pm, items, slots=2, mode="fixed", capacity=128)
    warmed = offline_engine(pm, items, slots=2, mode="fixed", capacity=128, warm=[([7] * 8, 6)] * 2)
    layout = RowLayout.of(pm.vocab, pm.pause_visibility)
    assert warmed["warmed"] and not cold["warmed"]
    assert warmed["real_tokens"] == cold["real_tokens"] == sum(n for _, n in items)
    assert warmed["stats"] == cold["stats"]
    assert warmed["stats"]["prefill_positions"] == sum(layout.prefill(p).columns for p, _ in items)
    assert warmed["capture_s"] == 0.0  # the CPU captures no graph


def test_static_batches_leave_their_engines_graph_captures_out():
    """Each generate() call builds an engine; the runners it builds are found and their capture
    time taken out of the static figure, as the offline engine's is (none on the CPU: 0)."""
    import torch

    from cyb.bench.offline import engine_runners_made, static_generate
    from cyb.engine import runner as runner_module
    from engine_helpers import layout_model
    from generation_helpers import PROMPTS, encode

    init = runner_module.Runner.__init__
    pm = layout_model("shared")
    items = [(encode(p), 3) for p in PROMPTS[:3]]
    with engine_runners_made() as made:
        r = static_generate(pm, items, batch=2, mode="fixed")
    assert runner_module.Runner.__init__ is init and len(made) == 2  # two batches, one engine each
    assert r["capture_s"] == 0.0 and r["real_tokens"] == 9
    assert r["real_tokens_per_s"] == pytest.approx(r["with_captures_tokens_per_s"])
    assert torch.is_tensor(made[0].columns)

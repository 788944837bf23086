"""``cyb bench serve --quick``: the load client against the server in a thread, the engine
offline and generate() in static batches on the same prompts, the table and the targets."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from cyb.bench.serve import percentile, summarise  # noqa: E402
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
    assert {r["serve"]["mean_steps"] for r in rows if r["case"] == "none"} == {1.0}
    assert "| case | C | serve tok/s |" in printed and "inter-token latency" in printed
    assert len(result["targets"]) == 15


def test_percentiles_and_summary():
    assert percentile([], 50) is None and percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    r = StreamResult(status=200, start=0.0, events=[(0.1, 1), (0.3, 2), (0.4, 1)], steps=[1, 2, 1, 1], end=0.5)
    bad = StreamResult(status=400, error="max_tokens: ...", start=0.0, end=0.1)
    s = summarise([r, bad], 0.5)
    assert (s["requests"], s["errors"], s["real_tokens"], s["first_error"]) == (2, 1, 4, "max_tokens: ...")
    assert s["ttft_ms_p50"] == pytest.approx(100.0) and s["itl_ms_p50"] == pytest.approx(150.0)
    assert s["tpot_ms_p50"] == pytest.approx(100.0) and s["mean_steps"] == 1.25

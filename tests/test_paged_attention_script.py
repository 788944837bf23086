"""``benchmarks/paged_attention.py --quick``: the checks and every timed path on a tiny shape, on
CPU tensors under triton's interpreter (no timings): the paged kernel, the varlen entry and
FlexAttention's paged mask agree with the reference and with each other."""

from __future__ import annotations

import json

from benchmarks import paged_attention as script


def test_paged_attention_quick_run(triton_interpreted, tmp_path, capsys):
    assert script.main(["--quick", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "paged_attention.json").read_text())
    whats = {c["what"] for c in res["checks"]}
    assert whats == {"paged", "varlen", "flex"} and all(c["ok"] for c in res["checks"])
    assert res["runs"] and res["mixed"] and not res["skipped"]
    for run in res["runs"]:
        assert run["paged_vs_contiguous_err"] < 1e-5 and run["flex_vs_paged_err"] < 1e-5
        assert run["paged_ms"] is None  # no timings off CUDA
    assert all(m["varlen_vs_two_calls_err"] < 1e-5 for m in res["mixed"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-len(res["runs"]) - len(res["mixed"]) - 2].startswith("| step | kv | block |")

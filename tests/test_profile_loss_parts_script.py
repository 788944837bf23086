"""``benchmarks/profile_loss_parts.py --quick``: one fused loss call split by its parts, on a small
CPU case (a smoke run: every part is found once per chunk, and the wrapped functions are put
back)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


def test_profile_loss_parts_quick_run(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import profile_loss_parts as script
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from cyb.kernels import chunked

    before = (chunked._block_loss_grads, chunked.chunk_grads, F.linear)
    script.main(["--quick", "--out", str(tmp_path / "parts.json"), "--calls", "2"])
    assert (chunked._block_loss_grads, chunked.chunk_grads, F.linear) == before
    res = json.loads((tmp_path / "parts.json").read_text())
    assert set(script.PARTS) <= set(res["parts"])
    for name in script.PARTS:
        assert res["parts"][name]["calls_per_loss_call"] >= 1 and res["parts"][name]["host_ms"] > 0

"""``benchmarks/shared_prefix_attention.py --quick``: every timed path on a tiny shape, on CPU
tensors under triton's interpreter (no timings): rows whose prefix is the same blocks give what
rows with copies of it give, and today's gathered prefill of a later chunk gives what the row
attention kernel gives."""

from __future__ import annotations

import json

from benchmarks import shared_prefix_attention as script


def test_shared_prefix_attention_quick_run(triton_interpreted, tmp_path, capsys):
    assert script.main(["--quick", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "shared_prefix_attention.json").read_text())
    cases = [(r["case"], r["what"]) for r in res["rows"] if "case" in r]
    assert cases == [("decode", "own copies"), ("decode", "shared blocks"), ("decode", "own columns only"),
                     ("decode", "prefix once, dense (sdpa)"), ("later chunk", "row attention, shared blocks"),
                     ("later chunk", "gather + masked sdpa (today's prefill)")]
    assert all(r["ms"] is None for r in res["rows"] if "case" in r)  # no timings off CUDA
    checks = [r for r in res["rows"] if "check" in r]
    assert len(checks) == 2 and all(c["error"] < 1e-5 for c in checks)
    assert "| case | what | ms |" in capsys.readouterr().out


def test_shared_blocks_are_one_copy_in_the_pool():
    import torch

    own = torch.tensor([5, 17, 1])
    kv = script.content(3, 2, 2, 1, 16, 4, torch.float32, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    k_own, _, t_own = script.pools(own, 2, kv, gen, shared=False)
    k_shared, _, t_shared = script.pools(own, 2, kv, gen, shared=True)
    assert k_own.shape[0] == 3 * 2 + 1 + 2 + 1 and k_shared.shape[0] == 2 + 1 + 2 + 1
    assert (t_shared[:, :2] == t_shared[0, :2]).all() and len({tuple(r) for r in t_own[:, :2].tolist()}) == 3
    for table, pool in ((t_own, k_own), (t_shared, k_shared)):  # every row reads the same prefix and its own blocks
        assert torch.equal(pool[table[:, :2].long()], kv[0].expand(3, *kv[0].shape))
        assert torch.equal(pool[table[1, 2:4].long()], kv[2][1, :2])

"""Attention over rows that share a prompt prefix: does each row read the prefix again, and what
do the engine's later prompt chunks cost?

    python benchmarks/shared_prefix_attention.py --out DIR      (CUDA; meant to take a minute or two)
    TRITON_INTERPRET=1 python benchmarks/shared_prefix_attention.py --quick --out DIR   (CPU: tiny, no timings)

The few-shot job of issue 65 (2,000 requests that share a 1,500-token prefix) runs its decoding
steps and its prompt chunks over rows whose first blocks are the same blocks of the cache.  One
attention layer at SmolLM2-1.7B's shape (32 query and 32 key heads of 64, bf16, blocks of 16),
timed from CUDA graph replays (``benchmarks/paged_attention.py``'s timer):

* ``decode``: 256 rows of a 1,488-column prefix (93 full blocks) and 50-200 columns of their
  own, one query each (:func:`cyb.kernels.row_attention.row_attention` through the block table),
  where every row's table points to **its own copy** of the prefix, to **the same blocks**
  (what prefix caching makes), and to **its own columns only** (the rows without the prefix:
  what a step would cost if the prefix were read once, less that once);
* ``prefix once``: the 256 queries against the prefix as one dense attention (sdpa, no mask):
  what reading the prefix once for all rows costs, the other half of cascade attention;
* ``later chunk``: 18 rows of 137 queries each after the shared prefix (the prefill forward of
  few-shot requests whose prefix was cached), through the block table as above, and as the
  engine's prefill runs it today: every row's columns gathered from the pool
  (:func:`cyb.model.attention.paged_rows`), then sdpa with a boolean mask.

``bound_ms`` is the bytes of keys and values read at the card's copy bandwidth, counting each row's
columns (``per_row``) or each block once (``unique``).  If ``shared`` is close to ``own`` the
repeats of the prefix come from memory every time; close to ``own columns only`` and the card's
L2 serves them.  Writes ``shared_prefix_attention.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from cyb.kernels import row_attention as ra  # noqa: E402
from cyb.model.attention import paged_rows  # noqa: E402
from paged_attention import Timer  # noqa: E402  (this folder)

#: heads, dim, block size, prefix blocks, decoding rows, own columns (low, high), later-chunk rows and queries
SIZES = {"full": dict(heads=32, kv_heads=32, dim=64, block=16, prefix_blocks=93, rows=256, own=(50, 200),
                      chunk_rows=18, chunk=137),
         "quick": dict(heads=4, kv_heads=2, dim=16, block=16, prefix_blocks=3, rows=5, own=(3, 20),
                       chunk_rows=2, chunk=7)}


def content(rows: int, own_blocks: int, prefix_blocks: int, kv_heads: int, block: int, dim: int, dtype, device,
            seed: int = 0) -> tuple:
    """Keys and values of the prefix ``[prefix_blocks, kv_heads, block, dim]`` and of each row's
    own blocks ``[rows, own_blocks, kv_heads, block, dim]``, drawn on ``device``."""
    g = torch.Generator(device=device).manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, kv_heads, block, dim, generator=g, device=device).to(dtype)

    return draw(prefix_blocks), draw(prefix_blocks), draw(rows, own_blocks), draw(rows, own_blocks)


def pools(own_columns: torch.Tensor, prefix_blocks: int, kv: tuple, gen, *, shared: bool) -> tuple:
    """A pool of keys, one of values and a block table ``[rows, B]`` (int32) for rows of
    ``prefix_blocks`` prefix blocks then ``own_columns[i]`` columns of their own (``kv``: from
    :func:`content`): every row's prefix in blocks of its own, or (``shared``) in the same
    blocks.  Blocks are numbered in a shuffled order, as in a pool that has served a while."""
    prefix_k, prefix_v, own_k, own_v = kv
    n, pre = own_columns.shape[0], prefix_blocks
    block = own_k.shape[3]
    own = [-(-int(x) // block) for x in own_columns]
    count = pre * (1 if shared else n) + sum(own)
    order = torch.randperm(count, generator=gen)
    table = torch.zeros(n, pre + max(own), dtype=torch.int32)
    at = 0
    for i in range(n):
        if pre and (not shared or i == 0):
            table[i, :pre], at = order[at:at + pre], at + pre
        elif pre:
            table[i, :pre] = table[0, :pre]
        table[i, pre:pre + own[i]], at = order[at:at + own[i]], at + own[i]
    table = table.to(own_k.device)
    out = []
    for prefix, mine in ((prefix_k, own_k), (prefix_v, own_v)):
        p = torch.empty((count, *mine.shape[2:]), dtype=mine.dtype, device=mine.device)
        for i in range(n):
            if pre and (not shared or i == 0):
                p[table[i, :pre].long()] = prefix[:pre]
            p[table[i, pre:pre + own[i]].long()] = mine[i, :own[i]]
        out.append(p)
    return out[0], out[1], table


def bound_bytes(lengths: torch.Tensor, prefix: int, kv_heads: int, dim: int, size: int, *, shared: bool) -> int:
    """Bytes of keys and values: every row's columns, or each block once where ``shared``."""
    columns = int(lengths.sum()) - ((lengths.shape[0] - 1) * prefix if shared else 0)
    return 2 * columns * kv_heads * dim * size


def run(sizes: dict, timer: Timer, device, dtype, gen) -> list[dict]:
    h, kvh, d, bs = sizes["heads"], sizes["kv_heads"], sizes["dim"], sizes["block"]
    prefix = sizes["prefix_blocks"] * bs
    rows_out = []

    def record(case: str, what: str, ms, lengths=None, shared=False, **extra) -> None:
        row = {"case": case, "what": what, "ms": ms, **extra}
        if lengths is not None and timer.copy_gb_s:
            size = torch.empty((), dtype=dtype).element_size()
            row["bound_per_row_ms"] = bound_bytes(lengths, prefix, kvh, d, size, shared=False) / timer.copy_gb_s / 1e6
            row["bound_unique_ms"] = bound_bytes(lengths, prefix, kvh, d, size, shared=shared) / timer.copy_gb_s / 1e6
        rows_out.append(row)
        print(json.dumps(row), flush=True)

    # decoding rows: one query each at its last column
    n = sizes["rows"]
    own = torch.randint(sizes["own"][0], sizes["own"][1] + 1, (n,), generator=gen)
    lengths = prefix + own
    query = torch.randn(n, h, 1, d, generator=gen).to(dtype).to(device)
    last = (lengths - 1).view(n, 1).to(device)
    kv = content(n, -(-sizes["own"][1] // bs), sizes["prefix_blocks"], kvh, bs, d, dtype, device)
    results = {}
    for shared in (False, True):
        kp, vp, table = pools(own, sizes["prefix_blocks"], kv, gen, shared=shared)
        name = "shared blocks" if shared else "own copies"
        record("decode", name, timer.ms(lambda: ra.row_attention(query, kp, vp, last, block_table=table)),
               lengths, shared, rows=n, columns=int(lengths.sum()))
        results[shared] = ra.row_attention(query, kp, vp, last, block_table=table)
        del kp, vp, table
    kp, vp, table = pools(own, 0, kv, gen, shared=False)
    last_own = (own - 1).view(n, 1).to(device)
    record("decode", "own columns only", timer.ms(lambda: ra.row_attention(query, kp, vp, last_own, block_table=table)),
           own, False, rows=n, columns=int(own.sum()))
    del kp, vp, table, kv
    keys = torch.randn(1, kvh, prefix, d, generator=gen).to(dtype).to(device)
    values = torch.randn(1, kvh, prefix, d, generator=gen).to(dtype).to(device)
    flat = query.transpose(0, 2).reshape(1, h, n, d)  # every row's query against the one prefix

    def prefix_once():
        return torch.nn.functional.scaled_dot_product_attention(flat, keys, values, enable_gqa=h != kvh)

    record("decode", "prefix once, dense (sdpa)", timer.ms(prefix_once), rows=n, columns=prefix)

    # later prompt chunks after the shared prefix
    r, c = sizes["chunk_rows"], sizes["chunk"]
    lengths = torch.full((r,), prefix + c)
    query = torch.randn(r, h, c, d, generator=gen).to(dtype).to(device)
    last = (prefix + torch.arange(c)).view(1, c).expand(r, c).contiguous().to(device)
    kv = content(r, -(-c // bs), sizes["prefix_blocks"], kvh, bs, d, dtype, device, seed=1)
    kp, vp, table = pools(torch.full((r,), c), sizes["prefix_blocks"], kv, gen, shared=True)
    record("later chunk", "row attention, shared blocks",
           timer.ms(lambda: ra.row_attention(query, kp, vp, last, block_table=table)), lengths, True,
           rows=r, queries=c)
    limit = prefix + c
    table_long = table.long()
    mask = (torch.arange(limit, device=device).view(1, 1, limit) <= last.unsqueeze(2)).unsqueeze(1)

    def gathered():  # the engine's later chunks today: gather every row's columns, then a masked sdpa
        k = paged_rows(kp, table_long)[:, :, :limit]
        v = paged_rows(vp, table_long)[:, :, :limit]
        return torch.nn.functional.scaled_dot_product_attention(query, k, v, attn_mask=mask, enable_gqa=h != kvh)

    record("later chunk", "gather + masked sdpa (today's prefill)", timer.ms(gathered), lengths, True,
           rows=r, queries=c)
    err = float((gathered().transpose(1, 2).float()
                 - ra.row_attention(query, kp, vp, last, block_table=table).float()).abs().max())
    rows_out.append({"check": "later chunk: gathered vs row attention, max abs error", "error": err})
    rows_out.append({"check": "decode: shared vs own copies, max abs error",
                     "error": float((results[True].float() - results[False].float()).abs().max())})
    return rows_out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="a tiny shape on the CPU (TRITON_INTERPRET=1), no timings")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    cuda = torch.cuda.is_available() and not a.quick
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    gen = torch.Generator().manual_seed(0)
    timer = Timer(cuda)
    res = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "copy_gb_s": timer.copy_gb_s, "sizes": SIZES["quick" if a.quick else "full"]}
    res["rows"] = run(res["sizes"], timer, device, dtype, gen)
    with open(os.path.join(a.out, "shared_prefix_attention.json"), "w") as f:
        json.dump(res, f, indent=1)

    def fmt(x):
        return "-" if x is None else f"{x:.3f}"

    print("\n| case | what | ms | bound ms (each row's columns) | bound ms (each block once) |")
    print("|---|---|---:|---:|---:|")
    for row in res["rows"]:
        if "case" in row:
            print(f"| {row['case']} | {row['what']} | {fmt(row['ms'])} | {fmt(row.get('bound_per_row_ms'))} | "
                  f"{fmt(row.get('bound_unique_ms'))} |")
        else:
            print(f"{row['check']}: {row['error']:.2e}")
    bad = [row for row in res["rows"] if "check" in row and not row["error"] <= (2e-2 if cuda else 1e-4)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

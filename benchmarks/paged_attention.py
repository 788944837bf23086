"""Row attention through block tables, against the contiguous kernel and FlexAttention over a
paged layout.

    python benchmarks/paged_attention.py --out DIR       (CUDA; meant to take under 5 minutes on an H100)
    TRITON_INTERPRET=1 python benchmarks/paged_attention.py --quick --out DIR   (CPU: tiny, no timings)

(a) Checks: :func:`cyb.kernels.row_attention.row_attention` through a block table (and
:func:`~cyb.kernels.row_attention.row_attention_varlen`), in bf16 (float32 with ``--quick``),
against the float64 reference on a few shapes (GQA, gated pauses, windows, prefill chunks,
padding), and FlexAttention's paged masks against the same reference.

(b) Timings (CUDA, bf16, query heads 32, head dim 64; each call captured in a CUDA graph and
timed by ``triton.testing.do_bench`` over its replays), per block size 16, 32, 64, 128:

* decoding steps: 256 rows of 16-4096 columns (uniform), key heads 8 and 32, Q = 1 and 4;
* prefill chunks, key heads 8: 4 rows x 512 queries and 2 rows x 2048 queries, each after
  0-3000 cached columns;
* a mixed step: 255 decoding rows and one chunk of 1024 queries after 1500 columns, as one
  varlen call against two calls (decoding rows, then the chunk).

Columns: ``contiguous`` (the same kernel over a ``[n, kv_heads, W, D]`` cache, W the longest
row), ``paged`` (through the table over a shuffled ``[blocks, kv_heads, block, D]`` pool),
``paged_heads_outer`` (a pool stored ``[kv_heads, blocks, block, D]``), ``flex`` (compiled
FlexAttention over ``[1, kv_heads, blocks * block, D]``, the block mask's indices mapped through
the table and its mask_mod through a physical-to-logical table, as attention-gym's paged
attention does; ``flex_mask_ms`` is the time to build that mask from the step's tensors, not in
``flex``), and ``bound`` (the bytes of keys and values the rows hold at the device's copy
bandwidth).  FlexAttention compiles once per shape and block size; past ``--budget-s`` seconds
the remaining FlexAttention timings are skipped (and listed).  Writes ``paged_attention.json``
and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

import torch

if "--quick" in sys.argv and not torch.cuda.is_available():  # before anything imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from cyb.bench.timing import graphed  # noqa: E402
from cyb.kernels import row_attention as ra  # noqa: E402

BLOCK_SIZES = (16, 32, 64, 128)
#: the steps of (b): query heads, head dim, decoding rows and their longest row, the (key heads, Q)
#: of decoding steps, the prefill chunks (cached columns per row, queries), the mixed step
#: (decoding rows, chunk, cached columns before it)
SIZES = {
    "full": {"heads": 32, "dim": 64, "rows": 256, "longest": 4096, "decode": ((8, 1), (32, 1), (8, 4), (32, 4)),
             "prefill": (((0, 1000, 2000, 3000), 512), ((0, 3000), 2048)), "mixed": (255, 1024, 1500),
             "block_sizes": BLOCK_SIZES},
    "quick": {"heads": 4, "dim": 16, "rows": 3, "longest": 200, "decode": ((2, 2),),
              "prefill": (((0, 100), 40),), "mixed": (3, 40, 50), "block_sizes": (16, 128)},
}


# ----------------------------------------------------------------------------- data

def columns_of(n: int, kv_heads: int, width: int, dim: int, dtype, device, gen) -> tuple:
    """A contiguous cache ``[n, kv_heads, width, D]`` of keys and values."""
    key = torch.randn(n, kv_heads, width, dim, generator=gen).to(dtype).to(device)
    value = torch.randn(n, kv_heads, width, dim, generator=gen).to(dtype).to(device)
    return key, value


def paged(key: torch.Tensor, value: torch.Tensor, lengths: torch.Tensor, block_size: int, gen, *,
          heads_outer: bool = False) -> tuple:
    """Each row's first ``lengths[i]`` columns in a shuffled pool of blocks: ``(key_pool,
    value_pool, table [n, B] int32, physical_to_logical [n, blocks] int32)``; table entries past a
    row's blocks are 0, physical_to_logical is -1 where a row does not hold the block."""
    n, kv_heads, width, dim = key.shape
    per_row = -(-width // block_size)
    used = torch.arange(per_row, device=key.device).view(1, -1) * block_size < lengths.view(-1, 1).to(key.device)
    count = int(used.sum())
    ids = torch.randperm(count, generator=gen, device="cpu").to(key.device)
    table = torch.zeros(n, per_row, dtype=torch.int32, device=key.device)
    table[used] = ids.int()
    to_logical = torch.full((n, count), -1, dtype=torch.int32, device=key.device)
    rows, blocks = used.nonzero(as_tuple=True)
    to_logical[rows, ids] = blocks.int()

    def pool(x):
        padded = torch.nn.functional.pad(x, (0, 0, 0, per_row * block_size - width))
        src = padded.view(n, kv_heads, per_row, block_size, dim).transpose(1, 2)[used]  # [count, kv, bs, D]
        shape = (kv_heads, count, block_size, dim) if heads_outer else (count, kv_heads, block_size, dim)
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
        out = out.transpose(0, 1) if heads_outer else out
        out[ids] = src
        return out

    return pool(key), pool(value), table, to_logical


def flex_storage(pool: torch.Tensor) -> torch.Tensor:
    """A pool ``[blocks, kv_heads, block, D]`` as FlexAttention's ``[1, kv_heads, blocks * block, D]``."""
    blocks, kv_heads, size, dim = pool.shape
    return pool.transpose(0, 1).reshape(1, kv_heads, blocks * size, dim).contiguous()


def flex_block_mask(last: torch.Tensor, table: torch.Tensor, to_logical: torch.Tensor, block_size: int,
                    num_blocks: int, q_block: int = 128):
    """FlexAttention's ``BlockMask`` over the pool for queries ``[n, Q]`` that see their row's
    logical columns ``0 .. last``: per block of ``q_block`` queries, the blocks every query sees
    whole are full (no mask_mod), the rest up to the furthest column partial, both mapped to
    physical blocks through ``table``; the mask_mod maps physical columns back to logical ones."""
    from torch.nn.attention.flex_attention import BlockMask

    n, q_len = last.shape
    per_row = table.shape[1]
    q_blocks = -(-q_len // q_block)
    pad = q_blocks * q_block - q_len
    lo = torch.nn.functional.pad(last, (0, pad), value=1 << 30).view(n, q_blocks, q_block).amin(-1)
    hi = torch.nn.functional.pad(last, (0, pad), value=-1).view(n, q_blocks, q_block).amax(-1)
    full = torch.where(lo >= 0, (lo + 1) // block_size, 0)
    total = torch.where(hi >= 0, (hi + block_size) // block_size, 0)
    j = torch.arange(per_row, device=last.device)
    full_idx = table.view(n, 1, per_row).expand(n, q_blocks, per_row)
    part_idx = table.gather(1, (full.unsqueeze(-1) + j).clamp(max=per_row - 1).view(n, -1)).view(n, q_blocks, per_row)

    def mask_mod(b, h, q, kv):
        logical_block = to_logical[b, kv // block_size]
        return (logical_block >= 0) & (logical_block * block_size + kv % block_size <= last[b, q])

    args = ((total - full).int().unsqueeze(1), part_idx.int().unsqueeze(1).contiguous(),
            full.int().unsqueeze(1), full_idx.int().unsqueeze(1).contiguous())
    kw = {"BLOCK_SIZE": (q_block, block_size), "mask_mod": mask_mod, "seq_lengths": (q_len, num_blocks * block_size)}
    try:
        return BlockMask.from_kv_blocks(*args, **kw, compute_q_blocks=False)
    except TypeError:  # older torch
        return BlockMask.from_kv_blocks(*args, **kw)


def flex_options(q_len: int, block_size: int) -> dict | None:
    """Kernel tiles that divide the block size (the decoding kernel fits its own)."""
    return None if q_len < 128 else {"BLOCK_M": 64, "BLOCK_N": min(64, block_size)}


# ----------------------------------------------------------------------------- steps

def decode_step(n, heads, kv_heads, q_len, dim, lengths, dtype, device, gen) -> dict:
    """``n`` rows of ``lengths`` columns whose last ``q_len`` are the step's queries."""
    width = int(lengths.max())
    query = torch.randn(n, q_len, heads, dim, generator=gen).to(dtype).to(device).transpose(1, 2)
    key, value = columns_of(n, kv_heads, width, dim, dtype, device, gen)
    last = (lengths.view(n, 1) - q_len + torch.arange(q_len)).to(device)
    return {"query": query, "key": key, "value": value, "last": last, "lengths": lengths}


def checks(dtype, device, gen, block_sizes) -> list[dict]:
    """(a): the paged kernel, the varlen entry and FlexAttention's paged mask against the
    float64 reference (max absolute error; ``ok`` under the dtype's tolerance)."""
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    small = device.type != "cuda"
    shapes = [  # (rows, heads, kv heads, Q, longest row, gated, window)
        (4, 4, 2, 1, 150, False, None), (3, 4, 4, 4, 200, True, 7), (2, 4, 2, 40, 120, True, None),
    ] if small else [
        (16, 32, 8, 1, 1000, False, None), (16, 32, 32, 4, 1000, True, 64), (3, 32, 8, 700, 2500, True, 256),
        (8, 12, 4, 4, 600, False, 100),
    ]
    found = []
    for n, heads, kv_heads, q_len, width, gated, window in shapes:
        lengths = torch.randint(q_len, width + 1, (n,), generator=gen)
        query = torch.randn(n, q_len, heads, 16 if small else 64, generator=gen).to(dtype).to(device)
        query = query.transpose(1, 2)
        key, value = columns_of(n, kv_heads, width, query.shape[-1], dtype, device, gen)
        last = (lengths.view(n, 1) - q_len + torch.arange(q_len)).to(device)
        last[0, q_len // 2:] = -1  # padding queries
        kw = {}
        if gated:
            kw = {"foreign": (torch.rand(n, width + 256, generator=gen) < 0.3).to(device),
                  "gate": torch.randn(heads, generator=gen).to(device)}
        if window:
            kw["window"] = window
        ref = ra.row_attention_reference(query, key, value, last, **kw)
        for bs in block_sizes:
            kp, vp, table, to_logical = paged(key, value, lengths, bs, gen)
            out = ra.row_attention(query, kp, vp, last, block_table=table, **kw)
            err = float((out.double() - ref).abs().max())
            found.append({"what": "paged", "shape": [n, heads, kv_heads, q_len, width], "gated": gated,
                          "window": window, "block_size": bs, "max_err": err, "ok": err < tol})
            tokens = query.transpose(1, 2).reshape(n * q_len, heads, -1)
            start = torch.arange(0, n * q_len + 1, q_len, device=device)
            out = ra.row_attention_varlen(tokens, kp, vp, last.reshape(-1), start, block_table=table, **kw)
            err = float((out.double() - ref.reshape(n * q_len, heads, -1)).abs().max())
            found.append({"what": "varlen", "shape": [n, heads, kv_heads, q_len, width], "gated": gated,
                          "window": window, "block_size": bs, "max_err": err, "ok": err < tol})
            if not gated and window is None and q_len < 128:
                err = flex_error(query, kp, vp, last, table, to_logical, bs, ref, heads // kv_heads)
                found.append({"what": "flex", "shape": [n, heads, kv_heads, q_len, width], "block_size": bs,
                              "max_err": err, "ok": err < tol})
    return found


def flex_error(query, kp, vp, last, table, to_logical, bs, ref, group) -> float:
    from torch.nn.attention.flex_attention import flex_attention

    fn = flex_attention if query.device.type != "cuda" else torch.compile(flex_attention, dynamic=False)
    mask = flex_block_mask(last, table, to_logical, bs, kp.shape[0])
    out = fn(query.contiguous(), flex_storage(kp), flex_storage(vp), block_mask=mask, enable_gqa=group > 1,
             kernel_options=flex_options(query.shape[2], bs))
    seen = last >= 0  # (flex gives queries that see nothing whatever it likes)
    return float((out.transpose(1, 2).double() - ref)[seen].abs().max())


# ----------------------------------------------------------------------------- timing

class Timer:
    """CUDA-graph replays timed by ``do_bench``; the copy bandwidth for the bound.  Off CUDA
    (``--quick``) each function runs once and its time is None."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.copy_gb_s = cuda, None
        if not cuda:
            return
        from triton.testing import do_bench

        self.do_bench = do_bench
        x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        y = torch.empty_like(x)
        self.copy_gb_s = 2 * x.numel() / self.ms(lambda: y.copy_(x), graph=False) / 1e6
        del x, y

    def ms(self, fn, *, graph: bool = True) -> float | None:
        if not self.cuda:
            fn()
            return None
        if graph:
            fn = graphed(fn)
        return float(self.do_bench(fn, warmup=25, rep=100))


def time_step(name: str, step: dict, timer: Timer, flex_fn, budget_end: float, gen, skipped: list,
              block_sizes=BLOCK_SIZES) -> list[dict]:
    """The rows of table (b) for one step, one per block size."""
    query, key, value, last, lengths = step["query"], step["key"], step["value"], step["last"], step["lengths"]
    n, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    held = int(lengths.sum()) * kv_heads * dim * 2 * key.element_size()
    contiguous = timer.ms(lambda: ra.row_attention(query, key, value, last))
    want = ra.row_attention(query, key, value, last)
    rows = []
    for bs in block_sizes:
        row = {"step": name, "rows": n, "q": q_len, "kv_heads": kv_heads, "block_size": bs,
               "columns": int(lengths.sum()), "contiguous_ms": contiguous,
               "bound_ms": held / timer.copy_gb_s / 1e6 if timer.copy_gb_s else None}
        kp, vp, table, to_logical = paged(key, value, lengths, bs, gen)
        row["paged_ms"] = timer.ms(lambda: ra.row_attention(query, kp, vp, last, block_table=table))
        row["paged_vs_contiguous_err"] = float((ra.row_attention(query, kp, vp, last, block_table=table).float()
                                                - want.float()).abs().max())
        ko, vo = kp.transpose(0, 1).contiguous().transpose(0, 1), vp.transpose(0, 1).contiguous().transpose(0, 1)
        row["paged_heads_outer_ms"] = timer.ms(lambda: ra.row_attention(query, ko, vo, last, block_table=table))
        del ko, vo
        if q_len >= 128 and bs == 64:  # query tiles of 64 rows instead of 128
            saved, ra.MAX_TILE_ROWS = ra.MAX_TILE_ROWS, 64
            row["paged_tile64_ms"] = timer.ms(lambda: ra.row_attention(query, kp, vp, last, block_table=table))
            ra.MAX_TILE_ROWS = saved
        if time.time() > budget_end:
            skipped.append(f"flex {name} block {bs}")
        else:
            try:
                ks, vs = flex_storage(kp), flex_storage(vp)
                qc = query.contiguous()
                mask = flex_block_mask(last, table, to_logical, bs, kp.shape[0])
                opts = flex_options(q_len, bs)
                row["flex_mask_ms"] = timer.ms(lambda: flex_block_mask(last, table, to_logical, bs, kp.shape[0]),
                                               graph=False)

                def flex():
                    return flex_fn(qc, ks, vs, block_mask=mask, enable_gqa=heads != kv_heads, kernel_options=opts)

                got = flex().transpose(1, 2)
                row["flex_vs_paged_err"] = float((got.float() - want.float()).abs().max())
                try:
                    row["flex_ms"] = timer.ms(flex)
                except RuntimeError as e:  # a graph FlexAttention will not be captured in: timed as it runs
                    row["flex_graph_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    row["flex_ms"] = timer.ms(flex, graph=False)
                del ks, vs, mask
            except Exception as e:  # noqa: BLE001  (recorded: a block size FlexAttention refuses)
                row["flex_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        del kp, vp, table, to_logical
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def time_mixed(sizes: dict, timer: Timer, gen, dtype, device) -> list[dict]:
    """Decoding rows and one prefill chunk: one varlen call against two calls."""
    n_dec, chunk, cached = sizes["mixed"]
    heads, dim, kv_heads = sizes["heads"], sizes["dim"], sizes["decode"][0][0]
    lengths = torch.cat([torch.randint(16, sizes["longest"] + 1, (n_dec,), generator=gen),
                         torch.tensor([cached + chunk])])
    n = n_dec + 1
    key, value = columns_of(n, kv_heads, int(lengths.max()), dim, dtype, device, gen)
    tokens = n_dec + chunk
    query = torch.randn(tokens, heads, dim, generator=gen).to(dtype).to(device)
    last = torch.cat([lengths[:n_dec] - 1, cached + torch.arange(chunk)]).to(device)
    start = torch.cat([torch.arange(n_dec + 1), torch.tensor([tokens])]).to(device)
    dec_q, dec_last = query[:n_dec].unsqueeze(2), last[:n_dec].view(n_dec, 1)
    pre_q, pre_last = query[n_dec:].transpose(0, 1).unsqueeze(0), last[n_dec:].view(1, chunk)
    rows = []
    for bs in sizes["block_sizes"]:
        kp, vp, table, _ = paged(key, value, lengths, bs, gen)
        row = {"step": f"mixed {n_dec}x1 + 1x{chunk}", "kv_heads": kv_heads, "block_size": bs}
        got = ra.row_attention_varlen(query, kp, vp, last, start, block_table=table, max_queries=chunk)
        row["varlen_ms"] = timer.ms(lambda: ra.row_attention_varlen(query, kp, vp, last, start, block_table=table,
                                                                    max_queries=chunk))
        want = torch.cat([ra.row_attention(dec_q, kp, vp, dec_last, block_table=table)[:, 0],
                          ra.row_attention(pre_q, kp, vp, pre_last, block_table=table[n_dec:])[0]])
        row["varlen_vs_two_calls_err"] = float((got.float() - want.float()).abs().max())

        def two_calls():
            ra.row_attention(dec_q, kp, vp, dec_last, block_table=table)
            ra.row_attention(pre_q, kp, vp, pre_last, block_table=table[n_dec:])

        row["two_calls_ms"] = timer.ms(two_calls)
        rows.append(row)
        print(json.dumps(row), flush=True)
        del kp, vp, table
    return rows


def table_lines(runs: list[dict], mixed: list[dict]) -> list[str]:
    def f(x):
        return "-" if x is None else f"{x:.3f}"

    def ratio(a, b):
        return "-" if a is None or b is None else f"{a / b:.2f}x"

    lines = ["| step | kv | block | contiguous ms | paged ms | paged / contiguous | flex ms | flex / paged "
             "| bound ms |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        flex = r.get("flex_ms")
        lines.append(f"| {r['step']} | {r['kv_heads']} | {r['block_size']} | {f(r['contiguous_ms'])} | "
                     f"{f(r['paged_ms'])} | {ratio(r['paged_ms'], r['contiguous_ms'])} | {f(flex)} | "
                     f"{ratio(flex, r['paged_ms'])} | {f(r['bound_ms'])} |")
    for r in mixed:
        lines.append(f"| {r['step']} (varlen; / two calls) | {r['kv_heads']} | {r['block_size']} | - | "
                     f"{f(r['varlen_ms'])} | {ratio(r['varlen_ms'], r['two_calls_ms'])} | - | - | - |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="checks on a tiny shape only, no timings (CPU)")
    ap.add_argument("--budget-s", type=float, default=180.0,
                    help="seconds after which the remaining FlexAttention timings are skipped")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    cuda = torch.cuda.is_available() and not a.quick
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    gen = torch.Generator().manual_seed(0)
    res = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "quick": a.quick, "max_tile_rows": ra.MAX_TILE_ROWS, "block_n": ra.BLOCK_N}
    if not cuda:  # (eager FlexAttention: fine at tiny shapes)
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    res["checks"] = checks(dtype, device, gen, (16, 128))
    for c in res["checks"]:
        print(("ok   " if c["ok"] else "FAIL ") + json.dumps(c), flush=True)
    res["runs"], res["mixed"], res["skipped"] = [], [], []
    from torch.nn.attention.flex_attention import flex_attention

    flex_fn = flex_attention
    if cuda:
        import triton

        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 256)
        res["triton"] = triton.__version__
        flex_fn = torch.compile(flex_attention, dynamic=False)
    timer = Timer(cuda)
    res["copy_gb_s"] = timer.copy_gb_s
    sizes = SIZES["quick" if a.quick else "full"]
    res["sizes"] = sizes
    budget_end = t0 + a.budget_s
    heads, dim, n = sizes["heads"], sizes["dim"], sizes["rows"]
    lengths = torch.randint(16, sizes["longest"] + 1, (n,), generator=gen)
    for kv_heads, q_len in sizes["decode"]:
        step = decode_step(n, heads, kv_heads, q_len, dim, lengths, dtype, device, gen)
        res["runs"] += time_step(f"decode {n}x{q_len}", step, timer, flex_fn, budget_end, gen, res["skipped"],
                                 sizes["block_sizes"])
        del step
        if cuda:
            torch.cuda.empty_cache()
    for cached, q_len in sizes["prefill"]:
        step = decode_step(len(cached), heads, sizes["decode"][0][0], q_len, dim, torch.tensor(cached) + q_len,
                           dtype, device, gen)
        res["runs"] += time_step(f"prefill {len(cached)}x{q_len}", step, timer, flex_fn, budget_end, gen,
                                 res["skipped"], sizes["block_sizes"])
    res["mixed"] = time_mixed(sizes, timer, gen, dtype, device)
    res["elapsed_s"] = time.time() - t0
    with open(os.path.join(a.out, "paged_attention.json"), "w") as f:
        json.dump(res, f, indent=1)
    if res["skipped"]:
        print("skipped (time budget):", ", ".join(res["skipped"]))
    failed = [c for c in res["checks"] if not c["ok"]]
    print(f"checks: {len(res['checks']) - len(failed)} ok, {len(failed)} failed; {res['elapsed_s']:.0f} s")
    if res["runs"]:
        print("\n".join(table_lines(res["runs"], res["mixed"])))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

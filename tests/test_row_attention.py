"""The engine's row attention (:mod:`cyb.kernels.row_attention`): the float64 reference against the
masked softmax the engine runs otherwise, the Triton kernels against the reference (on CPU tensors
under ``TRITON_INTERPRET=1`` where triton is installed, and on CUDA under ``-m gpu``), the paged
kernel against the contiguous one (the same columns in a shuffled pool of blocks), the varlen
entry against both, and the engine's choice of it."""

from __future__ import annotations

import pytest
import torch

from cyb.engine import Engine, EngineOptions
from cyb.engine.runner import row_attention_reason
from cyb.kernels import triton_available
from cyb.kernels import row_attention as ra
from cyb.kernels.row_attention import (BLOCK_N, plan, row_attention, row_attention_reference, row_attention_varlen,
                                       row_attention_varlen_reference, split_plan)
from engine_helpers import layout_model

#: (rows, heads, key heads, Q, head dim, columns, gated)
SHAPES = [
    (3, 4, 2, 1, 16, 70, False),     # grouped heads, one position
    (2, 2, 2, 4, 32, 130, True),     # a block of 4 positions, gated
    (1, 3, 1, 2, 24, 10, False),     # head dim not a power of two, fewer columns than a tile
    (4, 4, 4, 1, 64, 300, True),     # several splits
]


def inputs(shape, *, dtype=torch.float32, device="cpu", seed=0, scale_logits=1.0):
    n, heads, kv_heads, q_len, dim, cols, gated = shape
    g = torch.Generator().manual_seed(seed)
    # views as the decoder hands them over: queries [n, H, Q, D] of [n, Q, H, D], and a cache
    # with more rows and columns than the step reads
    query = (torch.randn(n, q_len, heads, dim, generator=g) * scale_logits).to(dtype).to(device).transpose(1, 2)
    key = torch.randn(n + 1, kv_heads, cols + 3, dim, generator=g).to(dtype).to(device)[:, :, :cols]
    value = torch.randn(n + 1, kv_heads, cols + 3, dim, generator=g).to(dtype).to(device)[:, :, :cols]
    start = torch.randint(0, cols - q_len + 1, (n, 1), generator=g)
    last = (start + torch.arange(q_len)).to(device)
    if n > 1:
        last[0] = -1  # a row that is not decoding sees nothing
    foreign = (torch.rand(n + 1, cols, generator=g) < 0.3).to(device) if gated else None
    gate = torch.randn(heads, generator=g).to(device) * 3 if gated else None
    return query, key, value, last, foreign, gate


def window_inputs(shape, in_positions: bool, seed=0):
    """``(window, query_pos, key_pos)`` for a sliding window of 7, in columns or in positions
    (columns hold increasing positions, some columns apart by more than one)."""
    n, _, _, q_len, _, cols, _ = shape
    if not in_positions:
        return 7, None, None
    g = torch.Generator().manual_seed(seed)
    key_pos = torch.randint(1, 3, (n + 1, cols), generator=g).cumsum(1)
    last = inputs(shape, seed=seed)[3]
    query_pos = key_pos[:n].gather(1, last.clamp(min=0)) + 1
    return 7, query_pos, key_pos


def masked_softmax(query, key, value, last, foreign, gate, scale, window=None, query_pos=None, key_pos=None):
    """The engine's other path: sdpa over every column with the mask ``column <= last`` (and the
    gate as an additive mask, a window cut as :func:`cyb.model.attention.per_layer_masks` cuts
    it), float64; rows that see nothing left out."""
    from cyb.model.attention import per_layer_masks

    n, heads, q_len, dim = query.shape
    cols = key.shape[2]
    group = heads // key.shape[1]
    seen = torch.arange(cols).view(1, 1, 1, cols) <= last.view(n, 1, q_len, 1)
    if window is not None:
        config = type("Config", (), {"sliding_window": window})()
        qp, kp = (last, torch.arange(cols).expand(n, cols)) if query_pos is None else (query_pos, key_pos[:n])
        seen = per_layer_masks(seen[:, 0], qp, kp, config)
    bias = torch.where(seen, 0.0, float("-inf")).double().expand(n, heads, q_len, cols)
    if gate is not None:
        bias = bias + torch.where(foreign[:n].view(n, 1, 1, cols), gate.double().view(1, heads, 1, 1), 0.0)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.double(), key[:n].double().repeat_interleave(group, 1), value[:n].double().repeat_interleave(group, 1),
        attn_mask=bias, scale=scale)
    return out.transpose(1, 2)


IDS = ["x".join(map(str, s[:6])) + ("-gated" if s[6] else "") for s in SHAPES]
WINDOWS = ["no-window", "window-in-columns", "window-in-positions"]


def window_args(shape, kind: str) -> dict:
    if kind == "no-window":
        return {}
    window, query_pos, key_pos = window_inputs(shape, kind == "window-in-positions")
    return {"window": window, "query_pos": query_pos, "key_pos": key_pos}


@pytest.mark.parametrize("kind", WINDOWS)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_reference_is_the_masked_softmax(shape, kind):
    query, key, value, last, foreign, gate = inputs(shape, dtype=torch.float64)
    win = window_args(shape, kind)
    ref = row_attention_reference(query, key, value, last, scale=0.3, foreign=foreign, gate=gate, **win)
    dense = masked_softmax(query, key, value, last, foreign, gate, 0.3, **win)
    sees = last[:, 0] >= 0
    torch.testing.assert_close(ref[sees], dense[sees], rtol=1e-12, atol=1e-12)
    assert (ref[~sees] == 0).all()


def test_split_plan_covers_the_columns_in_whole_tiles():
    cpu = torch.device("cpu")
    for rows, kv_heads, cols in [(1, 1, 10), (1, 12, 1000), (256, 12, 1000), (3, 2, 4097)]:
        splits, per_split = split_plan(rows, kv_heads, cols, cpu)
        assert per_split % BLOCK_N == 0
        assert splits * per_split >= cols > (splits - 1) * per_split


def test_wrong_shapes_are_refused():
    query, key, value, last, foreign, gate = inputs(SHAPES[1])
    with pytest.raises(ValueError, match="last must be"):
        row_attention_reference(query, key, value, last[:, :1])
    with pytest.raises(ValueError, match="go together"):
        row_attention_reference(query, key, value, last, foreign=foreign)
    with pytest.raises(ValueError, match="evenly"):
        row_attention_reference(query[:, :1].expand(-1, 3, -1, -1), key, value, last)
    with pytest.raises(ValueError, match="with a window"):
        row_attention_reference(query, key, value, last, query_pos=last, key_pos=last)
    with pytest.raises(ValueError, match="window must be"):
        row_attention_reference(query, key, value, last, window=0)


@pytest.mark.parametrize("kind", WINDOWS)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_kernel_interpreted(triton_interpreted, shape, kind):
    query, key, value, last, foreign, gate = inputs(shape)
    win = window_args(shape, kind)
    out = row_attention(query, key, value, last, scale=0.3, foreign=foreign, gate=gate, **win)
    ref = row_attention_reference(query, key, value, last, scale=0.3, foreign=foreign, gate=gate, **win)
    assert out.shape == ref.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_kernel_interpreted_extreme_logits(triton_interpreted):
    """Logits of +-1e4: the online softmax must not overflow or lose the largest one."""
    shape = (2, 2, 1, 1, 16, 200, True)
    query, key, value, last, foreign, gate = inputs(shape, scale_logits=300.0)
    out = row_attention(query, key, value, last, scale=1.0, foreign=foreign, gate=gate)
    ref = row_attention_reference(query, key, value, last, scale=1.0, foreign=foreign, gate=gate)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)


def test_engine_choice_on_the_cpu(monkeypatch):
    """On the CPU the engine attends through the mask unless row attention is asked for, which
    runs only under triton's interpreter (the tests' check of its path)."""
    model = layout_model("private")
    assert row_attention_reason(model) == "it runs on CUDA only"
    assert not Engine(model, capacity=32, slots=2).runner.row_attention
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="row attention cannot run this model: it runs on CUDA only"):
        Engine(model, capacity=32, slots=2, options=EngineOptions(row_attention=True))
    with pytest.raises(ValueError, match="row_attention must be"):
        EngineOptions(row_attention="yes")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", WINDOWS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES + [(256, 12, 12, 1, 64, 1024, False), (5, 9, 3, 4, 64, 777, True),
                                            (2, 8, 2, 1, 128, 4000, False)],
                         ids=lambda s: "x".join(map(str, s[:6])) + ("-gated" if s[6] else ""))
def test_kernel_cuda(shape, dtype, kind):
    if not torch.cuda.is_available() or not triton_available():
        pytest.skip("needs CUDA and triton")
    query, key, value, last, foreign, gate = inputs(shape, dtype=dtype, device="cuda")
    win = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in window_args(shape, kind).items()}
    out = row_attention(query, key, value, last, scale=0.125, foreign=foreign, gate=gate, **win)
    ref = row_attention_reference(query, key, value, last, scale=0.125, foreign=foreign, gate=gate, **win)
    assert out.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- paged, prefill, varlen

#: (rows, heads, key heads, Q, head dim, columns, gated, block size, window, most rows of a query tile)
PAGED = [
    (3, 4, 2, 1, 16, 70, False, 16, "no-window", None),            # GQA, a tile spans 4 blocks
    (2, 2, 2, 4, 32, 130, True, 64, "window-in-columns", None),    # gated, M positions, a tile is a block
    (4, 4, 4, 1, 64, 300, True, 16, "window-in-positions", None),
    (2, 6, 2, 3, 24, 300, False, 256, "window-in-columns", None),  # a block holds 4 tiles, head dim 24
    (2, 4, 2, 40, 16, 150, False, 16, "no-window", 16),            # a prefill chunk in 5 query tiles
    (3, 2, 1, 33, 16, 120, True, 64, "window-in-positions", 16),   # gated chunk, rows padded with -1
]
PAGED_IDS = ["x".join(map(str, c[:6])) + ("-gated" if c[6] else "") + f"-b{c[7]}-{c[8]}" for c in PAGED]


def chunk_inputs(case, *, dtype=torch.float32, device="cpu", seed=0):
    """``(query, key, value, last, kwargs)``: rows of ``Q`` queries at consecutive columns after a
    random number of cached ones (a decoding step for small ``Q``, a prefill chunk for large),
    row 0 seeing nothing and the last row's final queries padding (``last = -1``)."""
    n, heads, kv_heads, q_len, dim, cols, gated, _, window, _ = case
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(n, q_len, heads, dim, generator=g).to(dtype).to(device).transpose(1, 2)
    key = torch.randn(n, kv_heads, cols, dim, generator=g).to(dtype).to(device)
    value = torch.randn(n, kv_heads, cols, dim, generator=g).to(dtype).to(device)
    last = torch.randint(0, cols - q_len + 1, (n, 1), generator=g) + torch.arange(q_len)
    last[0] = -1
    if q_len > 4:
        last[-1, -q_len // 3:] = -1
    kwargs = {}
    if gated:
        kwargs["foreign"] = (torch.rand(n, cols + 256, generator=g) < 0.3).to(device)
        kwargs["gate"] = (torch.randn(heads, generator=g) * 3).to(device)
    if window != "no-window":
        kwargs["window"] = 7 if q_len < 8 else 20
    if window == "window-in-positions":
        key_pos = torch.randint(1, 3, (n, cols + 256), generator=g).cumsum(1)
        kwargs["key_pos"] = key_pos.to(device)
        kwargs["query_pos"] = (key_pos.gather(1, last.clamp(min=0)) + 1).to(device)
    return query, key, value, last.to(device), kwargs


def pooled(key, value, last, block_size, *, seed=0, share=0, heads_outer=False, dtype=torch.int32):
    """The rows' columns in a shuffled pool of blocks, as a paged cache holds them:
    ``(key_pool, value_pool, block_table)``.  Blocks no row reads hold NaN; table entries past a
    row's last visible column hold ids outside the pool.  ``share``: row 1 reads row 0's first
    ``share`` blocks (the same physical blocks; the caller makes their columns equal).
    ``heads_outer``: the pool is a view of ``[kv_heads, blocks, block_size, D]`` storage."""
    n, kv_heads, cols, dim = key.shape
    per_row = -(-cols // block_size)
    total = n * per_row + 3
    g = torch.Generator().manual_seed(seed)
    table = torch.randperm(total, generator=g)[:n * per_row].view(n, per_row).to(key.device)

    def pool(x):
        padded = torch.zeros(n, kv_heads, per_row * block_size, dim, dtype=x.dtype, device=x.device)
        padded[:, :, :cols] = x
        shape = (kv_heads, total, block_size, dim) if heads_outer else (total, kv_heads, block_size, dim)
        out = torch.full(shape, float("nan"), dtype=x.dtype, device=x.device)
        out = out.transpose(0, 1) if heads_outer else out
        out[table] = padded.view(n, kv_heads, per_row, block_size, dim).transpose(1, 2)
        out[table[1, :share]] = float("nan")  # row 1's own copies: never read
        return out

    key_pool, value_pool = pool(key), pool(value)
    table[1, :share] = table[0, :share]
    for i in range(n):  # (entries past a row's last block: never read)
        used = (int(last[i].max()) + block_size) // block_size
        table[i, used:] = torch.tensor([10 ** 7, -3]).repeat(per_row)[:per_row - used]
    return key_pool, value_pool, table.to(dtype)


@pytest.fixture
def tile_rows(monkeypatch):
    """Set :data:`cyb.kernels.row_attention.MAX_TILE_ROWS` for one test (None: as it is)."""
    def set_rows(rows):
        if rows is not None:
            monkeypatch.setattr(ra, "MAX_TILE_ROWS", rows)
    return set_rows


@pytest.mark.parametrize("case", PAGED, ids=PAGED_IDS)
def test_paged_kernel_interpreted(triton_interpreted, tile_rows, case):
    """The same columns in a shuffled pool give the contiguous kernel's result, and the
    reference's (read through the table or not)."""
    tile_rows(case[9])
    query, key, value, last, kw = chunk_inputs(case)
    key_pool, value_pool, table = pooled(key, value, last, case[7], heads_outer=case[7] == 16)
    paged = row_attention(query, key_pool, value_pool, last, scale=0.3, block_table=table, **kw)
    flat = row_attention(query, key, value, last, scale=0.3, **kw)
    ref = row_attention_reference(query, key, value, last, scale=0.3, **kw)
    torch.testing.assert_close(row_attention_reference(query, key_pool, value_pool, last, scale=0.3,
                                                       block_table=table, **kw), ref, rtol=1e-12, atol=1e-12)
    assert torch.isfinite(paged).all() and paged.shape == ref.shape
    torch.testing.assert_close(paged, flat, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(paged.double(), ref, rtol=1e-5, atol=1e-5)
    assert (paged[last < 0] == 0).all()


def test_paged_kernel_interpreted_splits(triton_interpreted, monkeypatch):
    """Several splits of the columns (merged by log-sum-exp), over a prefill chunk and GQA."""
    monkeypatch.setattr(ra, "PROGRAMS_PER_SM", 24)
    monkeypatch.setattr(ra, "MAX_TILE_ROWS", 32)
    case = (2, 4, 2, 20, 16, 200, True, 16, "window-in-positions", None)
    query, key, value, last, kw = chunk_inputs(case, seed=1)
    key_pool, value_pool, table = pooled(key, value, last, 16, dtype=torch.int64)
    assert plan(2, 2, 2, table.shape[1] * 16, query.device, queries=20).splits > 1
    paged = row_attention(query, key_pool, value_pool, last, block_table=table, **kw)
    ref = row_attention_reference(query, key, value, last, **kw)
    torch.testing.assert_close(paged.double(), ref, rtol=1e-5, atol=1e-5)


def test_paged_kernel_interpreted_shared_blocks(triton_interpreted):
    """Two rows reading the same physical blocks (a shared prefix) each get their own result."""
    case = (3, 4, 2, 4, 16, 100, False, 16, "no-window", None)
    query, key, value, last, kw = chunk_inputs(case, seed=2)
    last[0] = torch.arange(60, 64)  # rows 0 and 1 both see past the shared 3 blocks
    last[1] = torch.arange(90, 94)
    key[1, :, :48], value[1, :, :48] = key[0, :, :48], value[0, :, :48]
    key_pool, value_pool, table = pooled(key, value, last, 16, share=3)
    assert (table[0, :3] == table[1, :3]).all()
    paged = row_attention(query, key_pool, value_pool, last, block_table=table)
    torch.testing.assert_close(paged.double(), row_attention_reference(query, key, value, last),
                               rtol=1e-5, atol=1e-5)


def test_paged_kernel_interpreted_entries_before_a_window(triton_interpreted):
    """With a window in columns, table entries of blocks wholly before every query's window are
    not read (an engine may free them)."""
    case = (2, 2, 2, 1, 16, 200, False, 16, "window-in-columns", None)
    query, key, value, last, kw = chunk_inputs(case, seed=3)
    last[0] = 150
    key_pool, value_pool, table = pooled(key, value, last, 16)
    table[0, :(150 - 7 + 1) // 16] = -1  # columns 0 .. 143; the window starts at 144
    paged = row_attention(query, key_pool, value_pool, last, block_table=table, **kw)
    torch.testing.assert_close(paged.double(), row_attention_reference(query, key, value, last, **kw),
                               rtol=1e-5, atol=1e-5)


def varlen_step(lengths, *, heads=4, kv_heads=2, dim=16, cols=120, padding=2, seed=0, gated=True):
    """A flattened step: rows of ``lengths`` queries (0: a row with none), each at consecutive
    columns after its cached ones, and ``padding`` tokens after the last row.  Returns
    ``(query, key, value, last, query_start, kwargs)``."""
    g = torch.Generator().manual_seed(seed)
    n, tokens = len(lengths), sum(lengths) + padding
    query = torch.randn(tokens, heads, dim, generator=g)
    key = torch.randn(n, kv_heads, cols, dim, generator=g)
    value = torch.randn(n, kv_heads, cols, dim, generator=g)
    last = torch.full((tokens,), -1)
    start = [0]
    for q in lengths:
        first = int(torch.randint(0, cols - q + 1, (1,), generator=g))
        last[start[-1]:start[-1] + q] = first + torch.arange(q)
        start.append(start[-1] + q)
    kw = {}
    if gated:
        kw = {"foreign": torch.rand(n, cols + 64, generator=g) < 0.3, "gate": torch.randn(heads, generator=g) * 3}
    return query, key, value, last, torch.tensor(start, dtype=torch.int32), kw


def _paged_step(key, value, last, start, lengths, block_size):
    """A flattened step's rows in a pool of ``block_size`` columns (None: as they are, no table):
    ``(key, value, table)``, each row's blocks up to the last column any of its queries sees."""
    if block_size is None:
        return key, value, None
    per_row = torch.full((len(lengths), 1), -1)
    for i in range(len(lengths)):
        if lengths[i]:
            per_row[i] = last[start[i]:start[i + 1]].max()
    return pooled(key, value, per_row, block_size)


@pytest.mark.parametrize("block_size,max_queries,splits", [(None, None, False), (16, 8, False), (64, None, True)],
                         ids=["rows", "paged16-max8", "paged64-splits"])
def test_varlen_kernel_interpreted(triton_interpreted, monkeypatch, block_size, max_queries, splits):
    """Decoding rows, an empty row and prefill chunks in one flattened step equal the reference
    and the padded call of :func:`row_attention`; the padding returns zeros."""
    monkeypatch.setattr(ra, "MAX_TILE_ROWS", 32)
    if splits:
        monkeypatch.setattr(ra, "PROGRAMS_PER_SM", 40)
    lengths = [1, 0, 37, 1, 3]
    query, key, value, last, start, kw = varlen_step(lengths)
    key, value, table = _paged_step(key, value, last, start, lengths, block_size)
    columns = key.shape[2] if table is None else table.shape[1] * block_size
    assert (plan(len(lengths), 2, 2, columns, query.device, queries=max_queries or len(last),
                 tokens=len(last)).splits > 1) == splits
    out = row_attention_varlen(query, key, value, last, start, block_table=table, max_queries=max_queries, **kw)
    ref = row_attention_varlen_reference(query, key, value, last, start, block_table=table, **kw)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    assert (out[start[-1]:] == 0).all()
    if splits:
        return
    # the same rows padded to the longest, through row_attention
    q_pad = torch.zeros(len(lengths), max(lengths), *query.shape[1:])
    last_pad = torch.full((len(lengths), max(lengths)), -1)
    for i, q in enumerate(lengths):
        q_pad[i, :q], last_pad[i, :q] = query[start[i]:start[i + 1]], last[start[i]:start[i + 1]]
    padded = row_attention(q_pad.transpose(1, 2), key, value, last_pad, block_table=table, **kw)
    for i, q in enumerate(lengths):
        torch.testing.assert_close(out[start[i]:start[i + 1]], padded[i, :q], rtol=1e-6, atol=1e-6)


def _below(last, seed=1):
    """Each query's own token's first column: a few columns at or before its own."""
    g = torch.Generator().manual_seed(seed)
    return (last - torch.randint(0, 4, last.shape, generator=g)).clamp(min=0)


def test_foreign_below_gates_each_query_only_below_its_own_column():
    """The reference with ``foreign_below`` is, query by query, the reference with that query's
    own marks: ``foreign & (column < foreign_below)``."""
    lengths = [1, 0, 37, 1, 3]
    query, key, value, last, start, kw = varlen_step(lengths, dim=8)
    below = _below(last)
    ref = row_attention_varlen_reference(query, key, value, last, start, foreign_below=below, **kw)
    bounds = start.tolist()
    cols = torch.arange(kw["foreign"].shape[1])
    for i in range(len(lengths)):
        for t in range(bounds[i], bounds[i + 1]):
            own = (kw["foreign"][i] & (cols < below[t])).unsqueeze(0)
            one = row_attention_reference(query[t].view(1, -1, 1, query.shape[-1]), key[i:i + 1], value[i:i + 1],
                                          last[t].view(1, 1), foreign=own, gate=kw["gate"])
            torch.testing.assert_close(ref[t], one[0, 0], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="foreign_below goes with foreign"):
        row_attention_varlen_reference(query, key, value, last, start, foreign_below=below)
    with pytest.raises(ValueError, match="foreign_below must be integer and shaped as last"):
        row_attention_varlen_reference(query, key, value, last, start, foreign_below=below[:-1], **kw)


@pytest.mark.parametrize("block_size", [None, 16], ids=["rows", "paged16"])
def test_foreign_below_kernel_interpreted(triton_interpreted, monkeypatch, block_size):
    """The kernels with a foreign column per query equal the reference, flattened and padded."""
    monkeypatch.setattr(ra, "MAX_TILE_ROWS", 32)
    lengths = [1, 0, 37, 1, 3]
    query, key, value, last, start, kw = varlen_step(lengths)
    below = _below(last)
    key, value, table = _paged_step(key, value, last, start, lengths, block_size)
    out = row_attention_varlen(query, key, value, last, start, block_table=table, foreign_below=below, **kw)
    ref = row_attention_varlen_reference(query, key, value, last, start, block_table=table, foreign_below=below,
                                         **kw)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    q_pad = torch.zeros(len(lengths), max(lengths), *query.shape[1:])
    last_pad = torch.full((len(lengths), max(lengths)), -1)
    below_pad = torch.zeros_like(last_pad)
    for i, q in enumerate(lengths):
        rows = slice(start[i], start[i + 1])
        q_pad[i, :q], last_pad[i, :q], below_pad[i, :q] = query[rows], last[rows], below[rows]
    padded = row_attention(q_pad.transpose(1, 2), key, value, last_pad, block_table=table, foreign_below=below_pad,
                           **kw)
    for i, q in enumerate(lengths):
        torch.testing.assert_close(out[start[i]:start[i + 1]], padded[i, :q], rtol=1e-6, atol=1e-6)


def test_plan_tiles_cover_the_queries():
    cpu = torch.device("cpu")
    for rows, group, queries in [(1, 1, 1), (256, 4, 1), (256, 4, 4), (3, 4, 2048), (2, 32, 4), (1, 3, 100)]:
        p = plan(rows, group, 8, 4096, cpu, queries=queries)
        assert p.q_tile * p.q_tiles >= queries > p.q_tile * (p.q_tiles - 1)
        assert group * p.q_tile <= max(group, ra.MAX_TILE_ROWS)
        varlen = plan(rows, group, 8, 4096, cpu, queries=queries, tokens=rows * queries + 5)
        assert varlen.q_tiles >= -(-(rows * queries + 5) // varlen.q_tile) + rows + 1
        cap = max(1, ra.MAX_TILE_ROWS // group)
        assert varlen.q_tile == cap or varlen.q_tile & (varlen.q_tile - 1) == 0


def test_varlen_steps_of_different_longest_rows_share_a_tile():
    """A mixed step's longest row changes from step to step; its tiles (a compiled variant of the
    kernel each) do not, within a power of two."""
    cpu = torch.device("cpu")
    tiles = {q: plan(300, 1, 32, 4096, cpu, queries=q, tokens=256 + q).q_tile for q in range(1, 600)}
    assert {tiles[q] for q in range(65, 600)} == {ra.MAX_TILE_ROWS}
    assert {tiles[q] for q in range(33, 65)} == {64} and tiles[5] == 8 and tiles[1] == 1


def test_paged_wrong_inputs_are_refused():
    case = (2, 4, 2, 1, 16, 70, True, 16, "no-window", None)
    query, key, value, last, kw = chunk_inputs(case)
    key_pool, value_pool, table = pooled(key, value, last, 16)
    with pytest.raises(ValueError, match="block_table must be"):
        row_attention_reference(query, key_pool, value_pool, last, block_table=table.float(), **kw)
    with pytest.raises(ValueError, match="block_table must be"):
        row_attention_reference(query, key_pool, value_pool, last, block_table=table[:1], **kw)
    with pytest.raises(ValueError, match="block_size .* power of two from 16 to 256, got 8"):
        row_attention_reference(query, key_pool[:, :, :8], value_pool[:, :, :8], last, block_table=table, **kw)
    with pytest.raises(ValueError, match=r"foreign \[>= 2, >= 80\]"):
        row_attention_reference(query, key_pool, value_pool, last, block_table=table, foreign=kw["foreign"][:, :70],
                                gate=kw["gate"])
    tokens = query.transpose(1, 2).reshape(2, 4, 16)
    start = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match="last must be"):
        row_attention_varlen_reference(tokens, key, value, last, start)
    with pytest.raises(ValueError, match="query_start must be"):
        row_attention_varlen_reference(tokens, key, value, last[:, 0], start.float())
    with pytest.raises(ValueError, match="max_queries must be"):
        row_attention_varlen(tokens, key, value, last[:, 0], start, max_queries=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case", PAGED + [(64, 32, 8, 1, 64, 2000, False, 16, "no-window", None),
                                          (4, 32, 8, 700, 64, 3000, True, 128, "window-in-positions", None),
                                          (8, 12, 12, 4, 64, 1500, True, 32, "window-in-columns", None)],
                         ids=lambda c: "x".join(map(str, c[:6])) + ("-gated" if c[6] else "") + f"-b{c[7]}-{c[8]}")
def test_paged_kernel_cuda(case, dtype, monkeypatch):
    if not torch.cuda.is_available() or not triton_available():
        pytest.skip("needs CUDA and triton")
    if case[9] is not None:
        monkeypatch.setattr(ra, "MAX_TILE_ROWS", case[9])
    query, key, value, last, kw = chunk_inputs(case, dtype=dtype, device="cuda")
    key_pool, value_pool, table = pooled(key, value, last.cpu(), case[7])
    out = row_attention(query, key_pool, value_pool, last, scale=0.125, block_table=table.cuda(), **kw)
    ref = row_attention_reference(query, key, value, last, scale=0.125, **kw)
    assert out.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_varlen_kernel_cuda_gated_with_foreign_below(dtype):
    """A mixed step on CUDA: decoding rows and prompt chunks of a gated model, read through block
    tables of 16, each query gated only below its own token's first column."""
    if not torch.cuda.is_available() or not triton_available():
        pytest.skip("needs CUDA and triton")
    lengths = [1, 0, 300, 1, 4, 70]
    query, key, value, last, start, kw = varlen_step(lengths, heads=8, kv_heads=2, dim=64, cols=1024)
    below = _below(last)
    per_row = torch.full((len(lengths), 1), -1)
    for i in range(len(lengths)):
        if lengths[i]:
            per_row[i] = last[start[i]:start[i + 1]].max()
    key_pool, value_pool, table = pooled(key, value, per_row, 16)
    cuda = {k: v.cuda() for k, v in kw.items()}
    args = (query.to(dtype).cuda(), key_pool.to(dtype).cuda(), value_pool.to(dtype).cuda(), last.cuda(), start.cuda())
    out = row_attention_varlen(*args, block_table=table.cuda(), foreign_below=below.cuda(), **cuda)
    ref = row_attention_varlen_reference(*args, block_table=table.cuda(), foreign_below=below.cuda(), **cuda)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)

"""The engine's row attention (:mod:`cyb.kernels.row_attention`): the float64 reference against the
masked softmax the engine runs otherwise, the Triton kernels against the reference (on CPU tensors
under ``TRITON_INTERPRET=1`` where triton is installed, and on CUDA under ``-m gpu``), and the
engine's choice of it."""

from __future__ import annotations

import pytest
import torch

from cyb.engine import Engine, EngineOptions
from cyb.engine.runner import row_attention_reason
from cyb.kernels import triton_available
from cyb.kernels.row_attention import BLOCK_N, row_attention, row_attention_reference, split_plan
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

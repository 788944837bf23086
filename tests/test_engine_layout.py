"""cyb.engine.layout: the columns and positions a request's prompt takes in its row of the cache."""

from __future__ import annotations

import random

import pytest
import torch

from cyb.engine.layout import RowLayout


def _plain_prefill(layout, prompt):
    """:meth:`RowLayout.prefill` as the module docstring states it, token by token."""
    m, earlier = layout.num_steps, prompt[:-1]
    if layout.real_only:
        ids = list(earlier)
        positions = [k * (m if layout.advance else 1) for k in range(len(earlier))]
    else:
        ids, positions = [], []
        for k, token in enumerate(earlier):
            ids += [token, *layout.pause_ids[: m - 1]]
            positions += [k * m + j if layout.advance else k for j in range(m)]
    return ids, positions, prompt[-1], (len(prompt) - 1) * (m if layout.advance else 1)


@pytest.mark.parametrize("visibility", ["shared", "private", "gated"])
@pytest.mark.parametrize("m", [1, 2, 4])
@pytest.mark.parametrize("advance", [False, True])
def test_engine_row_layout_prefill_equals_the_columns_token_by_token(visibility, m, advance):
    layout = RowLayout(visibility, m, advance, tuple(range(100, 100 + m - 1)))
    rng = random.Random(m)
    for n in (1, 2, 3, 17, 512):
        prompt = [rng.randrange(3, 99) for _ in range(n)]
        got = layout.prefill(prompt)
        ids, positions, first_token, first_position = _plain_prefill(layout, prompt)
        assert got.ids.dtype == got.positions.dtype == torch.long
        assert got.ids.tolist() == ids and got.positions.tolist() == positions
        assert (got.first_token, got.first_position, got.columns) == (first_token, first_position, len(ids))

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


def _plain_resumed(layout, prompt, decided, used):
    """Every column of a row that decided ``decided`` (each block keeping ``used`` columns),
    token by token: ``(ids, positions, is_pause, starts, first_token, first_position)``."""
    m = layout.num_steps
    fed = list(prompt) + list(decided)
    if layout.real_only:
        step = m if layout.advance else 1
        n = len(fed) - 1
        return fed[:-1], [k * step for k in range(n)], None, None, fed[-1], n * step
    lengths = [m] * (len(prompt) - 1) + list(used)
    ids, positions, is_pause, starts = [], [], [], []
    for k, (token, length) in enumerate(zip(fed[:-1], lengths)):
        start = len(ids)
        for j in range(length):
            ids.append(token if j == 0 else layout.pause_ids[j - 1])
            positions.append(len(positions) if layout.advance else k)
            is_pause.append(j > 0)
            starts.append(start)
    return ids, positions, is_pause, starts, fed[-1], len(ids) if layout.advance else len(fed) - 1


@pytest.mark.parametrize("visibility", ["shared", "private", "gated"])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("advance", [False, True])
def test_a_resumed_row_gets_every_column_it_had(visibility, m, advance):
    """A preempted row's prefill: its prompt, then each decided token's block as it was fed (the
    token and the pauses it took; real tokens only under private pauses); decoding resumes at the
    last decided token, deciding the next one."""
    layout = RowLayout(visibility, m, advance, tuple(range(100, 100 + m - 1)))
    rng = random.Random(m + 10 * advance)
    for n, k in ((1, 1), (3, 4), (17, 9)):
        prompt = [rng.randrange(3, 99) for _ in range(n)]
        decided = [rng.randrange(3, 99) for _ in range(k)]
        used = [rng.randint(1, m) for _ in range(k)]
        got = layout.prefill(prompt, decided, used)
        ids, positions, is_pause, starts, first_token, first_position = _plain_resumed(layout, prompt, decided, used)
        assert got.ids.tolist() == ids and got.positions.tolist() == positions
        assert (got.first_token, got.first_position, got.counter) == (first_token, first_position, k)
        assert got.prompt_columns == layout.prefill(prompt).columns
        if visibility == "gated":
            assert got.is_pause.tolist() == is_pause and got.starts.tolist() == starts
            fresh = layout.prefill(prompt)
            c = fresh.columns
            assert fresh.is_pause.tolist() == is_pause[:c] and fresh.starts.tolist() == starts[:c]
        else:
            assert got.is_pause is None and got.starts is None


def test_column_bound_follows_what_the_host_knows():
    shared = RowLayout("shared", 3, False, (100, 101))
    assert shared.column_bound(10, 4, 3, 100) == 22  # columns + steps x Q
    assert shared.column_bound(10, 40, 3, 20) == 23  # the known columns plus a block
    private = RowLayout("private", 3, False, (100, 101))
    assert private.column_bound(10, 40, 1, 20) == 25  # plus the unread token, the fed one and its M steps
    assert [shared.used_columns(f, 2) for f in (True, False)] == [3, 2]
    assert private.used_columns(False, 2) == 1

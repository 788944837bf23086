"""Admission under traffic (:meth:`cyb.engine.scheduler.Scheduler.admit`): while rows decode,
prompts start in groups (a few large prefill forwards, not one small one after nearly every
step), and a smaller group starts once a prompt could have started for ``refill_wait`` steps.
With nothing decoding, everything that fits starts at once."""

from __future__ import annotations

import pytest

from cyb.engine import EngineOptions
from cyb.engine.requests import Request
from cyb.engine.scheduler import Scheduler, Tracked


def tracked(i: int) -> Tracked:
    return Tracked(i, Request((1, 2), 1), prefill=None)  # admission reads no prompt


def scheduler(slots: int, decoding: int) -> Scheduler:
    s = Scheduler(slots, prefill_chunk=8, prefill_rows=4)
    for i in range(decoding):
        t = tracked(1000 + i)
        s.add(t)
    s.admit()
    for t in list(s.prefilling):
        s.prefilling.remove(t)
        t.state = "decoding"
        s.decoding[t.slot] = t
    return s


def test_nothing_decoding_starts_everything_that_fits():
    s = Scheduler(4, prefill_chunk=8, prefill_rows=4)
    for i in range(6):
        s.add(tracked(i))
    assert [t.id for t in s.admit(group=8, wait=100)] == [0, 1, 2, 3]
    assert [t.id for t in s.waiting] == [4, 5]


def test_a_group_starts_at_once_a_smaller_one_after_the_wait():
    s = scheduler(8, decoding=4)  # 4 free slots
    s.add(tracked(0))
    s.add(tracked(1))
    assert s.admit(group=3, wait=5, now=10) == []  # 2 could start: fewer than the group
    assert s.admit(group=3, wait=5, now=14) == []
    s.add(tracked(2))
    assert [t.id for t in s.admit(group=3, wait=5, now=15)] == [0, 1, 2]  # the group is complete
    s.add(tracked(3))
    assert s.admit(group=3, wait=5, now=20) == []
    assert s.admit(group=3, wait=5, now=24) == []
    assert [t.id for t in s.admit(group=3, wait=5, now=25)] == [3]  # waited 5 steps: it starts alone


def test_the_wait_counts_from_when_a_prompt_could_start():
    s = scheduler(4, decoding=4)  # no free slot
    s.add(tracked(0))
    assert s.admit(group=2, wait=3, now=0) == []
    s.release(s.decoding[0])  # a slot is free from step 7 on
    assert s.admit(group=2, wait=3, now=7) == []
    assert s.admit(group=2, wait=3, now=9) == []
    assert [t.id for t in s.admit(group=2, wait=3, now=10)] == [0]


def test_group_of_one_starts_each_prompt_as_soon_as_a_slot_is_free():
    s = scheduler(4, decoding=3)
    s.add(tracked(0))
    assert [t.id for t in s.admit(group=1, wait=100, now=0)] == [0]


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_refill_wait_is_checked(bad):
    with pytest.raises(ValueError, match="refill_wait"):
        EngineOptions(refill_wait=bad)

"""The size benchmark's anchor (:func:`cyb.bench.hf_anchor.continuous_batching`) tells requests
that failed from requests its time limit cut off, with a stand-in for transformers' manager."""

from __future__ import annotations

import contextlib
import types

import torch

from cyb.bench import hf_anchor


class _Manager:
    """Answers the first ``done`` requests, then nothing more."""

    def __init__(self, done: int, wrong: int = -1) -> None:
        self.done, self.wrong, self.queue, self.next = done, wrong, [], 0

    def add_request(self, prompt, max_new_tokens):
        rid = f"req_{self.next}"
        self.next += 1
        if len(self.queue) < self.done:
            n = max_new_tokens - (1 if len(self.queue) == self.wrong else 0)
            self.queue.append(types.SimpleNamespace(request_id=rid, error=None, generated_tokens=[7] * n,
                                                    is_finished=lambda: True))
        return rid

    def get_result(self, timeout):
        return self.queue.pop(0) if self.queue else None

    def is_running(self):
        return True


def _model(manager):
    config = types.SimpleNamespace(_attn_implementation="sdpa")
    return types.SimpleNamespace(config=config, device=torch.device("cpu"), set_attn_implementation=lambda _: None,
                                 continuous_batching_context_manager=lambda **_: contextlib.nullcontext(manager))


def test_requests_cut_off_by_the_time_limit_are_unfinished_not_failed(monkeypatch):
    monkeypatch.setattr(hf_anchor, "_attention", lambda current, flash: current)
    items = [([1, 2, 3], 4)] * 5
    out = hf_anchor.continuous_batching(_model(_Manager(done=3, wrong=1)), items, concurrency=8, timeout_s=1.5)
    assert (out["finished"], out["failed"], out["unfinished"], out["timed_out"]) == (3, 1, 2, True)
    assert out["real_tokens"] == 4 + 3 + 4
    done = hf_anchor.continuous_batching(_model(_Manager(done=5)), items, concurrency=8, timeout_s=5)
    assert (done["failed"], done["unfinished"], done["timed_out"]) == (0, 0, False)

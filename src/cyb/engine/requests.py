"""What the engine is asked to generate, and what it reports back.

A :class:`Request` is token ids in, token ids out: the prompt, how many new tokens at most,
fixed or adaptive pauses, greedy or sampled readout and the row's random stream (``key``, see
:func:`cyb.decision.stream_uniforms`), and the ids that end it.  Text, stop strings and
streaming to users live above the engine (:mod:`cyb.generation`, the server), which end a
request early with :meth:`cyb.engine.Engine.abort`.

Each decided token comes back as an :class:`Emitted` event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

MODES = ("fixed", "adaptive")


@dataclass(frozen=True)
class Request:
    """One prompt to continue.

    Attributes:
        prompt: the prompt's token ids (at least one).
        max_new_tokens: new tokens at most (>= 1), an EOS that ends the request included.
        mode: ``"fixed"`` (every token with all ``M - 1`` pauses, Recipe 1) or ``"adaptive"``
            (a pause only after ``<don't know>``, Recipe 2).
        sample: sample instead of the greedy sequential decision.
        temperature: > 0 when sampling (divides the token logits, not ``d``); 0 means greedy.
        top_k: keep the ``k`` most likely tokens when sampling (0: all).
        top_p: nucleus sampling, in (0, 1] (1: off).
        key: the request's random stream (an int in ``[0, 2**62)``).
        eos: ids that end the request (kept as its last token).
    """

    prompt: tuple[int, ...]
    max_new_tokens: int
    mode: str = "adaptive"
    sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    key: int = 0
    eos: frozenset = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        prompt = tuple(int(t) for t in self.prompt)
        if not prompt:
            raise ValueError("prompt is empty: a request needs at least one token")
        object.__setattr__(self, "prompt", prompt)
        object.__setattr__(self, "eos", frozenset(int(e) for e in self.eos))
        n = self.max_new_tokens
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {n!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0: off), got {self.top_k!r}")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {p!r}")
        if not isinstance(self.key, int) or not 0 <= self.key < (1 << 62):
            raise ValueError(f"key must be an integer in [0, 2**62), got {self.key!r}")

    @property
    def greedy(self) -> bool:
        """Whether decisions are greedy (not sampling, or sampling at temperature 0)."""
        return not self.sample or self.temperature == 0


class Emitted(NamedTuple):
    """One new token of one request.

    Attributes:
        request: the request's id (what :meth:`cyb.engine.Engine.submit` returned).
        index: 0-based index of the token among the request's new tokens.
        token: the token id.
        steps: steps it used, ``1 .. M`` (``steps - 1`` pauses).
        d: ``d_1 .. d_M`` of its block (``d_M = 0``; NaN after the stop step in adaptive mode).
        expected_steps: ``E[S]`` of its block (fixed mode), else None.
        positions: positions of the request that went through the network so far, prompt
            included.
        finished: ``"eos"`` or ``"length"`` when this is the request's last token, else None.
    """

    request: int
    index: int
    token: int
    steps: int
    d: tuple
    expected_steps: float | None
    positions: int
    finished: str | None = None


__all__ = ["Emitted", "MODES", "Request"]

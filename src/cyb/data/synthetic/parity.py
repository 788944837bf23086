"""Parity of a bit string."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .base import Task, check_int


@dataclass(frozen=True)
class Parity(Task):
    """Is the number of ones in a ``length``-bit string odd?  Answer ``"1"`` if odd, else ``"0"``.

    Example (length=8): ``"01101001="`` -> ``"0"``.  Bits are uniform, so the two labels are
    equally likely and the label is independent of any ``length - 1`` of the bits.

    What makes it hard: the answer depends on every bit, and flipping any single bit flips it,
    so no local or partial statistic helps; a transformer must carry out a sequential XOR over
    the whole string in the few layers it has before the answer token.  Harder with ``length``.
    """

    length: int = 16

    name = "parity"
    characters = "01="

    def __post_init__(self) -> None:
        check_int("length", self.length, 1)

    def sample(self, rng: random.Random) -> tuple[str, str]:
        bits = [rng.getrandbits(1) for _ in range(self.length)]
        return "".join(map(str, bits)) + "=", str(sum(bits) % 2)

    @property
    def max_prompt_len(self) -> int:
        return self.length + 1

    def describe(self) -> str:
        prompt, answer = self.example()
        return (
            f"parity: {self.length} random bits, answer 1 if the number of ones is odd else 0; "
            f"e.g. {prompt!r} -> {answer!r}. Hard because every bit matters and no partial "
            f"statistic predicts the label; harder with length."
        )

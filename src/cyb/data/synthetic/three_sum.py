"""3SUM over tuples of digits modulo 10 (Pfau et al., "Let's Think Dot by Dot")."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .base import Task, check_int

Vec = tuple[int, ...]

TRUE, FALSE = "t", "f"


def find_zero_triple(tuples: list[Vec]) -> tuple[int, int, int] | None:
    """Indices ``i < j < k`` with ``tuples[i] + tuples[j] + tuples[k] == 0 (mod 10)`` in every
    coordinate, or None.  O(n^2) via a lookup of the complement of each pair."""
    where: dict[Vec, list[int]] = {}
    for idx, vec in enumerate(tuples):
        where.setdefault(vec, []).append(idx)
    n = len(tuples)
    for i in range(n):
        for j in range(i + 1, n):
            need = tuple((-a - b) % 10 for a, b in zip(tuples[i], tuples[j]))
            for k in where.get(need, ()):
                if k > j:
                    return i, j, k
    return None


@dataclass(frozen=True)
class ThreeSum(Task):
    """Do three of the ``n`` tuples (at distinct positions) sum to zero mod 10 in every digit?

    Prompt: ``n`` tuples of ``d`` digits separated by spaces, then ``=``; answer ``"t"`` (true)
    or ``"f"`` (false).  Example (n=4, d=2): ``"17 32 61 05="`` -> ``"t"`` because
    17, 32 and 61 sum to (1+3+6, 7+2+1) = (10, 10), zero mod 10 in both digits.

    Labels are exact and the classes balanced in expectation: for a positive a zero-sum triple
    is planted at three random positions (the third tuple is the negated sum of two uniform
    ones, so it is itself uniform); for a negative the sample is corrupted -- a member of a
    zero-sum triple redrawn -- and re-checked until no triple is left.

    What makes it hard: there are ``n (n-1) (n-2) / 6`` triples to check; a transformer that
    must answer in one step cannot enumerate them, while extra computation per token (filler
    or pause tokens) lets it spread the pairwise work over more positions.  Harder with ``n``
    (more triples) and ``d`` (more coordinates to match).
    """

    n: int = 8
    d: int = 3

    name = "3sum"
    characters = "0123456789 =" + TRUE + FALSE

    #: corruptions tried before a negative is declared impossible to find.
    max_corruptions = 10_000

    def __post_init__(self) -> None:
        check_int("n", self.n, 3)
        check_int("d", self.d, 1)

    def _random_tuple(self, rng: random.Random) -> Vec:
        return tuple(rng.randrange(10) for _ in range(self.d))

    def sample(self, rng: random.Random) -> tuple[str, str]:
        tuples = [self._random_tuple(rng) for _ in range(self.n)]
        if rng.random() < 0.5:
            i, j, k = rng.sample(range(self.n), 3)
            tuples[k] = tuple((-a - b) % 10 for a, b in zip(tuples[i], tuples[j]))
            label = TRUE
        else:
            for _ in range(self.max_corruptions):
                triple = find_zero_triple(tuples)
                if triple is None:
                    break
                tuples[rng.choice(triple)] = self._random_tuple(rng)
            else:
                raise RuntimeError(
                    f"3sum: found no negative example with n={self.n}, d={self.d} after "
                    f"{self.max_corruptions} corruptions; use fewer tuples or more digits"
                )
            label = FALSE
        prompt = " ".join("".join(map(str, vec)) for vec in tuples) + "="
        return prompt, label

    @property
    def max_prompt_len(self) -> int:
        return self.n * (self.d + 1)

    def describe(self) -> str:
        prompt, answer = self.example()
        return (
            f"3sum: {self.n} tuples of {self.d} digits; answer t if three distinct tuples sum to 0 "
            f"mod 10 in every digit, else f (classes balanced); e.g. {prompt!r} -> {answer!r}. "
            f"Hard because there are {self.n * (self.n - 1) * (self.n - 2) // 6} triples to check; "
            f"harder with more tuples n and more digits d."
        )

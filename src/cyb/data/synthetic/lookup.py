"""Multi-hop variable lookup: follow a chain of assignments to a literal digit."""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from .base import Task, check_int

_LETTERS = string.ascii_lowercase


def _name(index: int, width: int) -> str:
    """The ``index``-th name of ``width`` lower-case letters (base 26)."""
    chars = []
    for _ in range(width):
        index, r = divmod(index, 26)
        chars.append(_LETTERS[r])
    return "".join(reversed(chars))


@dataclass(frozen=True)
class VariableLookup(Task):
    """Resolve a variable through ``hops`` assignments, among shuffled distractor chains.

    Example (hops=3, distractor_chains=1): ``"e=d,b=a,d=7,f=e,a=3,c=b?c="`` -> ``"3"``
    (``c=b``, ``b=a``, ``a=3``).  Every chain -- the queried one and each of the
    ``distractor_chains`` others -- is ``hops`` statements long: one ``var=digit`` and then
    ``var=previous_var`` links.  All statements are shuffled; names are distinct strings of
    ``name_len`` letters; the answer is the queried chain's digit.

    What makes it hard: each hop is one lookup ("which statement assigns this name?") that
    depends on the result of the previous one, so the work is sequential; a transformer does
    only a few such dependent lookups per forward pass, roughly one per layer, and the
    shuffled order stops it from reading the chain left to right.  Difficulty is ``hops``;
    distractor chains of the same shape make surface cues useless.
    """

    hops: int = 3
    distractor_chains: int = 2
    name_len: int = 1

    name = "lookup"
    characters = _LETTERS + "0123456789,=?"

    def __post_init__(self) -> None:
        check_int("hops", self.hops, 1)
        check_int("distractor_chains", self.distractor_chains, 0)
        check_int("name_len", self.name_len, 1, 4)
        available = 26**self.name_len
        if self.num_variables > available:
            raise ValueError(
                f"lookup needs hops * (distractor_chains + 1) = {self.num_variables} distinct "
                f"variable names but name_len={self.name_len} gives only {available}; "
                f"raise name_len or lower hops/distractor_chains"
            )

    @property
    def num_chains(self) -> int:
        return self.distractor_chains + 1

    @property
    def num_variables(self) -> int:
        return self.hops * self.num_chains

    def sample(self, rng: random.Random) -> tuple[str, str]:
        width = self.name_len
        names = [_name(i, width) for i in rng.sample(range(26**width), self.num_variables)]
        statements, answer, query = [], "", ""
        for c in range(self.num_chains):
            chain = names[c * self.hops : (c + 1) * self.hops]
            value = str(rng.randrange(10))
            statements.append(f"{chain[0]}={value}")
            statements.extend(f"{chain[h]}={chain[h - 1]}" for h in range(1, self.hops))
            if c == 0:
                answer, query = value, chain[-1]
        rng.shuffle(statements)
        return ",".join(statements) + f"?{query}=", answer

    @property
    def max_prompt_len(self) -> int:
        statements = self.num_variables
        links = statements - self.num_chains
        chars = statements * (self.name_len + 1) + self.num_chains + links * self.name_len
        return chars + (statements - 1) + self.name_len + 2  # commas, "?" name "="

    def describe(self) -> str:
        prompt, answer = self.example()
        return (
            f"lookup: follow {self.hops} hop(s) of shuffled assignments to a digit, with "
            f"{self.distractor_chains} distractor chain(s) of the same length; e.g. {prompt!r} -> "
            f"{answer!r}. Hard because each hop is a lookup that depends on the previous one; "
            f"harder with more hops."
        )

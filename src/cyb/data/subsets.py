"""A seeded share of a document stream (``data.fraction``).

Documents are ranked by a hash of (seed, their text) and taken in that order until they hold
the asked share of the stream's characters; the kept documents are then handed out in their own
order (shuffling is the packer's job)::

    ranked:  d7 d2 d9 d0 d4 ...   ->  a third of the characters: {d7, d2, d9}  ->  d2 d7 d9

The cut falls where the kept characters come closest to the target (never below one document),
so at one seed the documents of a smaller share are all in every larger share, and the share is
exact to within half a document.  Ranking by text (not by position) makes the choice
independent of the stream's order, as :func:`cyb.data.packing.split_texts` does for the
held-out split; the salt differs from that split's, so the two choices are independent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass


def fraction_rank(text: str, seed: int) -> int:
    """A document's place in the seeded order: a 64-bit hash of (``seed``, ``text``)."""
    data = f"cyb-fraction:{seed}\0{text}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Choice:
    """The documents a share keeps: their indices in the stream and what they hold."""

    kept: frozenset[int]
    documents: int  # in the whole stream
    characters: int  # kept
    total_characters: int  # in the whole stream

    @property
    def share(self) -> float:
        """Kept characters over all characters (1.0 for an empty stream)."""
        return self.characters / self.total_characters if self.total_characters else 1.0

    def describe(self) -> str:
        return (f"{len(self.kept):,} of {self.documents:,} documents, {100 * self.share:.1f}% of the "
                f"training text's {self.total_characters:,} characters")


def choose_documents(texts: Iterable[str], fraction: float, seed: int) -> Choice:
    """The documents of ``texts`` that hold ``fraction`` (in (0, 1]) of its characters, taken in
    the order of :func:`fraction_rank`; at least one when the stream has any."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
    ranked = sorted((fraction_rank(t, seed), i, len(t)) for i, t in enumerate(texts))
    total = sum(n for _, _, n in ranked)
    target = fraction * total
    kept, held = [], 0
    for _, i, n in ranked:
        # stop where the next document would overshoot the target more than stopping falls short
        if kept and (held >= target or held + n - target > target - held):
            break
        kept.append(i)
        held += n
    return Choice(frozenset(kept), len(ranked), held, total)


class FractionOfTexts:
    """A texts factory (see :func:`cyb.data.packing.as_texts_factory`) restarting the documents
    of ``factory`` that :func:`choose_documents` keeps, in their own order.  The choice is made
    on the first call (one extra reading of the stream) and kept; ``factory`` must give the same
    documents at every call."""

    def __init__(self, factory: Callable[[], Iterable[str]], fraction: float, seed: int):
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
        self.factory, self.fraction, self.seed = factory, fraction, seed
        self._choice: Choice | None = None

    @property
    def choice(self) -> Choice:
        """The documents kept (read from the stream on first use)."""
        if self._choice is None:
            self._choice = choose_documents(self.factory(), self.fraction, self.seed)
        return self._choice

    def __call__(self) -> Iterator[str]:
        kept = self.choice.kept
        return (t for i, t in enumerate(self.factory()) if i in kept)


__all__ = ["Choice", "FractionOfTexts", "choose_documents", "fraction_rank"]

"""The interface every synthetic task implements, and argument checks they share."""

from __future__ import annotations

import abc
import dataclasses
import random
from typing import Any, ClassVar


def check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """``value`` if it is an int in ``[minimum, maximum]``, else a ValueError naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        allowed = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be {allowed}, got {value}")
    return value


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


class Task(abc.ABC):
    """A generator of ``(prompt, answer)`` string pairs over :class:`CharTokenizer`'s alphabet.

    Subclasses are frozen dataclasses whose fields are the size parameters; they validate
    them in ``__post_init__``.  A model sees ``<bos> prompt answer <eos>`` and must predict
    the answer characters and the ``<eos>``.
    """

    #: registry name, e.g. ``"addition"``.
    name: ClassVar[str]
    #: every character its prompts and answers may hold (a model trained on the task has seen no
    #: other: the server refuses prompts with others).
    characters: ClassVar[str]

    @abc.abstractmethod
    def sample(self, rng: random.Random) -> tuple[str, str]:
        """Draw one ``(prompt, answer)`` pair using only ``rng`` (so a seed fixes it)."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One paragraph: the format, an example, and what makes the task hard."""

    @property
    @abc.abstractmethod
    def max_prompt_len(self) -> int:
        """Longest prompt, in characters."""

    @property
    def max_answer_len(self) -> int:
        """Longest answer, in characters (``<eos>`` not included); 1 unless a task says more
        (the yes/no and single-digit answers of parity, 3sum and lookup)."""
        return 1

    @property
    def max_len(self) -> int:
        """Longest encoded example in tokens: ``<bos>`` + prompt + answer + ``<eos>``."""
        return self.max_prompt_len + self.max_answer_len + 2

    def params(self) -> dict[str, Any]:
        """The size parameters, such that ``make_task(self.name, **self.params())`` rebuilds it."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def example(self, seed: int = 0) -> tuple[str, str]:
        """One deterministic example, handy for docs and ``describe``."""
        return self.sample(random.Random(seed))

"""Multi-digit addition and multiplication on zero-padded, fixed-width operands."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .base import Task, check_bool, check_int


def _order(lsb_first: bool) -> str:
    return "least-significant digit first" if lsb_first else "most-significant digit first"


def _digits(value: int, width: int, lsb_first: bool) -> str:
    text = str(value).zfill(width)
    return text[::-1] if lsb_first else text


@dataclass(frozen=True)
class Addition(Task):
    """``a + b`` for ``digits``-digit operands; the answer is ``digits + 1`` digits wide.

    Example (digits=4): ``"0123+4567="`` -> ``"04690"`` (``"09640"`` with ``lsb_first``).
    Operands are uniform in ``[0, 10**digits)`` and zero-padded; only the answer is reversed
    by ``lsb_first``.

    What makes it hard: an answer digit depends on a carry that can ripple up from the lowest
    digit.  Written most-significant digit first, the model must resolve the whole carry chain
    before it emits the first character -- work that extra computation per token helps with.
    Least-significant first, each digit needs only its two operand digits and the previous
    carry, which makes the task much easier.  Difficulty grows with ``digits``.
    """

    digits: int = 3
    lsb_first: bool = False

    name = "addition"
    characters = "0123456789+="

    def __post_init__(self) -> None:
        check_int("digits", self.digits, 1)
        check_bool("lsb_first", self.lsb_first)

    def sample(self, rng: random.Random) -> tuple[str, str]:
        n = self.digits
        a, b = rng.randrange(10**n), rng.randrange(10**n)
        prompt = f"{str(a).zfill(n)}+{str(b).zfill(n)}="
        return prompt, _digits(a + b, n + 1, self.lsb_first)

    @property
    def max_prompt_len(self) -> int:
        return 2 * self.digits + 2

    @property
    def max_answer_len(self) -> int:
        return self.digits + 1

    def describe(self) -> str:
        prompt, answer = self.example()
        order = _order(self.lsb_first)
        return (
            f"addition: two {self.digits}-digit operands, answer {self.digits + 1} digits, "
            f"{order}; "
            f"e.g. {prompt!r} -> {answer!r}. Hard because carries can ripple across all digits"
            + ("" if self.lsb_first else " and the first answer digit depends on all of them")
            + "; harder with more digits."
        )


@dataclass(frozen=True)
class Multiplication(Task):
    """``a * b`` for a ``digits``-digit and a ``digits_b``-digit operand.

    Example (digits=3): ``"123*456="`` -> ``"056088"``; the answer is ``digits + digits_b``
    digits wide, zero-padded, optionally least-significant digit first (``lsb_first``).
    ``digits_b`` defaults to ``digits``.

    What makes it hard: every answer digit sums many digit products plus carries from all
    lower positions (about ``digits * digits_b`` partial products in total), far more work
    than one forward pass per output character does easily.  Harder than addition at the same
    size; grows quickly with either operand width.
    """

    digits: int = 2
    digits_b: int | None = None
    lsb_first: bool = False

    name = "multiplication"
    characters = "0123456789*="

    def __post_init__(self) -> None:
        check_int("digits", self.digits, 1)
        if self.digits_b is None:
            object.__setattr__(self, "digits_b", self.digits)
        check_int("digits_b", self.digits_b, 1)
        check_bool("lsb_first", self.lsb_first)

    def sample(self, rng: random.Random) -> tuple[str, str]:
        na, nb = self.digits, self.digits_b
        a, b = rng.randrange(10**na), rng.randrange(10**nb)
        prompt = f"{str(a).zfill(na)}*{str(b).zfill(nb)}="
        return prompt, _digits(a * b, na + nb, self.lsb_first)

    @property
    def max_prompt_len(self) -> int:
        return self.digits + self.digits_b + 2

    @property
    def max_answer_len(self) -> int:
        return self.digits + self.digits_b

    def describe(self) -> str:
        prompt, answer = self.example()
        order = _order(self.lsb_first)
        return (
            f"multiplication: {self.digits}-digit by {self.digits_b}-digit operands, answer "
            f"{self.max_answer_len} digits, {order}; e.g. {prompt!r} -> {answer!r}. Hard because "
            f"each answer digit sums many partial products and carries; grows with both widths."
        )

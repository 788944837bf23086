"""Synthetic reasoning tasks where extra computation per token helps a small transformer.

Each task draws ``(prompt, answer)`` string pairs; :class:`CharTokenizer` encodes them;
:class:`SyntheticDataset` makes deterministic, disjoint train/test tensors; :func:`score` and
:func:`answer_token_accuracy` measure exact-match and per-position accuracy.

    >>> task = make_task("addition", digits=3)
    >>> tok = CharTokenizer()
    >>> train = SyntheticDataset(task, tok, num_examples=1000, seed=0, split="train")
    >>> test = SyntheticDataset(task, tok, num_examples=200, seed=0, split="test")
"""

from .arithmetic import Addition, Multiplication
from .base import Task
from .char_tokenizer import DEFAULT_ALPHABET, CharTokenizer
from .dataset import SyntheticDataset, in_test_split
from .lookup import VariableLookup
from .parity import Parity
from .registry import TASKS, make_task
from .scoring import answer_token_accuracy, score, shift_predictions
from .three_sum import ThreeSum, find_zero_triple

__all__ = [
    "Addition",
    "CharTokenizer",
    "DEFAULT_ALPHABET",
    "Multiplication",
    "Parity",
    "SyntheticDataset",
    "TASKS",
    "Task",
    "ThreeSum",
    "VariableLookup",
    "answer_token_accuracy",
    "find_zero_triple",
    "in_test_split",
    "make_task",
    "score",
    "shift_predictions",
]

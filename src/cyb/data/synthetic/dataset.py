"""Fixed-length, tokenised train/test sets drawn from a synthetic task."""

from __future__ import annotations

import hashlib
import random
from typing import Iterator

import torch

from .base import Task, check_bool, check_int
from .char_tokenizer import CharTokenizer
from .registry import make_task

SPLITS = ("train", "test")
#: consecutive rejected draws (wrong split, or a repeat with ``unique``) before giving up,
#: at least; scaled up for a small split so that a valid setting practically never trips it.
_MIN_REJECTIONS = 10_000


def in_test_split(prompt: str, test_fraction: float) -> bool:
    """Whether ``prompt`` belongs to the test part of the example space.

    A stable hash of the prompt (independent of seeds, processes and PYTHONHASHSEED) is mapped
    to [0, 1); prompts below ``test_fraction`` are test prompts, the rest train prompts.
    """
    digest = hashlib.blake2b(prompt.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64 < test_fraction


def _max_rejections(test_fraction: float) -> int:
    return max(_MIN_REJECTIONS, int(100 / min(test_fraction, 1.0 - test_fraction)))


class SyntheticDataset(torch.utils.data.Dataset):
    """``num_examples`` examples of ``task``, encoded as ``<bos> prompt answer <eos> <pad>...``.

    Args:
        task: a :class:`Task` or a registered task name (default sizes).
        tokenizer: the :class:`CharTokenizer` used to encode.
        num_examples: rows to draw, >= 1.
        seed: int >= 0; fixes the draw: the same arguments always give the same rows.
        split: ``"train"`` or ``"test"``.  Splits are disjoint by construction: the prompt
            space is hash-partitioned (:func:`in_test_split`), a fraction ``test_fraction`` of
            it for test, so no test prompt can occur in any train set, whatever the seeds.
            Use the same ``test_fraction`` for both splits.
        test_fraction: share of the prompt space reserved for test, in (0, 1).
        seq_len: row length ``L``; defaults to ``task.max_len`` and may not be shorter.
        unique: draw distinct prompts within the split (error if the space is too small).

    Attributes (tensors on the CPU; ``N = num_examples``):
        ids: int64 ``[N, L]``, token ids, right-padded with ``tokenizer.pad_id``.
        attention_mask: int64 ``[N, L]``, 1 on real tokens (bos..eos), 0 on padding.
        loss_mask: bool ``[N, L]``, True on the tokens to be predicted: the answer characters
            and the final ``<eos>``.  With next-token prediction the logits at ``j - 1`` are
            scored against ``ids[:, j]`` where ``loss_mask[:, j]``.
        answer_start: int64 ``[N]``, index in ``ids`` of the first answer character
            (``ids[i, :answer_start[i]]`` is ``<bos> prompt``, the generation input).
        lengths: int64 ``[N]``, real tokens per row (``attention_mask.sum(1)``).
        prompts, answers: the strings, ``list[str]`` of length ``N``.
    """

    def __init__(
        self,
        task: Task | str,
        tokenizer: CharTokenizer,
        num_examples: int,
        seed: int = 0,
        split: str = "train",
        *,
        test_fraction: float = 0.1,
        seq_len: int | None = None,
        unique: bool = False,
    ) -> None:
        self.task = make_task(task) if isinstance(task, str) else task
        if not isinstance(self.task, Task):
            raise TypeError(f"task must be a Task or a task name, got {type(task).__name__}")
        check_int("num_examples", num_examples, 1)
        check_int("seed", seed, 0)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if not isinstance(test_fraction, (int, float)) or not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
        self.seq_len = self.task.max_len if seq_len is None else seq_len
        if not isinstance(self.seq_len, int) or self.seq_len < self.task.max_len:
            raise ValueError(
                f"seq_len must be an int >= the task's max_len = {self.task.max_len}, "
                f"got {self.seq_len!r}"
            )
        self.tokenizer = tokenizer
        self.num_examples = num_examples
        self.seed = seed
        self.split = split
        self.test_fraction = float(test_fraction)
        self.unique = check_bool("unique", unique)

        self.prompts, self.answers = self._draw()
        self._encode()

    def _draw(self) -> tuple[list[str], list[str]]:
        rng = random.Random(f"{self.task.name}:{self.seed}:{self.split}")
        want_test = self.split == "test"
        prompts: list[str] = []
        answers: list[str] = []
        seen: set[str] = set()
        rejected, max_rejected = 0, _max_rejections(self.test_fraction)
        while len(prompts) < self.num_examples:
            prompt, answer = self.task.sample(rng)
            if in_test_split(prompt, self.test_fraction) != want_test or (
                self.unique and prompt in seen
            ):
                rejected += 1
                if rejected > max_rejected:
                    raise ValueError(
                        f"could draw only {len(prompts)} of num_examples={self.num_examples} "
                        f"{'distinct ' if self.unique else ''}{self.split} examples of "
                        f"{self.task!r}: its example space is too small for this split; "
                        f"use larger sizes, fewer examples or another test_fraction"
                    )
                continue
            rejected = 0
            if self.unique:
                seen.add(prompt)
            prompts.append(prompt)
            answers.append(answer)
        return prompts, answers

    def _encode(self) -> None:
        tok, length = self.tokenizer, self.seq_len
        rows, starts, lengths = [], [], []
        for prompt, answer in zip(self.prompts, self.answers):
            p, a = tok.encode(prompt), tok.encode(answer)
            row = [tok.bos_id, *p, *a, tok.eos_id]
            if len(row) > length:  # a task whose max_len is wrong; never silently truncate
                raise ValueError(
                    f"example of {len(row)} tokens exceeds seq_len={length}: {prompt!r}"
                )
            rows.append(row + [tok.pad_id] * (length - len(row)))
            starts.append(1 + len(p))
            lengths.append(len(row))
        positions = torch.arange(length)
        self.ids = torch.tensor(rows, dtype=torch.long)
        self.answer_start = torch.tensor(starts, dtype=torch.long)
        self.lengths = torch.tensor(lengths, dtype=torch.long)
        self.attention_mask = (positions < self.lengths[:, None]).long()
        self.loss_mask = (positions >= self.answer_start[:, None]) & (
            positions < self.lengths[:, None]
        )

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """Row ``index``: ``ids``, ``attention_mask``, ``loss_mask`` ([L] each),
        ``answer_start`` and ``index`` (scalars)."""
        return self._rows(torch.as_tensor(index))

    def _rows(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            "ids": self.ids[index],
            "attention_mask": self.attention_mask[index],
            "loss_mask": self.loss_mask[index],
            "answer_start": self.answer_start[index],
            "index": index,
        }

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        device: torch.device | str | None = None,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Yield dicts of ``[B, L]`` ``ids``/``attention_mask``/``loss_mask`` and ``[B]``
        ``answer_start``/``index`` (row numbers into ``prompts``/``answers``).

        One pass over the rows, in order or in a permutation fixed by ``seed``; the last batch
        may be smaller unless ``drop_last``.
        """
        check_int("batch_size", batch_size, 1)
        if shuffle:
            order = torch.randperm(self.num_examples, generator=torch.Generator().manual_seed(seed))
        else:
            order = torch.arange(self.num_examples)
        for begin in range(0, self.num_examples, batch_size):
            index = order[begin : begin + batch_size]
            if drop_last and len(index) < batch_size:
                return
            batch = self._rows(index)
            if device is not None:
                batch = {k: v.to(device) for k, v in batch.items()}
            yield batch

    def __repr__(self) -> str:
        return (
            f"SyntheticDataset({self.task!r}, split={self.split!r}, "
            f"num_examples={self.num_examples}, seed={self.seed}, seq_len={self.seq_len})"
        )

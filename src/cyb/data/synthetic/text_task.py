"""Synthetic tasks as plain text for a pretrained model's tokenizer.

The character tokenizer (:class:`~cyb.data.synthetic.CharTokenizer`) suits models trained from
scratch.  A pretrained model reads text through its own tokenizer, so a run that fine-tunes one
on a task (``data.task`` with ``model.name_or_path`` or ``data.tokenizer``) writes each example
as text instead: the prompt (``"123+456="``) as the tokenizer encodes a generation prompt (its
own special tokens, if it adds any), then the answer (``"0579"``) and the end-of-sequence token.
The loss and the scores cover the answer tokens and the end-of-sequence token, as for the
character rows.  The prompts and answers are exactly those of :class:`SyntheticDataset` (same
seeds, same disjoint train/test split), so results compare across tokenizers.

SmolLM2's tokenizer (and Llama 3's, Qwen's, Gemma's) writes every digit as its own token, so
answers are scored digit by digit as with characters; tokenizers that merge digits score the
answer's tokens instead.

Which kind a run uses is decided by its tokenizer (:func:`task_tokenizer`): a model folder
without a tokenizer, or one whose tokenizer is the character tokenizer (a model trained on a
task from scratch), keeps character rows.
"""

from __future__ import annotations

import torch

from .dataset import SyntheticDataset
from .char_tokenizer import CharTokenizer


def is_char_tokenizer(tokenizer) -> bool:
    """Whether ``tokenizer`` is the task character tokenizer (or its Hugging Face version, possibly
    with pause tokens appended), or None."""
    if tokenizer is None or isinstance(tokenizer, CharTokenizer):
        return True
    get = getattr(tokenizer, "get_vocab", None)
    if get is None:
        return False
    vocab = get()
    ref = CharTokenizer()
    return all(vocab.get(t) == ref.token_to_id(t) for t in (*ref.special_tokens, *ref.alphabet))


class TextTaskDataset(SyntheticDataset):
    """A :class:`SyntheticDataset` whose rows are text encoded by a Hugging Face ``tokenizer``.

    Rows are ``prompt_ids answer_ids eos``, right-padded with the tokenizer's pad id (else its
    eos id) to the longest row of the set (``seq_len``); ``prompt_ids`` are
    ``tokenizer(prompt)["input_ids"]`` (the tokenizer's own special tokens included, as a
    generation prompt is encoded), ``answer_ids`` the answer's tokens without special tokens.
    The attributes are those of :class:`SyntheticDataset`.
    """

    def __init__(self, task, tokenizer, num_examples: int, seed: int = 0, split: str = "train", *,
                 test_fraction: float = 0.1, unique: bool = False) -> None:
        if getattr(tokenizer, "eos_token_id", None) is None:
            raise ValueError(f"the tokenizer ({type(tokenizer).__name__}) has no end-of-sequence token: a task "
                             "answer must end with one")
        super().__init__(task, tokenizer, num_examples, seed, split, test_fraction=test_fraction, unique=unique)

    def _encode(self) -> None:
        tok = self.tokenizer
        eos = int(tok.eos_token_id)
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos
        prompts = tok(list(self.prompts), add_special_tokens=True)["input_ids"]
        answers = tok(list(self.answers), add_special_tokens=False)["input_ids"]
        rows, starts = [], []
        for p, a in zip(prompts, answers):
            rows.append([*p, *a, eos])
            starts.append(len(p))
        self.seq_len = max(len(r) for r in rows)
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
        self.ids = torch.tensor([r + [int(pad)] * (self.seq_len - len(r)) for r in rows], dtype=torch.long)
        self.answer_start = torch.tensor(starts, dtype=torch.long)
        self.lengths = lengths
        positions = torch.arange(self.seq_len)
        self.attention_mask = (positions < lengths[:, None]).long()
        self.loss_mask = (positions >= self.answer_start[:, None]) & (positions < lengths[:, None])

    def __repr__(self) -> str:
        return (f"TextTaskDataset({self.task!r}, split={self.split!r}, num_examples={self.num_examples}, "
                f"seed={self.seed}, seq_len={self.seq_len}, tokenizer={type(self.tokenizer).__name__})")


__all__ = ["TextTaskDataset", "is_char_tokenizer"]

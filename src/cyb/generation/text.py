"""Prompts in, text out: encoding prompts, incremental detokenisation and stop strings."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..data.tokenizer import check_text, encode_failure


def _is_hf_tokenizer(tokenizer) -> bool:
    return hasattr(tokenizer, "convert_ids_to_tokens")


def encode_prompt(tokenizer, prompt, index: int, *, trained_on: tuple[str, str] | None = None) -> list[int]:
    """Token ids of one prompt: text (encoded with the model's tokenizer, special tokens such
    as BOS added as the tokenizer is configured) or ids (a sequence of ints or a 1-D tensor).

    Text the model cannot read raises :class:`cyb.data.tokenizer.UnencodableText` (a ValueError)
    in one line naming the characters at fault (:func:`cyb.data.tokenizer.check_text`; a model
    trained on a synthetic task, ``trained_on``, never saw characters outside its task's text)."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError(f"prompt {index} is text but the model has no tokenizer; pass token ids")
        check_text(prompt, f"prompt {index}", tokenizer=tokenizer, trained_on=trained_on)
        try:
            if _is_hf_tokenizer(tokenizer):
                ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
            else:  # a CharTokenizer: BOS first, as its Hugging Face form and the datasets do
                bos = getattr(tokenizer, "bos_id", None)
                ids = ([bos] if bos is not None else []) + list(tokenizer.encode(prompt))
        except Exception as e:  # noqa: BLE001 - a Rust tokenizer raises a bare Exception
            raise encode_failure(tokenizer, prompt, f"prompt {index}", e) from None
    elif isinstance(prompt, torch.Tensor):
        if prompt.dim() != 1 or prompt.is_floating_point():
            raise ValueError(f"prompt {index} must be a 1-D integer tensor of ids, got {prompt.dtype} "
                             f"of shape {tuple(prompt.shape)}")
        ids = prompt.tolist()
    else:
        try:
            ids = [int(x) for x in prompt]
        except (TypeError, ValueError):
            raise ValueError(f"prompt {index} must be a string or a sequence of token ids, got "
                             f"{type(prompt).__name__}") from None
        if any(isinstance(x, bool) or int(x) != x for x in prompt):
            raise ValueError(f"prompt {index} must hold integer token ids")
    if not ids:
        raise ValueError(f"prompt {index} is empty: generation needs at least one prompt token")
    return ids


def split_prompts(prompts) -> list:
    """One prompt (a string, a sequence of ints, a 1-D tensor) or a sequence of prompts -> a list."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, torch.Tensor):
        if prompts.dim() == 1:
            return [prompts]
        if prompts.dim() == 2:
            return list(prompts)
        raise ValueError(f"a tensor of prompts must be 1-D or 2-D, got shape {tuple(prompts.shape)}")
    prompts = list(prompts)
    if prompts and all(isinstance(x, int) and not isinstance(x, bool) for x in prompts):
        return [prompts]
    return prompts


def decode_fn(tokenizer) -> Callable[[list[int]], str] | None:
    """``ids -> text`` without special tokens, or None without a tokenizer."""
    if tokenizer is None:
        return None
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


#: settled tokens decoded again before new ones (the context a tokenizer's decoding of a word's
#: first piece may depend on: a leading space, a clean-up of spaces before punctuation)
CONTEXT_TOKENS = 4


class TextStream:
    """The text of a growing list of generated ids, released piece by piece, with stop strings.

    :meth:`push` returns the newly released text and whether a stop string completed.  Text
    that could still be the start of a stop string, or that ends in an incomplete character
    (U+FFFD from a byte-level tokenizer), is held back until it is settled or :meth:`flush`.
    The released pieces concatenate to :attr:`text`, which ends before the first stop string.

    Decoding is incremental: each push decodes only the tokens since the text was last settled
    (a complete character), with :data:`CONTEXT_TOKENS` settled tokens before them as context, so
    a token costs the same whatever the length of the text (decoding the whole text again made a
    stream quadratic).
    The text equals the decoding of all the ids wherever the tokenizer decodes a sequence as the
    concatenation of its parts after such a context (byte-level BPE, SentencePiece, characters).
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stop = tuple(stop)
        self._longest = max((len(s) for s in self._stop), default=0)
        self._ids: list[int] = []
        self._settled = ""  # the text of ids[:_read]
        self._context = 0  # ids[_context:_read] decode to the end of _settled: the context
        self._read = 0
        self._text = ""
        self._sent = 0  # characters released so far
        self._searched = 0  # stop strings cannot start before this index
        self.stop_at: int | None = None

    @property
    def text(self) -> str:
        """The text so far, cut before a stop string once one has been seen."""
        return self._text if self.stop_at is None else self._text[: self.stop_at]

    def push(self, token_id: int) -> tuple[str, bool]:
        """Add a token; return ``(released text, stop string seen)``."""
        self._ids.append(int(token_id))
        context = self._decode(self._ids[self._context:self._read])
        window = self._decode(self._ids[self._context:])
        tail = window[len(context):] if window.startswith(context) else None
        if tail is None or (not context and self._context < self._read):
            # the tokenizer rewrote the context, or it decoded to nothing (special tokens only,
            # which would let a leading space drop): decode everything once
            self._settled, tail = "", self._decode(self._ids)
            self._context = self._read = 0
        self._text = self._settled + tail
        if not tail.endswith("\ufffd"):  # a complete character: settle
            self._settled, self._read = self._text, len(self._ids)
            self._context = max(0, self._read - CONTEXT_TOKENS)
        hit = self._find_stop()
        if hit is not None:
            self.stop_at = hit
            return self._release(hit), True
        return self._release(len(self._text) - self._held()), False

    def flush(self) -> str:
        """Release everything still held back (at the end of generation)."""
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        upto = max(upto, self._sent)
        piece = self._text[self._sent : upto]
        self._sent = upto
        return piece

    def _find_stop(self) -> int | None:
        if not self._stop:
            return None
        start = self._searched
        found = [i for i in (self._text.find(s, start) for s in self._stop) if i >= 0]
        self._searched = max(0, len(self._text) - self._longest + 1)
        return min(found) if found else None

    def _held(self) -> int:
        text, held = self._text, 0
        while held < len(text) and text[len(text) - 1 - held] == "\ufffd":
            held += 1
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    held = max(held, k)
                    break
        return held

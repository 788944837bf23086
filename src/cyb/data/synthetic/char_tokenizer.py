"""A tiny fixed character-level tokenizer shared by all synthetic tasks.

Ids are stable: ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, then one id per character of the
alphabet in order, then any extra special tokens in the order they were added.  A model trained
with this tokenizer therefore keeps its meaning when the tokenizer is rebuilt or reloaded.
"""

from __future__ import annotations

import json
import os
import string
from pathlib import Path
from typing import Iterable, Sequence

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
BASE_SPECIAL_TOKENS = (PAD, BOS, EOS)
#: Digits, lower-case letters and the symbols the synthetic tasks use (space included).
DEFAULT_ALPHABET = string.digits + string.ascii_lowercase + "+-*=,.;:?>|() "
FILE_NAME = "char_tokenizer.json"
_FORMAT = "cyb.CharTokenizer"
_FORMAT_VERSION = 1


def _check_special_name(name: object) -> str:
    if not isinstance(name, str) or len(name) < 3 or name[0] != "<" or name[-1] != ">":
        raise ValueError(f"special token names must look like '<name>', got {name!r}")
    if "<" in name[1:-1] or ">" in name[1:-1]:
        raise ValueError(f"special token name {name!r} must not contain '<' or '>' inside")
    return name


class CharTokenizer:
    """Character-level tokenizer: one id per character, plus named special tokens.

    Args:
        alphabet: the characters, each becoming one token (no duplicates, no ``'<'``, which
            opens special-token names).  Defaults to :data:`DEFAULT_ALPHABET`.
        extra_special_tokens: names like ``"<pause_1>"`` appended after the alphabet.

    ``encode`` maps each character to its id and each special-token name found in the text
    (e.g. ``"<eos>"``) to that token's id; ``decode`` is its inverse, so
    ``encode(decode(ids)) == ids`` for every valid id list.
    """

    def __init__(
        self, alphabet: str = DEFAULT_ALPHABET, extra_special_tokens: Iterable[str] = ()
    ) -> None:
        if not isinstance(alphabet, str) or not alphabet:
            raise ValueError(f"alphabet must be a non-empty string, got {alphabet!r}")
        if len(set(alphabet)) != len(alphabet):
            dupes = sorted({c for c in alphabet if alphabet.count(c) > 1})
            raise ValueError(f"alphabet has repeated characters: {dupes}")
        if "<" in alphabet:
            raise ValueError("alphabet must not contain '<' (it opens special-token names)")
        self._alphabet = alphabet
        self._tokens: list[str] = list(BASE_SPECIAL_TOKENS) + list(alphabet)
        self._special: dict[str, int] = {name: i for i, name in enumerate(BASE_SPECIAL_TOKENS)}
        first = len(BASE_SPECIAL_TOKENS)
        self._char_to_id: dict[str, int] = {c: first + i for i, c in enumerate(alphabet)}
        self.add_special_tokens(extra_special_tokens)

    # ----------------------------------------------------------------- vocabulary
    @property
    def vocab_size(self) -> int:
        """Number of ids (base specials + alphabet + extra specials)."""
        return len(self._tokens)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def pad_id(self) -> int:
        return self._special[PAD]

    @property
    def bos_id(self) -> int:
        return self._special[BOS]

    @property
    def eos_id(self) -> int:
        return self._special[EOS]

    @property
    def alphabet(self) -> str:
        return self._alphabet

    @property
    def special_tokens(self) -> list[str]:
        """All special-token names, in id order (``<pad>``, ``<bos>``, ``<eos>``, extras...)."""
        return sorted(self._special, key=self._special.__getitem__)

    @property
    def special_ids(self) -> list[int]:
        return sorted(self._special.values())

    def token_to_id(self, token: str) -> int:
        """Id of a single character or a special-token name; KeyError if unknown."""
        if token in self._special:
            return self._special[token]
        if token in self._char_to_id:
            return self._char_to_id[token]
        raise KeyError(f"unknown token {token!r}")

    def id_to_token(self, token_id: int) -> str:
        self._check_id(token_id)
        return self._tokens[token_id]

    def add_special_tokens(self, names: Iterable[str]) -> list[int]:
        """Append special tokens (e.g. ``<pause_1>``, ``<dont_know>``) and return their ids.

        A name already present keeps its id (and that id is returned), so calling this twice
        with the same names is harmless.  New ids are ``vocab_size, vocab_size + 1, ...``.
        """
        if isinstance(names, str):
            raise TypeError("add_special_tokens takes a list of names, not a single string")
        ids = []
        for name in names:
            _check_special_name(name)
            if name not in self._special:
                self._special[name] = len(self._tokens)
                self._tokens.append(name)
            ids.append(self._special[name])
        return ids

    # ----------------------------------------------------------------- encode / decode
    def encode(self, text: str) -> list[int]:
        """Ids of ``text``: one per character; special-token names map to their single id."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        ids: list[int] = []
        i = 0
        while i < len(text):
            c = text[i]
            if c == "<":
                end = text.find(">", i + 1)
                name = text[i : end + 1] if end >= 0 else None
                if name not in self._special:
                    raise ValueError(
                        f"unknown special token starting at index {i} of {text!r}; "
                        f"known: {self.special_tokens}"
                    )
                ids.append(self._special[name])
                i = end + 1
                continue
            token_id = self._char_to_id.get(c)
            if token_id is None:
                raise ValueError(
                    f"character {c!r} at index {i} of {text!r} is not in the alphabet "
                    f"{self._alphabet!r}"
                )
            ids.append(token_id)
            i += 1
        return ids

    def decode(self, ids: Sequence[int] | Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (a list, tuple, or 1-D tensor/array of ints).

        Special tokens appear as their names unless ``skip_special_tokens`` is True.
        """
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        out = []
        for token_id in ids:
            self._check_id(token_id)
            token = self._tokens[token_id]
            if skip_special_tokens and token in self._special:
                continue
            out.append(token)
        return "".join(out)

    def _check_id(self, token_id: object) -> None:
        if not isinstance(token_id, int) or isinstance(token_id, bool):
            raise TypeError(f"token ids must be ints, got {token_id!r}")
        if not 0 <= token_id < len(self._tokens):
            raise ValueError(
                f"token id {token_id} is outside the vocabulary [0, {len(self._tokens)})"
            )

    # ----------------------------------------------------------------- persistence
    def to_dict(self) -> dict:
        extras = [t for t in self.special_tokens if t not in BASE_SPECIAL_TOKENS]
        return {
            "format": _FORMAT,
            "version": _FORMAT_VERSION,
            "alphabet": self._alphabet,
            "extra_special_tokens": extras,
            "vocab": self._tokens,  # redundant; lets a reader check the ids it rebuilds
        }

    @classmethod
    def from_dict(cls, data: dict) -> "CharTokenizer":
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(f"not a saved CharTokenizer (expected format {_FORMAT!r})")
        if data.get("version") != _FORMAT_VERSION:
            raise ValueError(
                f"unsupported CharTokenizer file version {data.get('version')!r} "
                f"(this code reads version {_FORMAT_VERSION})"
            )
        tok = cls(data["alphabet"], data.get("extra_special_tokens", ()))
        if "vocab" in data and data["vocab"] != tok._tokens:
            raise ValueError("saved CharTokenizer vocab does not match its alphabet and specials")
        return tok

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``<directory>/char_tokenizer.json`` (atomically) and return its path."""
        from ...files import write_json_atomic

        return write_json_atomic(Path(directory) / FILE_NAME, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CharTokenizer":
        """Read a tokenizer written by :meth:`save` (a directory or the JSON file itself)."""
        path = Path(path)
        if path.is_dir():
            path = path / FILE_NAME
        if not path.is_file():
            raise FileNotFoundError(f"no saved CharTokenizer at {path}")
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and self._tokens == other._tokens

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, special_tokens={self.special_tokens})"

    # ----------------------------------------------------------------- Hugging Face
    def to_hf(self):
        """An equivalent ``transformers.PreTrainedTokenizerFast`` (same ids, same specials).

        ``hf(text, add_special_tokens=False)["input_ids"] == self.encode(text)`` and
        ``hf.decode(ids) == self.decode(ids)``.  With special tokens (the default of
        ``hf(text)``) ``<bos>`` is put in front, as the synthetic datasets train on
        ``<bos> prompt answer <eos>``, so a prompt encoded for generation starts the same way.
        Save it with ``save_pretrained``.
        """
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
        from transformers import PreTrainedTokenizerFast

        vocab = {token: i for i, token in enumerate(self._tokens)}
        backend = Tokenizer(models.WordLevel(vocab, unk_token=None))
        # Every character is its own pre-token; "." never matches newline, which is fine
        # because the alphabet has none.
        backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
        backend.decoder = decoders.Fuse()
        backend.add_special_tokens(
            [AddedToken(name, special=True, normalized=False) for name in self.special_tokens]
        )
        backend.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, self.bos_id)])
        extras = [t for t in self.special_tokens if t not in BASE_SPECIAL_TOKENS]
        return PreTrainedTokenizerFast(
            tokenizer_object=backend,
            bos_token=BOS,
            eos_token=EOS,
            pad_token=PAD,
            additional_special_tokens=extras,
            clean_up_tokenization_spaces=False,
            padding_side="right",
        )

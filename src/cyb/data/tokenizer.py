"""Tokenisers: load any Hugging Face tokenizer, train a small byte-level BPE, encode in batches.

A tokenizer trained here is saved as a ``PreTrainedTokenizerFast`` folder
(``tokenizer.json`` + ``tokenizer_config.json``), so :func:`load_tokenizer` (or
``AutoTokenizer.from_pretrained``) reloads it like any other.
"""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

DEFAULT_PAD = "<pad>"
DEFAULT_BOS = "<bos>"
DEFAULT_EOS = "<eos>"
BYTE_ALPHABET = 256  # a byte-level BPE starts from every byte value
T = TypeVar("T")


def load_tokenizer(name_or_path: str | Path, *, local_files_only: bool = True, **kwargs: Any):
    """Load a Hugging Face tokenizer (``AutoTokenizer``) from a local folder or the hub cache.

    Args:
        name_or_path: a folder written by ``save_pretrained`` / :func:`train_bpe_tokenizer`, or
            a hub name already in the local cache (e.g. ``"gpt2"``).
        local_files_only: never touch the network (the default); pass False to allow a
            download where the hub is reachable.
        **kwargs: passed to ``AutoTokenizer.from_pretrained`` (e.g. ``revision``).

    Raises:
        FileNotFoundError: a path-like ``name_or_path`` that does not exist.
        OSError: a hub name that is not in the local cache (with ``local_files_only``).
        ValueError: a local folder whose files cannot be read (damaged, truncated), naming it.
    """
    from transformers import AutoTokenizer

    s = str(name_or_path)
    path = Path(s).expanduser()
    if path.exists():
        path = _tokenizer_folder(path)
        s = str(path)
    elif isinstance(name_or_path, Path) or s.startswith((".", os.sep, "~")):
        raise FileNotFoundError(f"tokenizer folder {s!r} does not exist")
    if path.is_dir() and not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ValueError(f"{s} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    try:
        return AutoTokenizer.from_pretrained(s, local_files_only=local_files_only, **kwargs)
    except OSError as e:
        hint = " (not in the local cache; pass local_files_only=False)" if local_files_only else ""
        raise OSError(f"cannot load tokenizer {s!r}{hint}: {e}") from e
    except Exception as e:  # noqa: BLE001 (a damaged file fails in many ways inside tokenizers)
        if not path.is_dir():
            raise
        reason = " ".join(str(e).split())[:120]
        raise ValueError(f"the tokenizer in {s} cannot be read ({type(e).__name__}: {reason}): a file in it "
                         "is damaged or was not fully written; restore it from a copy") from None


#: Files of which a Hugging Face tokenizer folder holds at least one.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _tokenizer_folder(path: Path) -> Path:
    """The folder that holds the tokenizer of ``path``: itself, or for a run folder of ``cyb
    train`` its model's (``final/``), else the one it trained (``tokenizer/``)."""
    if not path.is_dir() or any((path / f).is_file() for f in TOKENIZER_FILES) or not (path / "config.yaml").is_file():
        return path
    for sub in ("final", "tokenizer"):
        if any((path / sub / f).is_file() for f in TOKENIZER_FILES):
            return path / sub
    return path


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of ``size`` items (the last one may be shorter)."""
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    out_dir: str | Path,
    *,
    special_tokens: Sequence[str] = (),
    pad_token: str = DEFAULT_PAD,
    bos_token: str = DEFAULT_BOS,
    eos_token: str = DEFAULT_EOS,
    min_frequency: int = 2,
    model_max_length: int | None = None,
    show_progress: bool = False,
):
    """Train a byte-level BPE tokenizer on ``texts`` and save it to ``out_dir``.

    The vocabulary holds, in this order: ``pad_token`` (id 0), ``bos_token`` (1), ``eos_token``
    (2), then ``special_tokens`` (ids 3, 4, ...), the 256 byte symbols, then merges up to
    ``vocab_size``. Any text round-trips (byte-level: no unknown token). Special tokens are
    never split or merged with other text. No special token is added automatically when
    encoding; packing inserts ``eos_token`` between documents itself.

    Args:
        texts: training documents (streamed; only the trainer's counts are kept in memory).
        vocab_size: total vocabulary size, at least ``3 + len(special_tokens) + 256``.
        out_dir: folder to write (created if needed).
        special_tokens: extra reserved tokens, e.g. ``["<pause_1>", "<pause_2>", "<dont_know>"]``.
        min_frequency: a pair must occur this often to be merged.
        model_max_length: stored in the tokenizer config (default: no limit).

    Returns:
        the trained ``PreTrainedTokenizerFast`` (what ``load_tokenizer(out_dir)`` returns too).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    reserved = [pad_token, bos_token, eos_token, *special_tokens]
    if len(set(reserved)) != len(reserved):
        raise ValueError(f"special tokens must be distinct, got {reserved}")
    smallest = len(reserved) + BYTE_ALPHABET
    if vocab_size < smallest:
        raise ValueError(
            f"vocab_size must be >= {smallest} (3 + {len(special_tokens)} special tokens + "
            f"{BYTE_ALPHABET} bytes), got {vocab_size}"
        )
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=reserved,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    seen = 0

    def counted() -> Iterator[list[str]]:
        nonlocal seen
        for batch in chunked(texts, 1000):
            seen += len(batch)
            yield batch

    tok.train_from_iterator(counted(), trainer=trainer)
    if seen == 0:
        raise ValueError("train_bpe_tokenizer got no texts to train on")

    extra: dict[str, Any] = {}
    if model_max_length is not None:
        extra["model_max_length"] = model_max_length
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=pad_token,
        bos_token=bos_token,
        eos_token=eos_token,
        additional_special_tokens=list(special_tokens),
        **extra,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return fast


class UnencodableText(ValueError):
    """Text that a model cannot read, in one line that names what it lacks (``str(e)``).

    Attributes:
        reason: the why alone, to follow a colon in another sentence ("its vocabulary lacks the
            character 'é' and has no unknown token to stand for it").
    """

    def __init__(self, message: str, reason: str):
        self.reason = reason
        super().__init__(message)


def unknown_pieces(tokenizer: Any, text: str, *, special_tokens: bool = True) -> list[str]:
    """The distinct pieces of ``text``, sorted, that ``tokenizer`` has no token for and no unknown
    token to stand for: the characters outside a
    :class:`~cyb.data.synthetic.CharTokenizer`'s alphabet, or the pre-tokenised pieces (words,
    characters) that a word-level vocabulary without an unknown token lacks (the character
    tokenizer's Hugging Face form is one).  ``[]`` for other tokenizers: a byte-level BPE reads
    any text.  ``special_tokens``: a special token's string in the text (``"<eos>"``) is read as
    that token, as ``tokenizer(text)`` does, not as text."""
    from .synthetic import CharTokenizer

    if isinstance(tokenizer, CharTokenizer):
        if special_tokens:
            for name in tokenizer.special_tokens:
                text = text.replace(name, "")
        return sorted(set(text) - set(tokenizer.alphabet))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and hasattr(tokenizer, "pre_tokenizer") and hasattr(tokenizer, "get_vocab"):
        backend = tokenizer  # a bare tokenizers.Tokenizer
    if backend is None or type(backend.model).__name__ != "WordLevel":
        return []
    vocab = backend.get_vocab()
    if backend.model.unk_token in vocab:
        return []  # every unknown piece becomes the unknown token
    if special_tokens:
        for token in backend.get_added_tokens_decoder().values():
            text = text.replace(token.content, "")
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    pieces = [p for p, _ in backend.pre_tokenizer.pre_tokenize_str(text)] if backend.pre_tokenizer else [text]
    lacking = {p for p in pieces if p and p not in vocab}
    if lacking:
        from .synthetic.text_task import is_char_tokenizer

        if is_char_tokenizer(tokenizer):  # its pattern "." leaves a run of line breaks whole
            lacking = set("".join(lacking))
    return sorted(lacking)


def check_text(text: str, what: str, *, tokenizer: Any = None, trained_on: tuple[str, str] | None = None) -> None:
    """Raise :class:`UnencodableText` when the model cannot read ``text``, in one line that names
    the characters or words at fault; the one check of every place that encodes a user's text
    (prompts of ``cyb generate``, :mod:`cyb.generation` and ``cyb serve``, ``cyb eval --data``,
    the requests of the lm-evaluation-harness model).

    Args:
        text: the text.
        what: what it is, the sentence's subject (``"prompt 0"``).
        tokenizer: the model's; the pieces its vocabulary lacks (:func:`unknown_pieces`) are named.
        trained_on: ``(task, characters)`` of a model trained on a synthetic task with the
            character tokenizer (:attr:`cyb.model.PauseModel.trained_on`): a character outside the
            task's text is one the model never saw, though its tokenizer has it.
    """
    if trained_on is not None:
        task, known = trained_on
        unknown = sorted(set(text) - set(known))
        if unknown:
            raise UnencodableText(
                f"{what} has {_named(unknown)} that the model never saw: it was trained on {task}, whose "
                f"text has only the characters {''.join(sorted(known))!r}",
                f"the model was trained on {task} and never saw {_named(unknown)}")
    pieces = unknown_pieces(tokenizer, text) if tokenizer is not None else []
    if pieces:
        raise _lacking(tokenizer, pieces, what)


def encode_failure(tokenizer: Any, text: str, what: str, error: BaseException) -> UnencodableText:
    """The error to raise when ``tokenizer`` failed to encode ``text`` (``what``): the pieces its
    vocabulary lacks where they can be named, else the tokenizer's own error in one line."""
    pieces = unknown_pieces(tokenizer, text)
    if pieces:
        return _lacking(tokenizer, pieces, what)
    reason = " ".join(str(error).split())[:160] or type(error).__name__
    if "UNK" in reason and "vocab" in reason.lower():  # a WordLevel error: say it in the user's terms
        reason = "its vocabulary lacks some of the text's characters and has no unknown token to stand for them"
    return UnencodableText(f"the tokenizer cannot encode {what}: {reason}", reason)


def _lacking(tokenizer: Any, pieces: list[str], what: str) -> UnencodableText:
    from .synthetic.text_task import is_char_tokenizer

    named = _named(pieces)
    them = "it" if len(pieces) == 1 else "them"
    reason = f"its vocabulary lacks {named} and has no unknown token to stand for {them}"
    if is_char_tokenizer(tokenizer):
        from .synthetic import CharTokenizer

        return UnencodableText(f"{what} has {named} that the model's character tokenizer does not have (it reads "
                               f"only {CharTokenizer().alphabet!r})", reason)
    return UnencodableText(f"{what} has {named} that the tokenizer's vocabulary does not have, and no unknown "
                           f"token to stand for {them}", reason)


def _named(pieces: list[str], most: int = 8) -> str:
    """``the characters 'a', 'b'`` (or words, where a piece is longer than one character)."""
    kind = "character" if all(len(p) == 1 for p in pieces) else "word"
    shown = ", ".join(repr(p) for p in pieces[:most])
    more = f" and {len(pieces) - most} more" if len(pieces) > most else ""
    return f"the {kind}{'s' if len(pieces) > 1 else ''} {shown}{more}"


def text_encoder(
    tokenizer: Any, *, split_special_tokens: bool = True
) -> Callable[[Sequence[str]], list[list[int]]]:
    """A function mapping a batch of texts to their token ids (no special tokens added).

    Uses the Rust tokenizer's multi-threaded batch encoder when ``tokenizer`` has one (a
    ``transformers`` fast tokenizer or a bare ``tokenizers.Tokenizer``), else falls back to
    ``tokenizer(texts, add_special_tokens=False)``.

    With ``split_special_tokens`` (the default) a special token's *string* in the text (say a
    literal ``"<eos>"`` in a web page) is encoded as ordinary text, so data can never inject
    reserved ids; the tokenizer passed in is not modified (the encoder works on a copy).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "token_to_id"):
        backend = tokenizer  # a bare tokenizers.Tokenizer
    if backend is not None:
        if split_special_tokens and hasattr(backend, "encode_special_tokens"):
            backend = copy.deepcopy(backend)
            backend.encode_special_tokens = True
        encode = getattr(backend, "encode_batch_fast", None) or backend.encode_batch

        def encode_backend(texts: Sequence[str]) -> list[list[int]]:
            if not texts:
                return []
            try:
                return [e.ids for e in encode(list(texts), add_special_tokens=False)]
            except Exception as e:  # noqa: BLE001 (the Rust tokenizer raises a bare Exception)
                raise _batch_failure(backend, texts, e, special_tokens=not split_special_tokens) from None

        return encode_backend

    kwargs = {"split_special_tokens": True} if split_special_tokens else {}

    def encode_python(texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        return list(tokenizer(list(texts), add_special_tokens=False, **kwargs)["input_ids"])

    return encode_python


def _batch_failure(backend, texts: Sequence[str], error: BaseException, *, special_tokens: bool) -> UnencodableText:
    """:func:`encode_failure` of the first text of a batch whose pieces the vocabulary lacks."""
    for i, text in enumerate(texts):
        pieces = unknown_pieces(backend, text, special_tokens=special_tokens)
        if pieces:
            return _lacking(backend, pieces, f"text {i} of the batch")
    return encode_failure(backend, "", "a text of the batch", error)


def encode_texts(
    tokenizer: Any, texts: Sequence[str], *, split_special_tokens: bool = True
) -> list[list[int]]:
    """Token ids of each text, without special tokens, in one batched call.

    A one-off convenience over :func:`text_encoder`; build the encoder once when encoding
    many batches.
    """
    return text_encoder(tokenizer, split_special_tokens=split_special_tokens)(texts)


def count_tokens(
    texts: Iterable[str], tokenizer: Any, *, add_eos: bool = True, chunk_docs: int = 128
) -> int:
    """Tokens in the packed stream of ``texts``: their ids plus one EOS each if ``add_eos``.

    Streams ``texts`` in chunks of ``chunk_docs`` documents (one batched tokenizer call each).
    One epoch of ``PackedBlocks`` holds ``count_tokens(texts, tokenizer) // block_len`` blocks.
    """
    encode = text_encoder(tokenizer)
    return sum(len(ids) + add_eos for chunk in chunked(texts, chunk_docs) for ids in encode(chunk))


def eos_token_id(tokenizer: Any) -> int:
    """The tokenizer's end-of-sequence id; ValueError if it has none."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        raise ValueError(
            f"tokenizer {type(tokenizer).__name__} has no eos token; pass eos_id explicitly"
        )
    return int(eos)

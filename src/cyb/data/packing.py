"""Concatenate-then-split packing of a document stream into fixed-length token blocks.

Documents are tokenised (in chunks, with the fast tokenizer's batch call), each followed by
the EOS id, concatenated, and cut into consecutive blocks of ``block_len`` real tokens::

    doc0 <eos> doc1 <eos> doc2 <eos> ...  ->  [block 0][block 1][block 2] ... (tail dropped)

:class:`PackedBlocks` hands those blocks out in one of three orders (``shuffle``):

* ``"corpus"``: a seeded permutation of all blocks of the epoch (a new one each epoch). The
  epoch's tokens are held in memory (4 bytes per token), so this suits corpora up to a few
  hundred million tokens; it is what training uses by default.
* ``"buffer"``: a seeded permutation within consecutive windows of ``shuffle_buffer`` blocks
  (streaming: at most one window in memory; for hub data sets and very large corpora).
* ``"none"``: corpus order. Consecutive blocks come from the same few documents, so a batch
  of them is far from an i.i.d. sample: small models trained this way reach a much worse
  held-out perplexity. Use it for evaluation, not training.

Blocks are sharded over data-parallel ranks (one epoch holds ``count_tokens(texts, tokenizer)
// block_len`` blocks before sharding). The stream is resumable: ``state_dict()`` after ``k``
blocks, then ``load_state_dict()`` on a fresh object, continues with block ``k + 1`` of the
uninterrupted run. The state is a small dict of ints (JSON-friendly): a document index and
token offset where the current shuffle window starts, plus counters; resuming re-reads the
source up to that document (cheap: no tokenisation) and re-tokenises at most one window (the
whole epoch for ``"corpus"``).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Union

import numpy as np
import torch

from .sources import HUB_PREFIX, text_source
from .tokenizer import chunked, eos_token_id, text_encoder

TextsFactory = Callable[[], Iterable[str]]
TextSource = Union[str, Path, TextsFactory, Sequence[str]]
STATE_VERSION = 1
SHUFFLES = ("corpus", "buffer", "none")


def resolved_shuffle(shuffle: str, source) -> str:
    """``shuffle`` (one of :data:`SHUFFLES` or ``"auto"``) with ``auto`` resolved for ``source``:
    ``buffer`` for hub streams (``hf:``), ``corpus`` otherwise (files, folders, built-in text)."""
    if shuffle != "auto":
        return shuffle
    return "buffer" if str(source).startswith(HUB_PREFIX) else "corpus"


def as_texts_factory(source: TextSource, *, text_field: str = "text") -> TextsFactory:
    """A callable that restarts the document stream: from a spec (see :func:`iter_texts`), a
    factory (returned as is) or an in-memory list/tuple of texts."""
    if isinstance(source, (str, Path)):
        return text_source(source, text_field=text_field)
    if callable(source):
        return source
    if isinstance(source, (list, tuple)):
        return functools.partial(iter, source)
    raise TypeError(
        f"texts must be a path/spec, a callable or a list of str, got {type(source).__name__}"
    )


def _valid_score(text: str, seed: int) -> float:
    """A deterministic pseudo-random number in [0, 1) from the text (stable across runs)."""
    data = f"{seed}\0{text}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") / 2.0**64


def split_texts(
    texts: Iterable[str], valid_fraction: float, which: Literal["train", "valid"], *, seed: int = 0
) -> Iterator[str]:
    """Keep the documents of one side of a deterministic train/validation split.

    A document goes to validation when a hash of (``seed``, its text) falls below
    ``valid_fraction``, so the split does not depend on document order, and duplicate
    documents always land on the same side.
    """
    if not 0.0 <= valid_fraction <= 1.0:
        raise ValueError(f"valid_fraction must lie in [0, 1], got {valid_fraction}")
    if which not in ("train", "valid"):
        raise ValueError(f"which must be 'train' or 'valid', got {which!r}")
    want_valid = which == "valid"
    return (t for t in texts if (_valid_score(t, seed) < valid_fraction) == want_valid)


def _split_factory(
    factory: TextsFactory, valid_fraction: float, which: str, seed: int
) -> Iterator[str]:
    return split_texts(factory(), valid_fraction, which, seed=seed)  # type: ignore[arg-type]


def train_valid_sources(
    train: TextSource,
    valid: TextSource | None = None,
    *,
    valid_fraction: float = 0.0,
    seed: int = 0,
    text_field: str = "text",
) -> tuple[TextsFactory, TextsFactory | None]:
    """Text factories for training and validation.

    With ``valid`` given, it is the validation source and ``train`` is used whole. Otherwise,
    with ``valid_fraction > 0``, ``train`` is split by :func:`split_texts`; with neither, the
    validation factory is None.
    """
    if not 0.0 <= valid_fraction < 1.0:
        raise ValueError(f"valid_fraction must lie in [0, 1), got {valid_fraction}")
    train_f = as_texts_factory(train, text_field=text_field)
    if valid is not None:
        return train_f, as_texts_factory(valid, text_field=text_field)
    if valid_fraction == 0:
        return train_f, None
    return (
        functools.partial(_split_factory, train_f, valid_fraction, "train", seed),
        functools.partial(_split_factory, train_f, valid_fraction, "valid", seed),
    )


@dataclass
class _State:
    epoch: int = 0
    window_doc: int = 0  # stream position where the current shuffle window starts:
    window_offset: int = 0  # a document index and a token offset into it (EOS included)
    window_index: int = 0
    window_first: int = 0  # index within the epoch of the window's first block
    next_block: int = 0  # blocks of the epoch before this index are consumed (by all ranks)
    epoch_blocks: int = 0  # blocks in one epoch (before sharding); 0 while not yet known


class PackedBlocks:
    """A resumable stream of packed ``LongTensor [block_len]`` blocks.

    Args:
        texts: the documents: a spec for :func:`iter_texts`, a factory returning a fresh
            iterable at each call (e.g. :func:`text_source`), or a list of str. The factory is
            called once per epoch and on resume; it must give the same documents each time.
        tokenizer: a Hugging Face tokenizer (fast ones are used through their batch encoder).
        block_len: real tokens per block (>= 1).
        eos_id: separator appended to each document (default: the tokenizer's EOS).
        shuffle: ``"corpus"`` (all blocks of an epoch in a seeded random order), ``"buffer"``
            (random order within consecutive windows of ``shuffle_buffer`` blocks) or
            ``"none"`` (corpus order). None (the default) means ``"buffer"`` when
            ``shuffle_buffer > 1``, else ``"none"``. Permutations are seeded by (``seed``,
            epoch, window), so they are reproducible.
        shuffle_buffer: blocks per shuffle window for ``"buffer"`` (rounded up to a multiple of
            ``world_size``).
        seed: seeds the shuffle.
        rank, world_size: data-parallel shard. With ``shard="block"`` (the default) every rank
            reads the whole stream and rank ``r`` takes blocks ``r, r + w, r + 2w, ...``: disjoint,
            together complete except a trailing incomplete round, and every rank gets the same
            number of blocks (so batches stay in lockstep). With ``shard="document"`` rank ``r``
            packs only documents ``r, r + w, ...`` (``w`` times less tokenisation, but block counts
            may differ between ranks near the end of an epoch: prefer ``epochs=None``).
        epochs: passes over the data (None: repeat forever). Each pass drops its tail (< one
            block).
        chunk_docs: documents per tokenizer batch call (throughput only; no effect on output).
        text_field: for a spec ``texts``, the field holding the text.

    Iterating continues from the current state (the next unconsumed block); once all epochs are
    consumed it yields nothing until :meth:`reset` or :meth:`load_state_dict`. Use one iterator
    at a time.
    """

    def __init__(
        self,
        texts: TextSource,
        tokenizer: Any,
        block_len: int,
        *,
        eos_id: int | None = None,
        shuffle: Literal["corpus", "buffer", "none"] | None = None,
        shuffle_buffer: int = 0,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        shard: Literal["block", "document"] = "block",
        epochs: int | None = 1,
        chunk_docs: int = 128,
        text_field: str = "text",
    ) -> None:
        if block_len < 1:
            raise ValueError(f"block_len must be >= 1, got {block_len}")
        if shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be >= 0, got {shuffle_buffer}")
        if shuffle is None:
            shuffle = "buffer" if shuffle_buffer > 1 else "none"
        if shuffle not in SHUFFLES:
            raise ValueError(f"shuffle must be one of {', '.join(SHUFFLES)}, got {shuffle!r}")
        if shuffle == "buffer" and shuffle_buffer < 2:
            raise ValueError(f"shuffle='buffer' needs shuffle_buffer >= 2 blocks, got {shuffle_buffer}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                "need world_size >= 1 and 0 <= rank < world_size, "
                f"got rank={rank}, world_size={world_size}"
            )
        if shard not in ("block", "document"):
            raise ValueError(f"shard must be 'block' or 'document', got {shard!r}")
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be >= 1 or None (forever), got {epochs}")
        if chunk_docs < 1:
            raise ValueError(f"chunk_docs must be >= 1, got {chunk_docs}")
        self._factory = as_texts_factory(texts, text_field=text_field)
        self._encode = text_encoder(tokenizer)
        self.eos_id = eos_token_id(tokenizer) if eos_id is None else int(eos_id)
        vocab = len(tokenizer) if hasattr(tokenizer, "__len__") else None
        if self.eos_id < 0 or (vocab is not None and self.eos_id >= vocab):
            raise ValueError(f"eos_id must lie in [0, {vocab}), got {self.eos_id}")
        self.block_len, self.shuffle, self.seed = block_len, shuffle, seed
        self.shuffle_buffer = shuffle_buffer if shuffle == "buffer" else 0
        self.rank, self.world_size, self.shard, self.epochs = rank, world_size, shard, epochs
        self.chunk_docs = chunk_docs
        self._round = world_size if shard == "block" else 1  # blocks handed out per round
        self._take = rank if shard == "block" else 0  # which block of a round is ours
        # blocks read before handing any out: the whole epoch (None), a window, or one round
        self._window = None if shuffle == "corpus" else \
            -(-max(1, self.shuffle_buffer) // self._round) * self._round
        self._state = _State()

    # ------------------------------------------------------------------ the block stream

    def _doc_tokens(self, start_doc: int) -> Iterator[tuple[int, list[int]]]:
        """``(document index, token ids)`` from document ``start_doc`` on (our shard only)."""
        pending: list[tuple[int, str]] = []
        for i, text in enumerate(self._factory()):
            if i < start_doc or (self.shard == "document" and i % self.world_size != self.rank):
                continue
            pending.append((i, text))
            if len(pending) == self.chunk_docs:
                yield from zip((i for i, _ in pending), self._encode([t for _, t in pending]))
                pending = []
        if pending:
            yield from zip((i for i, _ in pending), self._encode([t for _, t in pending]))

    def _blocks(
        self, start_doc: int, start_offset: int
    ) -> Iterator[tuple[np.ndarray, tuple[int, int]]]:
        """Consecutive blocks from a stream position, each with the position right after it."""
        size = self.block_len
        rest = np.empty(0, dtype=np.int64)
        live: deque[list[int]] = deque()  # [doc index, length, tokens not yet in a block]
        last = start_doc - 1
        for chunk in chunked(self._doc_tokens(start_doc), self.chunk_docs):
            parts = [rest]
            for idx, ids in chunk:
                arr = np.empty(len(ids) + 1, dtype=np.int32)
                arr[:-1] = ids
                arr[-1] = self.eos_id
                skip = start_offset if idx == start_doc else 0
                if skip >= len(arr):
                    raise ValueError(
                        f"resume state points at token {skip} of document {idx}, which has "
                        f"only {len(arr)} tokens: the data or tokenizer changed since the state "
                        "was saved"
                    )
                parts.append(arr[skip:])
                live.append([idx, len(arr), len(arr) - skip])
                last = idx
            buf = np.concatenate(parts)
            full = len(buf) // size
            for b in range(full):
                need = size
                while need and need >= live[0][2]:
                    need -= live.popleft()[2]
                if need:
                    live[0][2] -= need
                after = (live[0][0], live[0][1] - live[0][2]) if live else (last + 1, 0)
                yield buf[b * size : (b + 1) * size], after
            rest = buf[full * size :]
        if start_offset and last < start_doc:
            raise ValueError(
                f"resume state points into document {start_doc}, but the source has fewer "
                "documents now: the data changed since the state was saved"
            )

    def _order(self, n: int, epoch: int, window: int) -> list[int]:
        order = list(range(n))
        if self.shuffle != "none":
            random.Random(f"cyb-pack:{self.seed}:{epoch}:{window}").shuffle(order)
        return order

    @property
    def epoch_blocks(self) -> int | None:
        """Blocks in one epoch (before sharding), once known: after the first epoch, or as soon
        as the first block is drawn with ``shuffle="corpus"``; else None."""
        return self._state.epoch_blocks or None

    def epochs_done(self) -> float | None:
        """Passes over the data consumed so far (``1.5`` = half-way through the second epoch),
        or None while the epoch's length is unknown."""
        st = self._state
        if not st.epoch_blocks:
            return None
        return st.epoch + min(st.next_block, st.epoch_blocks) / st.epoch_blocks

    def __iter__(self) -> Iterator[torch.Tensor]:
        st, rnd = self._state, self._round
        while self.epochs is None or st.epoch < self.epochs:
            stream = self._blocks(st.window_doc, st.window_offset)
            while window := list(itertools.islice(stream, self._window)):
                if self._window is None:
                    st.epoch_blocks = st.window_first + len(window)
                order = self._order(len(window), st.epoch, st.window_index)
                complete = len(window) // rnd * rnd  # an incomplete last round is dropped
                for j in range(self._take, complete, rnd):
                    if st.window_first + j < st.next_block:
                        continue  # consumed before a resume
                    st.next_block = st.window_first + j - self._take + rnd
                    yield torch.from_numpy(window[order[j]][0].astype(np.int64))
                st.window_doc, st.window_offset = window[-1][1]
                st.window_index += 1
                st.window_first += len(window)
                st.next_block = max(st.next_block, st.window_first)
            if st.window_first < rnd:
                raise ValueError(
                    f"the data holds {st.window_first} block(s) of block_len={self.block_len} "
                    f"tokens per epoch; need at least {rnd} (one per rank)"
                )
            self._state = st = _State(epoch=st.epoch + 1, epoch_blocks=st.window_first)

    # ------------------------------------------------------------------ resume

    def _config(self) -> dict[str, Any]:
        cfg = {
            "block_len": self.block_len,
            "eos_id": self.eos_id,
            "shuffle": self.shuffle,
            "shuffle_buffer": self.shuffle_buffer,
            "seed": self.seed,
            "world_size": self.world_size,
            "shard": self.shard,
        }
        if self.shard == "document":
            cfg["rank"] = self.rank  # the position is this rank's own
        return cfg

    def state_dict(self) -> dict[str, Any]:
        """The position after the last block handed out, plus the settings it depends on.

        A dict of ints and strings (JSON-serialisable). With ``shard="block"`` it is the same
        on every rank that consumed the same number of blocks, so one copy serves all ranks.
        """
        return {"version": STATE_VERSION, **self._config(), **asdict(self._state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the next block is the one that came next then.

        Raises ValueError if the state was saved with other packing settings.
        """
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"unknown packing state version {state.get('version')!r} (expected {STATE_VERSION})"
            )
        for key, value in self._config().items():
            if state.get(key) != value:
                raise ValueError(
                    f"packing state was saved with {key}={state.get(key)!r}, "
                    f"but this stream has {key}={value!r}"
                )
        optional = {"epoch_blocks"}  # not in states written before it existed
        missing = [k for k in asdict(_State()) if k not in state and k not in optional]
        if missing:
            raise ValueError(f"packing state lacks {missing}")
        self._state = _State(**{k: int(state[k]) for k in asdict(_State()) if k in state})

    def reset(self) -> None:
        """Go back to the first block of the first epoch."""
        self._state = _State()


def batches(
    blocks: Iterable[torch.Tensor], batch_size: int, *, drop_last: bool = True
) -> Iterator[torch.Tensor]:
    """Group consecutive blocks into ``LongTensor [batch_size, block_len]`` batches.

    Lazy: a batch's blocks are drawn only when that batch is requested, so between batches
    ``PackedBlocks.state_dict()`` is exactly "after the batches handed out"; to resume, load
    the state into a new :class:`PackedBlocks` and call ``batches`` on it again.
    ``drop_last=False`` also yields the final smaller batch.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    group: list[torch.Tensor] = []
    for block in blocks:
        group.append(block)
        if len(group) == batch_size:
            yield torch.stack(group)
            group = []
    if group and not drop_last:
        yield torch.stack(group)

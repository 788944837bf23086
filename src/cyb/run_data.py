"""A run's data, from its configuration: resumable streams of global batches and held-out rows.

* :class:`GlobalBatches`: every process reads the same seeded stream of global batches and
  takes its rows, so any world size sees the same rows in the same steps; the resume state is
  the stream position at a step boundary.
* :class:`TextRows`: packed text blocks in the configured order (``data.shuffle``), over epochs.
* :class:`TensorRows`: the rows of a synthetic data set, in a seeded order per epoch.
* :func:`build_data`: the run's training stream and its held-out micro-batches.
"""

from __future__ import annotations

import itertools

import torch

from .config import RunConfig
from .data.packing import PackedBlocks, resolved_shuffle, train_valid_sources
from .data.subsets import FractionOfTexts
from .distributed import DistInfo


def train_texts(cfg: RunConfig):
    """Text factories ``(train, valid or None)`` of a text run (see :func:`train_valid_sources`);
    below ``data.fraction = 1`` the training one keeps that share of the documents
    (:class:`~cyb.data.subsets.FractionOfTexts`), the held-out one is unchanged."""
    d = cfg.data
    train, valid = train_valid_sources(d.source, d.valid_source, valid_fraction=d.valid_fraction,
                                       seed=cfg.train.seed, text_field=d.text_field)
    if d.fraction < 1.0:
        train = FractionOfTexts(train, d.fraction, cfg.train.seed if d.fraction_seed is None else d.fraction_seed)
    return train, valid


class GlobalBatches:
    """This process's micro-batches of a global stream of ``batch_size`` rows per step.

    The global stream (rows in a fixed, seeded order) is the same on every process; process
    ``r`` of ``w`` takes rows ``[r*b/w, (r+1)*b/w)`` of each global batch of ``b`` rows and splits
    them into micro-batches.  Each micro-batch carries ``row``: the rows' indices within the
    global batch (to seed per-row randomness the same way at any world size).  The resume state
    is the stream position at a step boundary, so a checkpoint resumes at any world size.
    """

    def __init__(self, source, batch_size: int, info: DistInfo, micro: int):
        self.source, self.batch_size, self.info, self.micro = source, batch_size, info, micro
        self._state = source.state_dict()

    def __iter__(self):
        per = self.batch_size // self.info.world_size
        first = self.info.rank * per
        while True:
            rows = self.source.take(self.batch_size)
            self._state = self.source.state_dict()
            mine = {k: v[first:first + per] for k, v in rows.items()}
            for s in range(0, per, self.micro):
                batch = {k: v[s:s + self.micro] for k, v in mine.items()}
                batch["row"] = torch.arange(first + s, first + s + batch["ids"].shape[0])
                yield batch

    def epochs(self) -> float | None:
        """Passes over the training data after the global batches drawn so far (None while
        the corpus length is unknown)."""
        return self.source.epochs()

    def epoch_rows(self) -> int:
        """Rows in one pass over the training data (:meth:`TextRows.epoch_rows`)."""
        return self.source.epoch_rows()

    def steps_of(self, epochs: float, state: dict | None = None) -> int:
        """``epochs`` passes over the training data in optimiser steps of ``batch_size`` rows,
        rounded down (no step reaches past the last pass; at least 1); the rows of a pass from
        ``state`` (a checkpoint's position) where it holds them, else from :meth:`epoch_rows`."""
        rows = (state or {}).get("epoch_blocks") or self.epoch_rows()
        return max(1, int(epochs * rows // self.batch_size))

    def state_dict(self) -> dict:
        return dict(self._state)

    def load_state_dict(self, state: dict) -> None:
        self.source.load_state_dict(state)
        self._state = self.source.state_dict()


class TextRows:
    """Packed text blocks as rows ``{"ids": [n, L]}``, repeating over epochs; resumable."""

    def __init__(self, texts_factory, tokenizer, block_len: int, *, shuffle: str, shuffle_buffer: int,
                 seed: int, where: str = "data.source"):

        self.blocks = PackedBlocks(texts_factory, tokenizer, block_len, shuffle=shuffle,
                                   shuffle_buffer=shuffle_buffer, seed=seed, epochs=None)
        self.texts_factory, self.tokenizer = texts_factory, tokenizer
        self.where = where
        self._it = None
        self._ahead: list[tuple[torch.Tensor, dict]] = []  # drawn early (epoch_rows), handed out first

    def _next(self) -> torch.Tensor:
        if self._it is None:
            self._it = iter(self.blocks)
        try:
            return next(self._it)
        except (StopIteration, ValueError) as e:
            raise ValueError(f"{self.where} yields no block of data.block_len={self.blocks.block_len} "
                             f"tokens ({e}); add documents or lower data.block_len") from None

    def take(self, n: int) -> dict:
        rows = [block for block, _ in self._ahead[:n]]
        del self._ahead[:n]
        rows += [self._next() for _ in range(n - len(rows))]
        return {"ids": torch.stack(rows)}

    def epochs(self) -> float | None:
        """Passes over the corpus so far (None until its length is known)."""
        return self.blocks.epochs_done()

    def epoch_rows(self) -> int:
        """Blocks in one pass over the text.  Known from a loaded state or once a block was
        drawn with ``shuffle="corpus"`` (whose first draw reads the whole pass: drawn here if
        need be, and handed out first by :meth:`take`); otherwise counted by reading and
        tokenising the text once more."""
        if not self.blocks.epoch_blocks and self.blocks.shuffle == "corpus":
            before = self.blocks.state_dict()
            self._ahead.append((self._next(), before))
        if self.blocks.epoch_blocks:
            return self.blocks.epoch_blocks
        counter = PackedBlocks(self.texts_factory, self.tokenizer, self.blocks.block_len, shuffle="none", epochs=1)
        n = sum(1 for _ in counter)
        if not n:
            raise ValueError(f"{self.where} yields no block of data.block_len={self.blocks.block_len} tokens")
        return n

    def state_dict(self) -> dict:
        """The position after the rows taken so far (blocks drawn ahead are not taken yet)."""
        return dict(self._ahead[0][1]) if self._ahead else self.blocks.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.blocks.load_state_dict(state)
        self._it, self._ahead = None, []


class TensorRows:
    """Rows of fixed tensors (a synthetic data set) in a seeded order per epoch; resumable."""

    def __init__(self, tensors: dict, seed: int):
        self.tensors = tensors
        self.n = next(iter(tensors.values())).shape[0]
        self.seed = seed
        self.epoch, self.pos = 0, 0

    def _order(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
        return torch.randperm(self.n, generator=g)

    def take(self, n: int) -> dict:
        parts, got = [], 0
        order = self._order()
        while got < n:
            if self.pos >= self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                order = self._order()
            k = min(n - got, self.n - self.pos)
            parts.append(order[self.pos:self.pos + k])
            self.pos += k
            got += k
        sel = torch.cat(parts)
        return {k: v[sel] for k, v in self.tensors.items()}

    def epochs(self) -> float:
        """Passes over the data set so far."""
        return self.epoch + self.pos / self.n

    def epoch_rows(self) -> int:
        """Rows in one pass over the data set."""
        return self.n

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "rows": self.n, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("rows") != self.n or state.get("seed") != self.seed:
            raise ValueError("the checkpoint's data position does not match this data set (its rows "
                             "or seed differ: data.num_train_examples, data.task or train.seed changed)")
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])


def fraction_choice(train):
    """The documents ``data.fraction`` kept for the training stream ``train`` of
    :func:`build_data` (a :class:`~cyb.data.subsets.Choice`), or None when it reads all its text."""
    texts = getattr(getattr(train, "source", None), "texts_factory", None)
    return texts.choice if isinstance(texts, FractionOfTexts) else None


def fraction_state(train) -> dict:
    """``{"data_fraction": {"share", "documents", "of"}}``: the share of the training text's
    characters and the documents that ``data.fraction`` kept for ``train``; ``{}`` for all of it."""
    choice = fraction_choice(train)
    if choice is None:
        return {}
    return {"data_fraction": {"share": choice.share, "documents": len(choice.kept), "of": choice.documents}}


def task_split(cfg: RunConfig, tokenizer=None, split: str = "train"):
    """One split of the run's task data: ``"train"`` (``data.num_train_examples`` rows seeded by
    ``train.seed``) or ``"test"`` (``data.num_valid_examples`` by ``train.seed + 1``).  Character
    rows, or text rows when ``tokenizer`` is a pretrained model's
    (:mod:`cyb.data.synthetic.text_task`); for a ``reasoning-gym:NAME`` task the generator's
    questions and answers (:mod:`cyb.data.reasoning_gym`).  The splits are disjoint by
    construction and drawn independently, so scoring needs only ``"test"`` (a reasoning-gym
    training split of 38,400 questions takes seconds to draw)."""
    from .data import reasoning_gym
    from .data.synthetic import CharTokenizer, SyntheticDataset, make_task
    from .data.synthetic.text_task import TextTaskDataset, is_char_tokenizer

    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if reasoning_gym.is_reasoning_gym(cfg.data.task):  # questions and answers of a generator, as text
        return reasoning_gym.dataset_split(cfg, tokenizer, split)
    d, train = cfg.data, split == "train"
    n, seed = (d.num_train_examples, cfg.train.seed) if train else (d.num_valid_examples, cfg.train.seed + 1)
    task = make_task(d.task, **d.task_kwargs)
    if not is_char_tokenizer(tokenizer):
        return TextTaskDataset(task, tokenizer, n, seed=seed, split=split)
    return SyntheticDataset(task, CharTokenizer(), n, seed=seed, split=split)


def trained_task(cfg: RunConfig) -> dict:
    """What a saved model's ``training_state.json`` says of the task it was trained on:
    ``{"task": NAME, "task_kwargs": {...}}`` for a task run (what a server reads to refuse prompts
    of characters the task never had), ``{}`` for text."""
    if not cfg.data.task:
        return {}
    return {"task": cfg.data.task, "task_kwargs": dict(cfg.data.task_kwargs)}


def synthetic_sets(cfg: RunConfig, tokenizer=None):
    """The run's task train and held-out sets (:func:`task_split` of each split)."""
    return task_split(cfg, tokenizer, "train"), task_split(cfg, tokenizer, "test")


def text_task_sets(cfg, tokenizer):
    """The run's train and held-out :class:`TextTaskDataset` (``tokenizer`` a pretrained model's)."""
    from .data.synthetic.text_task import is_char_tokenizer

    if is_char_tokenizer(tokenizer):
        raise ValueError("text_task_sets needs a pretrained model's tokenizer, not the character vocabulary")
    return synthetic_sets(cfg, tokenizer)


def _rows_of(ds) -> dict:
    return {"ids": ds.ids, "attention_mask": ds.attention_mask, "loss_mask": ds.loss_mask}


def _micro_batches(rows: dict, rank_rows: torch.Tensor, micro: int) -> list[dict]:
    out = []
    for s in range(0, rank_rows.numel(), micro):
        sel = rank_rows[s:s + micro]
        batch = {k: v[sel] for k, v in rows.items()}
        batch["row"] = sel.clone()
        out.append(batch)
    return out


def held_out_rows(cfg: RunConfig) -> int | None:
    """Rows of the held-out set that a run evaluates: ``train.eval_batches x
    train.batch_size``, or None (all of it) when ``eval_batches`` is 0."""
    t = cfg.train
    return t.eval_batches * t.batch_size if t.eval_batches else None


def _held_out_rows(cfg: RunConfig, available: int | None, info: DistInfo) -> int:
    """Rows of the held-out set per evaluation (:func:`held_out_rows`), at most ``available``
    (-1: all, count unknown), a multiple of the world size."""
    rows = held_out_rows(cfg)
    n = rows if rows is not None else (available if available is not None else -1)
    if available is not None:
        n = min(n, available)
    return n - n % info.world_size if n >= 0 else n


def row_tokens(train) -> int | None:
    """Real tokens per row of a task's training stream from :func:`build_data` (its rows are
    padded to the longest example), or None for packed text (rows of ``data.block_len``)."""
    tensors = getattr(getattr(train, "source", None), "tensors", None)
    return int(tensors["ids"].shape[1]) if tensors is not None else None


def build_data(cfg: RunConfig, tokenizer, info: DistInfo, micro: int):
    """``(train_stream, valid_batches)``: a resumable :class:`GlobalBatches` and a list.

    The held-out set is the same rows at any world size: its first ``eval_batches x
    batch_size`` rows (all with ``eval_batches = 0``), shared out between processes (row
    ``i`` to process ``i mod w``) in micro-batches, as many on every process. Text rows hold
    ``data.block_len`` real tokens for every method. ``cyb eval`` reads the same rows
    (:func:`held_out_rows`).
    """
    d, t = cfg.data, cfg.train
    if d.task:
        train_set, valid_set = synthetic_sets(cfg, tokenizer)
        train = GlobalBatches(TensorRows(_rows_of(train_set), t.seed), t.batch_size, info, micro)
        rows = _rows_of(valid_set)
        n = _held_out_rows(cfg, rows["ids"].shape[0], info)
        if n <= 0:
            raise ValueError(f"data.num_valid_examples ({d.num_valid_examples}) is smaller than the "
                             f"number of processes ({info.world_size})")
        valid = _micro_batches(rows, torch.arange(info.rank, n, info.world_size), micro)
        return train, valid

    block_len = cfg.method.spec.context(cfg.method, d.block_len)
    train_src, valid_texts = train_texts(cfg)
    what = f"data.source ({d.source}) yields no block of {block_len} tokens (data.block_len" + \
        (" x method.seq_multiplier)" if block_len != d.block_len else ")")
    try:
        first = next(iter(PackedBlocks(train_src, tokenizer, block_len, epochs=1)), None)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    if first is None:
        raise ValueError(f"{what}: check the path and data.text_field, add documents or lower data.block_len")
    rows = TextRows(train_src, tokenizer, block_len, shuffle=resolved_shuffle(d.shuffle, d.source),
                    shuffle_buffer=d.shuffle_buffer, seed=t.seed)
    train = GlobalBatches(rows, t.batch_size, info, micro)
    valid = []
    if valid_texts is not None:
        # every method is evaluated on the same rows of data.block_len real tokens (baseline_nx
        # too: a longer evaluation context would make its perplexity incomparable)
        n = _held_out_rows(cfg, None, info)
        blocks = PackedBlocks(valid_texts, tokenizer, d.block_len, rank=info.rank,
                              world_size=info.world_size, epochs=1)
        want = n // info.world_size if n >= 0 else None
        try:
            mine = [b.to(torch.int32) for b in itertools.islice(blocks, want)]
        except ValueError:
            mine = []
        if not mine:
            where = f"data.valid_source ({d.valid_source})" if d.valid_source else \
                f"the held-out documents (data.valid_fraction = {d.valid_fraction} of data.source)"
            raise ValueError(f"{where} yield no block of {d.block_len} tokens per process; give more "
                             "held-out text (data.valid_source or a larger data.valid_fraction) or "
                             "lower data.block_len")
        ids = torch.stack(mine)
        index = torch.arange(ids.shape[0]) * info.world_size + info.rank
        valid = [{"ids": ids[s:s + micro], "row": index[s:s + micro]} for s in range(0, ids.shape[0], micro)]
    return train, valid

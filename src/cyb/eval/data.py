"""Held-out data for evaluation: which rows, in which order, as batches of real tokens.

A data specification is independent of the model, so the same rows can be given to several
models (the evaluated one and a reference) through each one's tokenizer.

* the run's own held-out data: its synthetic test set (``data.task``), else its held-out texts
  (``data.valid_source``, or the ``valid_fraction`` split of ``data.source``), packed into
  blocks of ``data.block_len`` tokens as in the run's own evaluations (``baseline_nx``
  too, although it trained on longer rows);
* ``task:NAME``: the test split of a synthetic task (the run's task sizes when it is the same
  task);
* anything else (``--data``): a text source (file, folder, glob, ``hf:NAME``; see
  :mod:`cyb.data.sources`) scored whole: its documents, each followed by the end-of-sequence
  token, after one such token that stands for the start of the first, cut into rows of
  ``block_len`` tokens that overlap by one (a row's first token is the last of the row before:
  its context, not its target) and the last row padded, so that every token of every document
  is a target exactly once, however short the file.

Rows come in a fixed order; batches are consecutive rows, the last one possibly smaller.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Iterator

from ..config import RunConfig

TASK_PREFIX = "task:"
DEFAULT_BLOCK_LEN = 256


@dataclass
class EvalData:
    """Where the evaluation rows come from.

    Attributes:
        kind: ``"synthetic"`` or ``"text"``.
        description: for humans and ``metrics.json``.
        config: the run configuration the rows follow (synthetic sets, held-out split).
        source: a text source spec (``kind == "text"`` with ``--data``), else None for the
            run's held-out texts.
        block_len: real tokens per row for text.
        max_rows: at most this many rows, the first ones (None = all).
        whole: score every token of the source's documents (rows that overlap by one token, the
            last one padded; ``--data``) rather than the blocks of the run's own evaluations.
        documents: the documents read so far (whole sources), and ``complete`` once all were.
    """

    kind: str
    description: str
    config: RunConfig
    source: str | None = None
    block_len: int = DEFAULT_BLOCK_LEN
    max_rows: int | None = None
    whole: bool = False
    documents: int = 0
    complete: bool = False

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "source": self.description}
        if self.max_rows is not None:
            out["max_rows"] = self.max_rows
        if self.kind == "text":
            out["block_len"] = self.block_len
        if self.whole:
            out.update(rows="every token of every document (rows overlap by one token, the last one padded)",
                       documents=self.documents, complete=self.complete)
        return out

    def batches(self, tokenizer, batch_size: int, *, trained_on: tuple[str, str] | None = None) -> Iterator[dict]:
        """Batches ``{"ids": [B, L]}`` (plus ``attention_mask``/``loss_mask`` for synthetic
        rows), CPU tensors, in a fixed order.  A document of ``--data`` that the model cannot
        read (:func:`cyb.data.tokenizer.check_text`; ``trained_on``: the model's synthetic task,
        :attr:`cyb.PauseModel.trained_on`) raises a ValueError naming it and its characters."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        rows = self._synthetic_batches(batch_size, tokenizer) if self.kind == "synthetic" else \
            self._text_batches(tokenizer, batch_size, trained_on)
        left = self.max_rows
        for batch in rows:
            if left is not None:
                if left <= 0:
                    return
                batch = {k: v[:left] for k, v in batch.items()}
                left -= next(iter(batch.values())).shape[0]
            yield batch

    def _synthetic_batches(self, batch_size: int, tokenizer=None) -> Iterator[dict]:
        from ..run_data import task_split

        valid = task_split(self.config, tokenizer, "test")
        rows = {"ids": valid.ids, "attention_mask": valid.attention_mask, "loss_mask": valid.loss_mask}
        n = rows["ids"].shape[0]
        for s in range(0, n, batch_size):
            yield {k: v[s:s + batch_size] for k, v in rows.items()}

    def _text_batches(self, tokenizer, batch_size: int, trained_on=None) -> Iterator[dict]:
        from ..data.packing import PackedBlocks, as_texts_factory, batches, train_valid_sources

        if tokenizer is None:
            raise ValueError("text evaluation needs the model's tokenizer, and the model folder has none")
        d = self.config.data
        if self.source is not None:
            texts = as_texts_factory(self.source, text_field=d.text_field)
        else:
            _, texts = train_valid_sources(d.source, d.valid_source, valid_fraction=d.valid_fraction,
                                           seed=self.config.train.seed, text_field=d.text_field)
            if texts is None:
                raise ValueError("the run has no held-out texts (data.valid_source is unset and "
                                 "data.valid_fraction is 0): pass --data SOURCE")
        if self.whole:
            yield from self._whole_batches(texts, tokenizer, batch_size, trained_on)
            return
        blocks = PackedBlocks(texts, tokenizer, self.block_len, epochs=1, text_field=d.text_field)
        try:
            for ids in batches(iter(blocks), batch_size, drop_last=False):
                yield {"ids": ids}
        except ValueError as e:
            if "block(s) of block_len" not in str(e):
                raise
            raise ValueError(f"{self.description}: {e}; give a smaller --block-len, or --data FILE, which scores "
                             "every token of a file however short") from None

    def _whole_batches(self, texts, tokenizer, batch_size: int, trained_on=None) -> Iterator[dict]:
        """Rows of every token of every document (see the module docstring): ``ids`` and an
        ``attention_mask`` that is 0 on the last row's padding."""
        import torch

        from ..data.tokenizer import check_text, chunked, eos_token_id, text_encoder

        eos, encode, size = eos_token_id(tokenizer), text_encoder(tokenizer), self.block_len
        self.documents, self.complete = 0, False
        stream = [eos]  # the end of a document before the first: its first token is a target too
        rows: list[list[int]] = []

        def batch(group):
            ids = torch.full((len(group), size), eos, dtype=torch.long)
            mask = torch.zeros((len(group), size), dtype=torch.long)
            for r, row in enumerate(group):
                ids[r, :len(row)] = torch.tensor(row, dtype=torch.long)
                mask[r, :len(row)] = 1
            return {"ids": ids, "attention_mask": mask}

        for docs in chunked(iter(texts()), 64):
            for i, doc in enumerate(docs, self.documents + 1):
                check_text(doc, f"document {i} of {self.description}", tokenizer=tokenizer, trained_on=trained_on)
            for ids in encode(docs):
                self.documents += 1
                stream.extend(ids)
                stream.append(eos)
            while len(stream) >= size + 1:  # a full row, and the next one's first token after it
                rows.append(stream[:size])
                stream = stream[size - 1:]
                if len(rows) == batch_size:
                    yield batch(rows)
                    rows = []
        if len(stream) > 1:  # the last row: what is left, padded
            rows.append(stream)
        if self.documents == 0:
            raise ValueError(f"--data {self.description} holds no document")
        if rows:
            yield batch(rows)
        self.complete = True


def resolve_data(config: RunConfig | None, data: str | None = None, *, block_len: int | None = None) -> EvalData:
    """The :class:`EvalData` for a run (``config``) or a bare model (``config=None``).

    Args:
        data: None for the run's own held-out data; ``task:NAME`` for a synthetic test set;
            else a text source spec.
        block_len: real tokens per text row (default: the run's, as in training, else 256).
    """
    if block_len is not None and block_len < 2:
        raise ValueError(f"block_len must be >= 2, got {block_len}")
    cfg = copy.deepcopy(config) if config is not None else RunConfig()
    if data is None:
        if config is None:
            raise ValueError("a saved model without its run folder needs --data (a text source or task:NAME)")
        if cfg.data.task:
            return EvalData("synthetic", f"held-out set of task {cfg.data.task!r} "
                            f"({cfg.data.num_valid_examples} examples)", cfg)
        return EvalData("text", f"held-out texts of the run ({cfg.data.valid_source or cfg.data.source})",
                        cfg, None, block_len or _run_block_len(cfg))
    if data.startswith(TASK_PREFIX):
        name = data[len(TASK_PREFIX):].strip()
        if not name:
            raise ValueError(f"--data {data!r}: name a synthetic task after 'task:' (e.g. task:addition)")
        if cfg.data.task != name:
            cfg.data.task_kwargs = {}
        cfg.data.task = name
        from ..data import reasoning_gym
        from ..data.synthetic import make_task

        if reasoning_gym.is_reasoning_gym(name):  # fail early on an unknown task
            reasoning_gym.check_task(name, cfg.data.task_kwargs)
        else:
            make_task(name, **cfg.data.task_kwargs)
        return EvalData("synthetic", f"test set of task {name!r} ({cfg.data.num_valid_examples} examples)", cfg)
    if config is not None and config.data.task:
        raise ValueError(f"the run was trained on synthetic task {config.data.task!r}; evaluate it with "
                         f"task:NAME or its own held-out set, not text ({data!r})")
    return EvalData("text", str(data), cfg, str(data),
                    block_len or (_run_block_len(cfg) if config is not None else DEFAULT_BLOCK_LEN), whole=True)


def _run_block_len(cfg: RunConfig) -> int:
    """Rows of ``data.block_len`` real tokens, as the run's own evaluations (``baseline_nx``
    included: it trains on longer rows but is scored on the same ones as every method)."""
    return cfg.data.block_len


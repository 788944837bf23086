"""Build a run's pieces from its configuration: device, tokenizer, model and data streams."""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

import torch

from . import runtime
from .files import replace_dir
from .config import RunConfig
from .distributed import DistInfo, main_first

TOKENIZER_DIR = "tokenizer"


def resolve_device(spec: str, info: DistInfo) -> torch.device:
    """``train.device`` for this process (``auto``: its GPU when CUDA is available, else CPU)."""
    return runtime.resolve_device(spec, local_rank=info.local_rank if info.enabled else None,
                                  what="train.device")


# ----------------------------------------------------------------------------- tokenizer


def _train_source(cfg: RunConfig):
    from .data.packing import train_valid_sources

    return train_valid_sources(cfg.data.source, cfg.data.valid_source,
                               valid_fraction=cfg.data.valid_fraction, seed=cfg.train.seed,
                               text_field=cfg.data.text_field)


def build_tokenizer(cfg: RunConfig, run_dir: Path, info: DistInfo):
    """The run's tokenizer (a Hugging Face tokenizer), saved under ``run_dir/tokenizer``.

    Synthetic tasks use the character tokenizer; text runs use ``data.tokenizer``, else the
    pretrained model's, else a byte-level BPE trained on the training documents.
    """
    from .data.tokenizer import load_tokenizer, train_bpe_tokenizer

    saved = run_dir / TOKENIZER_DIR
    if cfg.data.task:
        from .data.synthetic import CharTokenizer

        return CharTokenizer().to_hf()
    if cfg.data.tokenizer:
        return load_tokenizer(cfg.data.tokenizer)
    if cfg.model.name_or_path:
        return load_tokenizer(cfg.model.name_or_path)
    with main_first(info):
        if not (saved / "tokenizer.json").is_file() and info.is_main:
            train_texts, _ = _train_source(cfg)
            try:
                docs = list(itertools.islice(train_texts(), cfg.data.bpe_train_docs))
            except ValueError as e:
                raise ValueError(f"data.source: {e}") from None
            if not any(doc.strip() for doc in docs):
                raise ValueError(f"data.source ({cfg.data.source}) holds no text to train a tokenizer "
                                 f"on (data.text_field = {cfg.data.text_field!r}); check the path and field")
            # written beside and renamed into place: a killed run never leaves half a tokenizer
            tmp = run_dir / f"{TOKENIZER_DIR}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            train_bpe_tokenizer(docs, cfg.data.bpe_vocab_size, tmp)
            replace_dir(tmp, saved)
    return load_tokenizer(saved)


# --------------------------------------------------------------------------------- model


def hf_config_for(cfg: RunConfig, vocab_size: int, tokenizer=None):
    """A Hugging Face config for a from-scratch model of ``cfg.model.arch``."""
    from transformers import AutoConfig

    m = cfg.model
    heads = m.num_heads
    model_type = {"gemma3": "gemma3_text"}.get(m.arch, m.arch)
    kw = dict(vocab_size=vocab_size, hidden_size=m.hidden_size,
              intermediate_size=m.intermediate_size or 4 * m.hidden_size,
              num_hidden_layers=m.num_layers, num_attention_heads=heads,
              num_key_value_heads=m.num_kv_heads or heads,
              max_position_embeddings=m.max_position_embeddings,
              tie_word_embeddings=m.tie_embeddings)
    if m.arch in ("gemma", "gemma2", "gemma3", "qwen3"):
        kw["head_dim"] = m.hidden_size // heads
    if m.arch in ("gemma2", "gemma3"):
        kw["query_pre_attn_scalar"] = m.hidden_size // heads
    if m.arch == "mistral":
        kw["sliding_window"] = None
    if tokenizer is not None:
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            val = getattr(tokenizer, name, None)
            if val is not None:
                kw[name] = val
    return AutoConfig.for_model(model_type, **kw)


def build_model(cfg: RunConfig, tokenizer):
    """A :class:`~cyb.model.PauseModel` for the run's method (pretrained or from scratch)."""
    from .model import PauseModel

    me, spec = cfg.method, cfg.method.spec
    pause_kw = dict(num_steps=spec.model_steps(me.num_steps), use_dk=spec.has_dk,
                    psi_dk=me.psi_dk, method=me.name, position_scheme=spec.position_scheme(me))
    # auto: float32 parameters (bf16 autocast on GPU), also for checkpoints stored in bf16
    dtype = {"auto": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16}[cfg.model.dtype]
    try:
        if cfg.model.name_or_path:
            return PauseModel.from_pretrained(cfg.model.name_or_path, tokenizer=tokenizer,
                                              torch_dtype=dtype,
                                              attn_implementation=cfg.model.attn_implementation,
                                              reconfigure=True, **pause_kw)
        hf_config = hf_config_for(cfg, len(tokenizer), tokenizer)
        return PauseModel.from_config(hf_config, tokenizer, torch_dtype=dtype,
                                      attn_implementation=cfg.model.attn_implementation,
                                      new_rows=cfg.model.pause_init, **pause_kw)
    except ValueError as e:
        if "attention implementation" not in str(e):
            raise
        other = "eager" if cfg.model.attn_implementation == "sdpa" else "sdpa"
        raise ValueError(f"model.attn_implementation: this model does not support "
                         f"{cfg.model.attn_implementation!r} ({str(e).splitlines()[0][:160]}); "
                         f"use {other}") from None


# ---------------------------------------------------------------------------------- data


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

    def state_dict(self) -> dict:
        return dict(self._state)

    def load_state_dict(self, state: dict) -> None:
        self.source.load_state_dict(state)
        self._state = self.source.state_dict()


class TextRows:
    """Packed text blocks as rows ``{"ids": [n, L]}``, repeating over epochs; resumable."""

    def __init__(self, texts_factory, tokenizer, block_len: int, *, shuffle: str, shuffle_buffer: int,
                 seed: int, where: str = "data.source"):
        from .data.packing import PackedBlocks

        self.blocks = PackedBlocks(texts_factory, tokenizer, block_len, shuffle=shuffle,
                                   shuffle_buffer=shuffle_buffer, seed=seed, epochs=None)
        self.where = where
        self._it = None

    def take(self, n: int) -> dict:
        if self._it is None:
            self._it = iter(self.blocks)
        rows = []
        try:
            for _ in range(n):
                rows.append(next(self._it))
        except (StopIteration, ValueError) as e:
            raise ValueError(f"{self.where} yields no block of data.block_len={self.blocks.block_len} "
                             f"tokens ({e}); add documents or lower data.block_len") from None
        return {"ids": torch.stack(rows)}

    def epochs(self) -> float | None:
        """Passes over the corpus so far (None until its length is known)."""
        return self.blocks.epochs_done()

    def state_dict(self) -> dict:
        return self.blocks.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.blocks.load_state_dict(state)
        self._it = None


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

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "rows": self.n, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state.get("rows") != self.n or state.get("seed") != self.seed:
            raise ValueError("the checkpoint's data position does not match this data set (its rows "
                             "or seed differ: data.num_train_examples, data.task or train.seed changed)")
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])


def synthetic_sets(cfg: RunConfig, tokenizer=None):
    """The run's synthetic train and held-out data sets."""
    from .data.synthetic import CharTokenizer, SyntheticDataset, make_task

    task = make_task(cfg.data.task, **cfg.data.task_kwargs)
    tok = CharTokenizer()
    train = SyntheticDataset(task, tok, cfg.data.num_train_examples, seed=cfg.train.seed, split="train")
    valid = SyntheticDataset(task, tok, cfg.data.num_valid_examples, seed=cfg.train.seed + 1, split="test")
    return train, valid


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

    from .data.packing import PackedBlocks

    block_len = cfg.method.spec.context(cfg.method, d.block_len)
    train_texts, valid_texts = _train_source(cfg)
    what = f"data.source ({d.source}) yields no block of {block_len} tokens (data.block_len" + \
        (" x method.seq_multiplier)" if block_len != d.block_len else ")")
    try:
        first = next(iter(PackedBlocks(train_texts, tokenizer, block_len, epochs=1)), None)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    if first is None:
        raise ValueError(f"{what}: check the path and data.text_field, add documents or lower data.block_len")
    from .config import resolved_shuffle

    train = GlobalBatches(TextRows(train_texts, tokenizer, block_len, shuffle=resolved_shuffle(d),
                                   shuffle_buffer=d.shuffle_buffer, seed=t.seed), t.batch_size, info, micro)
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

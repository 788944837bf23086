"""The ``data`` section of a run's configuration (:class:`DataConfig`): the training and
held-out text or task, its tokenizer, blocks, order and share.  Validated with the rest of the
run by :meth:`cyb.config.RunConfig.validate`; ``cyb train --help-config`` prints each field's
docstring."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import extras
from .config_parsing import ConfigError, need, one_of


@dataclass
class DataConfig:
    source: str = "builtin:python-docs"
    """Training text: JSON lines (.jsonl/.jsonl.gz), .txt, parquet, a datasets folder, a hub
    dataset (hf:NAME), a folder, a glob, or builtin:python-docs[@train|@valid] (the Python
    standard library's documentation, a small English corpus every installation has). Ignored
    when task is set."""
    valid_source: str | None = None
    """Held-out text; None = hold out valid_fraction of the training documents."""
    text_field: str = "text"
    """Field holding the text in JSON lines / parquet / datasets sources."""
    valid_fraction: float = 0.02
    """Fraction of documents held out when valid_source is None."""
    tokenizer: str | None = None
    """Hugging Face tokenizer name/folder. None: the pretrained model's, or a byte-level BPE
    trained on the corpus (saved with the run)."""
    bpe_vocab_size: int = 4096
    """Vocabulary of the BPE trained when no tokenizer is given."""
    bpe_train_docs: int = 2000
    """Documents used to train that BPE."""
    block_len: int = 256
    """L: real tokens per training sequence (pauses come on top)."""
    shuffle: str = "auto"
    """Order of the training blocks: corpus (a seeded random order over all blocks of the
    corpus, new each epoch; holds the tokenised corpus in memory, 4 bytes per token), buffer
    (random within consecutive windows of shuffle_buffer blocks; streams), none (corpus order:
    each batch comes from a few consecutive documents, which costs small models much held-out
    perplexity) or auto (corpus for files and folders, buffer for hf: hub streams)."""
    shuffle_buffer: int = 10000
    """Blocks per shuffle window when data.shuffle is buffer (>= 2)."""
    task: str | None = None
    """A synthetic task instead of text: addition, multiplication, 3sum, parity or lookup
    (data.task_kwargs sets its size), or reasoning-gym:NAME, a generator of the reasoning-gym
    package (the reasoning extra) written as text: question as the prompt, answer as the
    completion; it needs a pretrained model's tokenizer or data.tokenizer."""
    task_kwargs: dict = field(default_factory=dict)
    """Size parameters of the synthetic task (e.g. {digits: 4}), or a reasoning-gym
    generator's own settings (e.g. {min_terms: 2, max_terms: 4} for chain_sum)."""
    num_train_examples: int = 20000
    """Synthetic task: training examples."""
    num_valid_examples: int = 500
    """Synthetic task: held-out examples."""
    fraction: float = 1.0
    """Share of the training text to train on, in (0, 1]: documents in a seeded random order
    (data.fraction_seed) are taken until they hold this share of its characters, then read in
    their own order (and shuffled as data.shuffle says). At one seed a smaller share's documents
    are all in every larger share; the held-out text (data.valid_source, or the data.valid_fraction
    split, made first) is the same at every share. Sizing the share reads the training text once
    more (a hub stream: all of it). Text only: a task's training set is data.num_train_examples."""
    fraction_seed: int | None = None
    """Seed of data.fraction's choice of documents; None = train.seed."""


def validate_data(d: DataConfig) -> None:
    """Raise :class:`ConfigError` naming the first bad field of the ``data`` section."""
    if d.task is None:
        need(bool(d.source.strip()), "data.source", "must name the training text (or set data.task)")
    else:
        from .data import reasoning_gym  # the data layer (below this one) knows the tasks and sizes
        from .data.synthetic import make_task

        try:
            if reasoning_gym.is_reasoning_gym(d.task):
                reasoning_gym.check_task(d.task, d.task_kwargs)
            else:
                make_task(d.task, **d.task_kwargs)
        except extras.MissingPackage as e:
            raise ConfigError(f"data.task ({d.task}): {e}") from None
        except (ValueError, TypeError) as e:
            raise ConfigError(f"data.task / data.task_kwargs: {e}") from None
    need(d.block_len >= 2, "data.block_len", f"must be >= 2, got {d.block_len}")
    need(0.0 <= d.valid_fraction < 1.0, "data.valid_fraction", f"must lie in [0, 1), got {d.valid_fraction}")
    need(d.bpe_vocab_size >= 64, "data.bpe_vocab_size", f"must be >= 64, got {d.bpe_vocab_size}")
    need(d.bpe_train_docs >= 1, "data.bpe_train_docs", f"must be >= 1, got {d.bpe_train_docs}")
    one_of(d.shuffle, ("auto", "corpus", "buffer", "none"), "data.shuffle")
    need(d.shuffle_buffer >= 2, "data.shuffle_buffer", f"must be >= 2 blocks, got {d.shuffle_buffer}")
    need(d.num_train_examples >= 1, "data.num_train_examples", f"must be >= 1, got {d.num_train_examples}")
    need(d.num_valid_examples >= 1, "data.num_valid_examples", f"must be >= 1, got {d.num_valid_examples}")
    need(math.isfinite(d.fraction) and 0.0 < d.fraction <= 1.0, "data.fraction",
         f"must lie in (0, 1] (the share of the training text), got {d.fraction}")
    need(d.task is None or d.fraction == 1.0, "data.fraction",
         f"selects documents of training text; a task's training set is data.num_train_examples "
         f"(set data.fraction = 1), got {d.fraction}")


__all__ = ["DataConfig", "validate_data"]

"""Offline task definitions for lm-evaluation-harness, and the loader they share.

The folder holding this file is an lm-evaluation-harness ``--include_path``: its sub-folders hold
task YAMLs that read local JSON files instead of downloading from the hub.

* ``hellaswag_local`` (10-shot), the ``mmlu_local`` group (5-shot, 57 subjects in four category
  groups, ``mmlu_local_<subject>`` each), ``gsm8k_cot_local`` (8-shot chain of thought): prompts,
  choices, metrics and filters as the harness's ``hellaswag``, ``mmlu`` and ``gsm8k_cot`` tasks.
  They read ``<data dir>/<benchmark>/<split>.jsonl`` (or ``.json``) with the hub datasets'
  fields; the data dir is the task metadata ``data_dir`` (``--metadata '{"data_dir": ...}'``)
  or else the environment variable :data:`DATA_ENV`.
* ``cyb_tiny_mc``, ``cyb_tiny_gen``, ``cyb_tiny_ppl``: a handful of examples shipped here (for
  smoke tests): multiple choice, generation until a stop string, and rolling perplexity.

Expected files (see ``docs/how-to/downstream.md``)::

    $CYB_EVAL_DATA/hellaswag/train.jsonl       ctx_a ctx_b activity_label endings label
    $CYB_EVAL_DATA/hellaswag/validation.jsonl
    $CYB_EVAL_DATA/mmlu/dev.jsonl              question subject choices answer
    $CYB_EVAL_DATA/mmlu/test.jsonl
    $CYB_EVAL_DATA/gsm8k/test.jsonl            question answer
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Sequence

#: Environment variable naming the folder with the benchmark files (when the task metadata has
#: no ``data_dir``).
DATA_ENV = "CYB_EVAL_DATA"
#: Benchmarks the local tasks read, and the splits each task needs.
BENCHMARK_SPLITS = {
    "hellaswag": ("train", "validation"),
    "mmlu": ("dev", "test"),
    "gsm8k": ("test",),
}
_SUFFIXES = (".jsonl", ".json")
_TINY_DATA = Path(__file__).resolve().parent / "tiny" / "data"


def tasks_dir() -> Path:
    """The folder to pass to lm-evaluation-harness as ``--include_path`` (``include_path=``)."""
    return Path(__file__).resolve().parent


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The folder with the benchmark files: ``data_dir`` if given, else ``$CYB_EVAL_DATA``.

    Raises:
        ValueError: neither is set, or the folder does not exist.
    """
    chosen = data_dir if data_dir not in (None, "") else os.environ.get(DATA_ENV)
    if not chosen:
        raise ValueError(
            f"no data folder for the local benchmark tasks: set the environment variable {DATA_ENV} "
            "or pass the task metadata data_dir (lm_eval --metadata '{\"data_dir\": \"/path\"}', "
            "or TaskManager(include_path=..., metadata={\"data_dir\": \"/path\"}))"
        )
    path = Path(chosen).expanduser()
    if not path.is_dir():
        raise ValueError(f"data_dir {str(path)!r} (from {'data_dir' if data_dir else DATA_ENV}) "
                         "is not a folder")
    return path


def split_file(folder: Path, split: str) -> Path:
    """``folder/<split>.jsonl`` or ``folder/<split>.json``, whichever exists.

    Raises:
        FileNotFoundError: neither exists (the message names both).
    """
    for suffix in _SUFFIXES:
        path = folder / f"{split}{suffix}"
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"missing {folder / (split + '.jsonl')} (or .json): the local tasks need the {split!r} split "
        f"of {folder.name} there, one JSON object per line (see docs/how-to/downstream.md)"
    )


def read_records(path: str | os.PathLike) -> list[dict]:
    """Rows of a JSON-lines file, or of a file holding one JSON array of objects."""
    path = Path(path)
    return list(_read_cached(str(path.resolve()), path.stat().st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, _mtime: int) -> tuple[dict, ...]:
    text = Path(path).read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        rows = json.loads(text)
    else:
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}, line {number}: not valid JSON ({e})") from None
    if not rows:
        raise ValueError(f"{path} holds no records")
    if not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: every record must be a JSON object")
    return tuple(rows)


def _dataset_dict(records_by_split: dict[str, list[dict]]):
    import datasets

    return datasets.DatasetDict(
        {split: datasets.Dataset.from_list(rows) for split, rows in records_by_split.items()})


def load_local(local_name: str, splits: Sequence[str] | None = None, subject: str | None = None,
               data_dir: str | None = None, **_metadata):
    """A ``datasets.DatasetDict`` of a benchmark's splits read from the local data folder.

    This is the tasks' ``custom_dataset``: lm-evaluation-harness calls it with the task's
    metadata and ``dataset_kwargs`` as keywords (other keys are ignored).

    Args:
        local_name: the benchmark's sub-folder (``hellaswag``, ``mmlu``, ``gsm8k``).
        splits: the splits to read (default: :data:`BENCHMARK_SPLITS` of the benchmark).
        subject: keep only records whose ``subject`` field equals it (MMLU).
        data_dir: the data folder (default ``$CYB_EVAL_DATA``).
    """
    if splits is None:
        if local_name not in BENCHMARK_SPLITS:
            raise ValueError(f"local_name must be one of {sorted(BENCHMARK_SPLITS)} when splits is not "
                             f"given, got {local_name!r}")
        splits = BENCHMARK_SPLITS[local_name]
    folder = resolve_data_dir(data_dir) / local_name
    out = {}
    for split in splits:
        path = split_file(folder, split)
        rows = read_records(path)
        if subject is not None:
            if "subject" not in rows[0]:
                raise ValueError(f"{path}: records need a 'subject' field (one file for all subjects)")
            rows = [r for r in rows if r.get("subject") == subject]
            if not rows:
                raise ValueError(f"{path} has no record with subject {subject!r}")
        out[split] = rows
    return _dataset_dict(out)


def load_tiny(tiny_name: str, splits: Sequence[str] = ("test",), **_metadata):
    """A ``datasets.DatasetDict`` of one of the tiny shipped tasks (``tiny/data/<name>_<split>.jsonl``)."""
    return _dataset_dict({split: read_records(_TINY_DATA / f"{tiny_name}_{split}.jsonl")
                          for split in splits})

"""Stream the text of documents from files, folders, globs and Hugging Face data sets.

One entry point, :func:`iter_texts`, picks a reader by what ``spec`` is:

=======================================  ===================================================
``spec``                                 read as
=======================================  ===================================================
``*.jsonl``, ``*.json``, ``*.ndjson``    JSON lines (C4 layout), one document per line;
(each optionally ``.gz``)                the text is the field ``text_field``
``*.txt`` (optionally ``.gz``)           one document per file, or one per blank-line
                                         separated paragraph with ``paragraphs=True``
``*.parquet``                            the column ``text_field`` (needs ``pyarrow``)
a folder written by ``save_to_disk``     a ``datasets`` Dataset / DatasetDict (needs
                                         ``datasets``)
any other folder                         every supported file below it, in sorted order
                                         (bare ``.json`` files excepted: mostly metadata)
a glob (``data/*.jsonl.gz``)             every supported file it matches, in sorted order
``hf:NAME[:CONFIG][@SPLIT]``             ``datasets.load_dataset(NAME, CONFIG, split=...,
                                         streaming=True)`` (needs the hub to be reachable)
``builtin:python-docs[@train|@valid]``   a small English corpus every user has: the
                                         documentation of the Python standard library
                                         installed with the interpreter (see below)
=======================================  ===================================================

Everything streams: at most one document (one record batch for parquet) is in memory at a time
(``builtin:`` corpora excepted: a few MB, read once per process). Empty documents are skipped. A
source that yields no document at all raises ``ValueError``.

``builtin:python-docs`` needs no download and has no licence question beyond the interpreter's
own (PSF): its documents are the docstrings of the standard library's modules, classes,
functions and methods, each headed by its dotted name (``json.dumps``, then the docstring), and
the reference topics of ``pydoc_data`` (what ``help("assert")`` shows).  A fresh
``python -I -S`` (the standard library alone: no site-packages, nothing from the working
folder) imports every module it can, skipping those with side effects (``antigravity``,
``this``, ``idlelib``, ``tkinter``, ``turtle``, ``readline``...), test packages, private and
``__main__`` modules and the codecs of ``encodings``; the order is fixed (modules, then
attributes, by name) and each docstring is kept once.  The corpus is the same on every run with
one Python build; other Python versions give slightly different ones.  ``@valid`` holds about
5% of the documents, picked by a hash of their text, and ``@train`` the rest; without a split
the source yields all of them.  With Python 3.11.7 it holds 6,051 documents (5,781 + 270), 1.9
MB of text (about 700,000 tokens of a 2,048-id BPE), read in under half a second.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import glob as _glob
import gzip
import inspect
import io
import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HUB_PREFIX = "hf:"
BUILTIN_PREFIX = "builtin:"
#: The built-in corpora, by name.
BUILTIN_CORPORA = ("python-docs",)
BUILTIN_SPLITS = ("train", "valid")
#: Share of a built-in corpus's documents in its ``@valid`` split.
BUILTIN_VALID_FRACTION = 0.05
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
TEXT_SUFFIXES = (".txt",)
PARQUET_SUFFIXES = (".parquet",)
_GLOB_CHARS = re.compile(r"[*?\[]")


class MissingFieldError(KeyError, ValueError):
    """A record without the text field: a ValueError (bad input, one line on the command line)
    that is also a KeyError."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _no_field(where: str, text_field: str, found) -> MissingFieldError:
    return MissingFieldError(f"{where}: no field {text_field!r} (data.text_field), found {found}; set "
                             "data.text_field to the field that holds the text")


def _format_of(path: Path) -> str | None:
    """``"jsonl"``, ``"txt"``, ``"parquet"`` or None for a file name we do not read."""
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
        if name.endswith(PARQUET_SUFFIXES):
            return None  # parquet compresses internally; a gzipped parquet file is not a format
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(TEXT_SUFFIXES):
        return "txt"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    return None


def not_utf8(path: str | Path, error: UnicodeDecodeError) -> ValueError:
    """The one-line error for a file that is not UTF-8 text, naming it and the first bad byte."""
    return ValueError(f"{path} is not UTF-8 text (byte 0x{error.object[error.start]:02x}: {error.reason})")


def read_utf8(path: str | Path, name: str | None = None) -> str:
    """The text of the file ``path``; a file that is not UTF-8 text raises :func:`not_utf8`'s
    ValueError, naming it as ``name`` (default: the path; ``"--file prompts.txt"``, say)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise not_utf8(path if name is None else name, e) from None


def _open_text(path: Path) -> io.TextIOBase:
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _read_jsonl(path: Path, text_field: str) -> Iterator[str]:
    with _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON line ({e.msg})") from None
            if not isinstance(record, dict) or text_field not in record:
                keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise _no_field(f"{path}:{lineno}", text_field, keys)
            text = record[text_field]
            if not isinstance(text, str):
                raise TypeError(
                    f"{path}:{lineno}: field {text_field!r} must hold a string, "
                    f"got {type(text).__name__}"
                )
            yield text


def _read_txt(path: Path, paragraphs: bool) -> Iterator[str]:
    with _open_text(path) as f:
        if not paragraphs:
            yield f.read()
            return
        lines: list[str] = []
        for line in f:
            if line.strip():
                lines.append(line)
            elif lines:
                yield "".join(lines).rstrip("\n")
                lines = []
        if lines:
            yield "".join(lines).rstrip("\n")


def _import(module: str, what: str) -> Any:
    from ..extras import require

    return require(module, f"reading {what}")


def _read_parquet(path: Path, text_field: str, batch_rows: int = 1024) -> Iterator[str]:
    pq = _import("pyarrow.parquet", "parquet files")
    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    if text_field not in names:
        raise _no_field(str(path), text_field, names)
    for batch in pf.iter_batches(batch_size=batch_rows, columns=[text_field]):
        for text in batch.column(0).to_pylist():
            if text is not None:
                yield text


def _is_saved_dataset(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    )


def _iter_hf_dataset(
    ds: Any, text_field: str, where: str, batch_rows: int = 1024
) -> Iterator[str]:
    columns = ds.column_names
    if columns is not None and text_field not in columns:
        raise _no_field(where, text_field, columns)
    if hasattr(ds, "select_columns") and columns is not None:
        ds = ds.select_columns([text_field])
    for batch in ds.iter(batch_size=batch_rows):
        for text in batch[text_field]:
            if text is not None:
                yield text


def _pick_split(dsd: Any, split: str | None, where: str) -> Any:
    names = list(dsd.keys())
    if split is None:
        if "train" in names:
            split = "train"
        elif len(names) == 1:
            split = names[0]
        else:
            raise ValueError(f"{where} holds splits {names}; pass split= one of them")
    if split not in names:
        raise ValueError(f"{where}: split={split!r} not found; available: {names}")
    return dsd[split]


def _read_saved_dataset(path: Path, text_field: str, split: str | None) -> Iterator[str]:
    datasets = _import("datasets", "a saved Hugging Face data set")
    ds = datasets.load_from_disk(str(path))
    if hasattr(ds, "keys"):  # a DatasetDict
        ds = _pick_split(ds, split, str(path))
    elif split is not None and ds.split is not None and str(ds.split) != split:
        raise ValueError(f"{path} holds split {str(ds.split)!r}, not split={split!r}")
    yield from _iter_hf_dataset(ds, text_field, str(path))


@contextlib.contextmanager
def _quiet_hub_logs():
    """No warning per failed request from the hub client while a data set opens (the error that
    follows says what went wrong, once)."""
    import logging

    loggers = [logging.getLogger(name) for name in ("huggingface_hub", "datasets")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def _read_hub(spec: str, text_field: str, split: str | None) -> Iterator[str]:
    body, _, at_split = spec[len(HUB_PREFIX):].partition("@")
    split = at_split or split
    name, _, config = body.partition(":")
    if not name:
        raise ValueError(f"hub spec {spec!r} names no data set; write hf:NAME[:CONFIG][@SPLIT]")
    datasets = _import("datasets", "a hub data set (hf:)")
    records = iter(())
    try:
        with _quiet_hub_logs():
            ds = datasets.load_dataset(name, config or None, split=split or "train", streaming=True)
            records = iter(ds)
            first = next(records, None)
    except (OSError, ValueError, RuntimeError) as e:  # no network (ConnectionError), no such set...
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{spec}: the hub data set cannot be opened ({reason}); hf: sources stream from "
                         "the Hugging Face hub, which must be reachable: without a network, write the data "
                         "set to files where there is one (save_to_disk, or JSON lines) and point the "
                         "source at them") from None
    for record in itertools.chain([first] if first is not None else [], records):
        if text_field not in record:
            raise _no_field(spec, text_field, sorted(record))
        text = record[text_field]
        if text is not None:
            yield text


def _matches_split(path: Path, split: str) -> bool:
    """True if ``split`` is one of the words of the file name (``c4-train.00001.json.gz``)."""
    return split.lower() in re.split(r"[^0-9a-zA-Z]+", path.name.lower())


def list_files(spec: str | Path, split: str | None = None) -> list[Path]:
    """The readable files a path, folder or glob stands for, sorted; filtered by ``split``.

    With ``split`` set, only files with ``split`` as a word of their name are kept
    (``train.jsonl.gz`` and ``c4-train.00000-of-01024.json.gz`` for ``split="train"``).
    Raises FileNotFoundError when nothing readable is found.
    """
    s = str(spec)
    path = Path(s).expanduser()
    if path.is_file():
        if _format_of(path) is None:
            raise ValueError(
                f"unknown format of {path}: expected .jsonl/.json/.ndjson[.gz], .txt[.gz] "
                "or .parquet"
            )
        found = [path]
    elif path.is_dir():
        # bare .json files in a folder are mostly metadata (config.json, dataset_info.json)
        found = sorted(
            p for p in path.rglob("*")
            if p.is_file() and _format_of(p) is not None and not p.name.lower().endswith(".json")
        )
    elif _GLOB_CHARS.search(s):
        found = sorted(
            Path(p) for p in _glob.glob(str(path), recursive=True)
            if Path(p).is_file() and _format_of(Path(p)) is not None
        )
    else:
        raise FileNotFoundError(
            f"data source {s!r} does not exist (for a hub data set write {HUB_PREFIX}NAME)"
        )
    if split is not None:
        found = [p for p in found if _matches_split(p, split)]
    if not found:
        which = f" for split={split!r}" if split is not None else ""
        raise FileNotFoundError(
            f"no readable files{which} in {s!r} (looked for .jsonl/.json/.ndjson[.gz], "
            ".txt[.gz], .parquet)"
        )
    return found


# ------------------------------------------------------------------ built-in corpora


def _python_docs_walk() -> list[list[str]]:
    """``[[name, docstring], ...]`` of the standard library.  Runs in a fresh ``python -I -S``
    (see :func:`_python_docs`); it imports modules, so do not call it in a process you care about."""
    import importlib
    import inspect
    import io
    import pkgutil
    import sys
    import warnings

    skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "lib2to3",
            "distutils", "readline", "rlcompleter", "ensurepip", "pydoc_data", "encodings", "venv",
            "site", "sitecustomize", "usercustomize"}

    def wanted(name: str) -> bool:
        parts = name.split(".")
        return parts[0] not in skip and not any(
            p.startswith("_") or p in ("test", "tests", "idle_test") or p.startswith("test_") for p in parts)

    real_out, real_err = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = io.StringIO()  # a module that prints on import prints nowhere
    modules: dict = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            queue = sorted(n for n in sys.stdlib_module_names if wanted(n))
            while queue:
                name = queue.pop(0)
                if name in modules:
                    continue
                try:
                    mod = importlib.import_module(name)
                except (Exception, SystemExit):
                    continue  # not built here (tkinter, curses, Windows modules...) or broken
                modules[name] = mod
                if hasattr(mod, "__path__"):
                    try:
                        subs = sorted(f"{name}.{m.name}" for m in pkgutil.iter_modules(mod.__path__))
                    except Exception:
                        subs = []
                    queue.extend(sub for sub in subs if wanted(sub))
    finally:
        sys.stdout, sys.stderr = real_out, real_err

    docs: list[list[str]] = []
    seen_objects: set = set()
    seen_texts: set = set()

    def add(name: str, obj) -> None:
        if id(obj) in seen_objects:
            return
        seen_objects.add(id(obj))
        doc = getattr(obj, "__doc__", None)
        text = inspect.cleandoc(doc).strip() if isinstance(doc, str) else ""
        if len(text.split()) >= 2 and text not in seen_texts:  # not "Eq" (the ast node classes)
            seen_texts.add(text)
            docs.append([name, text])

    for name in sorted(modules):
        mod = modules[name]
        add(name, mod)
        members = vars(mod)
        for attr in sorted(members):
            obj = members[attr]
            if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
                continue
            owner = getattr(obj, "__module__", None)
            if owner != name and owner in modules:
                continue  # documented with the module that defines it
            add(f"{name}.{attr}", obj)
            if inspect.isclass(obj):
                for member in sorted(vars(obj)):
                    if member.startswith("_") and member != "__init__":
                        continue
                    value = vars(obj)[member]
                    if isinstance(value, (staticmethod, classmethod)):
                        value = value.__func__
                    if inspect.isroutine(value) or inspect.isdatadescriptor(value):
                        add(f"{name}.{attr}.{member}", value)
    try:
        from pydoc_data.topics import topics
    except ImportError:
        topics = {}
    for key in sorted(topics):
        text = topics[key].strip()
        if text and text not in seen_texts:
            seen_texts.add(text)
            docs.append([f"topic {key}", text])
    return docs


@functools.lru_cache(maxsize=1)
def _python_docs() -> tuple[str, ...]:
    """The documents of ``builtin:python-docs``, read once per process."""
    code = ("import sys; sys.path = [p for p in sys.path if p]\n"  # nothing from the working folder
            + inspect.getsource(_python_docs_walk)
            + "\nimport json\nsys.stdout.write(json.dumps(_python_docs_walk()))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONHASHSEED"] = "0"
    done = subprocess.run([sys.executable, "-S", "-s", "-B", "-X", "utf8", "-c", code], env=env,
                          capture_output=True, text=True, encoding="utf-8", timeout=600)
    if done.returncode != 0:
        tail = (done.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"reading the Python documentation for builtin:python-docs failed: {tail[0]}")
    return tuple(f"{name}\n\n{text}" for name, text in json.loads(done.stdout))


def _builtin_split(text: str) -> str:
    score = int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8,
                                           person=b"cyb-split").digest(), "little") / 2.0**64
    return "valid" if score < BUILTIN_VALID_FRACTION else "train"


def _parse_builtin(spec: str, split: str | None) -> tuple[str, str | None]:
    """``(corpus name, split or None)`` of ``builtin:NAME[@SPLIT]``; ValueError when unknown."""
    name, _, at_split = spec[len(BUILTIN_PREFIX):].partition("@")
    split = at_split or split
    if name not in BUILTIN_CORPORA:
        raise ValueError(f"unknown built-in corpus {spec!r}: the built-in corpora are "
                         + ", ".join(f"{BUILTIN_PREFIX}{n}" for n in BUILTIN_CORPORA))
    if split is not None and split not in BUILTIN_SPLITS:
        raise ValueError(f"{spec!r}: split must be one of {BUILTIN_SPLITS} (@train, @valid), got {split!r}")
    return name, split


def _read_builtin(spec: str, split: str | None) -> Iterator[str]:
    _, split = _parse_builtin(spec, split)
    for text in _python_docs():
        if split is None or _builtin_split(text) == split:
            yield text


def _iter_raw(
    spec: str | Path, text_field: str, split: str | None, paragraphs: bool
) -> Iterator[str]:
    s = str(spec)
    if s.startswith(BUILTIN_PREFIX):
        yield from _read_builtin(s, split)
        return
    if s.startswith(HUB_PREFIX):
        yield from _read_hub(s, text_field, split)
        return
    path = Path(s).expanduser()
    if path.is_dir() and _is_saved_dataset(path):
        yield from _read_saved_dataset(path, text_field, split)
        return
    for f in list_files(s, split):
        kind = _format_of(f)
        try:
            if kind == "jsonl":
                yield from _read_jsonl(f, text_field)
            elif kind == "txt":
                yield from _read_txt(f, paragraphs)
            else:
                yield from _read_parquet(f, text_field)
        except UnicodeDecodeError as e:
            raise not_utf8(f, e) from None


def iter_texts(
    spec: str | Path,
    *,
    text_field: str = "text",
    split: str | None = None,
    paragraphs: bool = False,
) -> Iterator[str]:
    """Yield the text of every document of ``spec``, in a fixed order, one at a time.

    Args:
        spec: a file, folder, glob, saved ``datasets`` folder, ``hf:NAME[:CONFIG][@SPLIT]`` or
            ``builtin:python-docs[@SPLIT]`` (see the module docstring for how each is read).
        text_field: the JSON field / parquet or data set column that holds the text.
        split: for a hub data set the split to stream (default ``"train"``); for a saved
            DatasetDict the split to read (default ``"train"``, or the only one); for a built-in
            corpus ``"train"`` or ``"valid"`` (default: all documents); for files,
            folders and globs only files with ``split`` as a word of their name are read.
        paragraphs: for ``.txt`` files, one document per blank-line separated paragraph
            instead of one per file.

    Raises:
        FileNotFoundError: ``spec`` does not exist or holds no readable file.
        ValueError: unknown file format, or the source holds no non-empty document.
        MissingFieldError: a record lacks ``text_field`` (a ValueError and a KeyError).
        ImportError: the reader needs ``pyarrow`` / ``datasets`` and it is not installed.
    """
    count = 0
    for text in _iter_raw(spec, text_field, split, paragraphs):
        if text:
            count += 1
            yield text
    if count == 0:
        raise ValueError(f"data source {str(spec)!r} holds no non-empty document")


def text_source(
    spec: str | Path,
    *,
    text_field: str = "text",
    split: str | None = None,
    paragraphs: bool = False,
) -> Callable[[], Iterator[str]]:
    """A factory that starts :func:`iter_texts` afresh at each call (what packing re-reads).

    Checks at once that a local ``spec`` exists, so a typo fails before training starts.
    """
    if str(spec).startswith(BUILTIN_PREFIX):
        _parse_builtin(str(spec), split)
    elif not str(spec).startswith(HUB_PREFIX):
        path = Path(str(spec)).expanduser()
        if not (path.is_dir() and _is_saved_dataset(path)):
            list_files(spec, split)
    return functools.partial(
        iter_texts, spec, text_field=text_field, split=split, paragraphs=paragraphs
    )

"""Build a run's pieces from its configuration: device, tokenizer and model (the data streams are
:mod:`cyb.run_data`)."""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

import torch

from . import families, paths, runtime
from .config import RunConfig
from .distributed import DistInfo, main_first
from .files import replace_dir
from .run_data import train_texts

TOKENIZER_DIR = "tokenizer"


def resolve_device(spec: str, info: DistInfo) -> torch.device:
    """``train.device`` for this process (``auto``: its GPU when CUDA is available, else CPU)."""
    return runtime.resolve_device(spec, local_rank=info.local_rank if info.enabled else None,
                                  what="train.device")


# ----------------------------------------------------------------------------- tokenizer


def build_tokenizer(cfg: RunConfig, run_dir: Path, info: DistInfo):
    """The run's tokenizer (a Hugging Face tokenizer), saved under ``run_dir/tokenizer``.

    Synthetic tasks use the character tokenizer, or a pretrained model's own
    (:func:`task_tokenizer`); a reasoning-gym task without either a byte-level BPE trained on
    its own training questions and answers; text runs use ``data.tokenizer``, else the
    pretrained model's, else a byte-level BPE trained on the training documents.
    """
    from .data.tokenizer import load_tokenizer

    saved = run_dir / TOKENIZER_DIR
    if cfg.data.task and own_task_bpe(cfg):  # questions as text, written with a vocabulary of their own
        from .data import reasoning_gym

        def questions():
            n = min(cfg.data.bpe_train_docs, cfg.data.num_train_examples)
            entries = reasoning_gym.draw_entries(cfg.data.task, cfg.data.task_kwargs, n, cfg.train.seed, "train")
            return [reasoning_gym.prompt_of(e) + reasoning_gym.completion_of(e) for e in entries]

        return _saved_bpe(cfg, saved, info, questions, f"the questions of data.task ({cfg.data.task})")
    if cfg.data.task:  # characters, or the pretrained model's tokenizer (tasks as text)
        return task_tokenizer(cfg)
    if cfg.data.tokenizer:
        return covering(_named(load_tokenizer, cfg.data.tokenizer, "data.tokenizer"), cfg, "data.tokenizer")
    if cfg.model.name_or_path:
        from .model.sources import resolve_model_source  # a .gguf file, a short name, a run: its folder

        tok = _named(lambda name: load_tokenizer(resolve_model_source(name)), cfg.model.name_or_path,
                     "model.name_or_path")
        return covering(tok, cfg, "model.name_or_path")

    def documents():
        texts, _ = train_texts(cfg)
        try:
            return list(itertools.islice(texts(), cfg.data.bpe_train_docs))
        except ValueError as e:
            raise ValueError(f"data.source: {e}") from None

    return _saved_bpe(cfg, saved, info, documents, f"data.source ({cfg.data.source}, data.text_field = "
                                                   f"{cfg.data.text_field!r})")


def own_task_bpe(cfg: RunConfig) -> bool:
    """Whether the run trains a BPE of its own on its task's text: a reasoning-gym task (its
    questions are text, beyond the characters of the synthetic tasks) from scratch, with neither
    ``data.tokenizer`` nor ``model.name_or_path``."""
    from .data import reasoning_gym

    return reasoning_gym.is_reasoning_gym(cfg.data.task) and not (cfg.data.tokenizer or cfg.model.name_or_path)


def _saved_bpe(cfg: RunConfig, saved: Path, info: DistInfo, docs, what: str):
    """The byte-level BPE in ``saved`` (the run folder's ``tokenizer/``), trained first on
    ``docs()`` (``data.bpe_vocab_size``) by the first process when it is not there yet."""
    from .data.tokenizer import load_tokenizer, train_bpe_tokenizer

    with main_first(info):
        if not (saved / "tokenizer.json").is_file() and info.is_main:
            texts = docs()
            if not any(doc.strip() for doc in texts):
                raise ValueError(f"{what} holds no text to train a tokenizer on; check the path and field")
            # written beside and renamed into place: a killed run never leaves half a tokenizer
            tmp = saved.parent / f"{saved.name}.tmp-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            train_bpe_tokenizer(texts, cfg.data.bpe_vocab_size, tmp)
            replace_dir(tmp, saved)
    return load_tokenizer(saved)


#: Documents of the training text that a given tokenizer must encode before a run starts.
SAMPLE_DOCS = 32
#: The share of unknown tokens in them above which the tokenizer does not fit the text.
MAX_UNKNOWN = 0.05


def covering(tokenizer, cfg: RunConfig, field: str):
    """``tokenizer`` (of ``field``), once it encodes the first documents of the run's text with
    few unknown tokens; ValueError in one line saying what does not fit otherwise (a model with the
    character vocabulary of a synthetic task given text, say)."""
    from .data.tokenizer import UnencodableText, encode_texts

    texts, _ = train_texts(cfg)
    try:
        docs = [doc for doc in itertools.islice(texts(), SAMPLE_DOCS) if doc.strip()]
    except (FileNotFoundError, ValueError):  # said where the data is read
        return tokenizer
    name = cfg.data.tokenizer if field == "data.tokenizer" else cfg.model.name_or_path
    size = len(tokenizer)
    what = (f"{field} ({name}) has a character vocabulary of {size} tokens (a model of a synthetic task: "
            "fine-tune it on its task, data.task)" if size < 256 else f"{field} ({name}) has a tokenizer of {size} tokens")
    try:
        ids = [i for row in encode_texts(tokenizer, docs) for i in row]
    except UnencodableText as e:
        raise ValueError(f"{what}, which cannot encode the text of data.source ({cfg.data.source}): {e.reason}") from None
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None and ids:
        share = sum(i == unk for i in ids) / len(ids)
        if share > MAX_UNKNOWN:
            raise ValueError(f"{what}, which does not fit the text of data.source ({cfg.data.source}): {share:.0%} "
                             f"of the tokens of its first {len(docs)} documents are unknown to it")
    return tokenizer


# ------------------------------------------------------------------------- names and paths


def _missing_path(name: str, field: str) -> FileNotFoundError | None:
    """The error for a ``field`` that can only be a local path (:func:`cyb.paths.looks_like_path`)
    and does not exist; None for one that exists or may be a hub id."""
    if os.path.exists(os.path.expanduser(name)) or not paths.looks_like_path(name):
        return None
    return FileNotFoundError(f"{field} ({name}) does not exist: give the folder of a saved model or "
                             "tokenizer, or a hub id (ORG/NAME)")


def _named(load, name: str, field: str):
    """``load(name)``, with a missing folder or a hub id that cannot be loaded said in one line
    naming ``field``."""
    problem = _missing_path(name, field)
    if problem is not None:
        raise problem
    try:
        return load(name)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{field} ({name}): {e}") from None
    except OSError as e:  # a hub id: not in the local cache, or the hub not reachable
        if os.path.exists(os.path.expanduser(name)):
            raise
        cause = e.__cause__ if isinstance(e.__cause__, Exception) else e  # not our loader's advice
        reason = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        raise ValueError(f"{field} ({name}) is not a local folder, and as a hub id it cannot be loaded "
                         f"({reason[:200]}); give the folder of a saved model, or a hub id whose files "
                         "are in the local cache") from None


def check_paths(cfg: RunConfig) -> list[str]:
    """Check that the data sources, tokenizer and model a run names exist (``cyb train --check``).

    Raises FileNotFoundError or ValueError naming the field of the first that does not, or
    :class:`~cyb.extras.MissingPackage` when reading one needs a package that is not installed.
    Returns notes on what can only be checked when the run starts: hub ids (``ORG/NAME`` that is
    no local folder) and ``hf:`` data sets, which need the hub or its local cache.
    """
    from . import extras
    from .data.sources import HUB_PREFIX, text_source

    notes = []
    d = cfg.data
    if not d.task:
        for field, spec in (("data.source", d.source), ("data.valid_source", d.valid_source)):
            if spec is None:
                continue
            if spec.startswith(HUB_PREFIX):
                extras.require("datasets", f"{field} ({spec})")
                notes.append(f"{field} ({spec}) streams from the Hugging Face hub, which must be reachable "
                             "when the run starts")
                continue
            try:
                text_source(spec)  # a local source exists, a built-in one is known
            except (FileNotFoundError, ValueError) as e:
                raise type(e)(f"{field}: {e}") from None
    for field, name in (("model.name_or_path", cfg.model.name_or_path), ("data.tokenizer", d.tokenizer)):
        if not name:
            continue
        problem = _missing_path(name, field)
        if problem is not None:
            raise problem
        if os.path.exists(os.path.expanduser(name)):
            continue
        if field == "model.name_or_path":
            from .model import zoo
            from .model.cache import is_complete, is_gguf

            if is_gguf(name):
                raise FileNotFoundError(f"{field} ({name}): the GGUF file does not exist")
            known = zoo.find(name)
            if known is not None:  # a short name such as smollm2-135m
                if not is_complete(zoo.model_dir(known.name)):
                    notes.append(f"{field} ({name}) is a known model not fetched yet: the run fetches it "
                                 f"first (`cyb fetch {known.name}` does it now)")
                continue
        if not _in_hub_cache(name):
            notes.append(f"{field} ({name}) is not a local folder: it is read as a hub id, whose files must "
                         "be in the local cache or the hub reachable when the run starts")
    return notes


def _in_hub_cache(name: str) -> bool:
    """Whether the hub id ``name`` has a config or tokenizer in the local Hugging Face cache."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - comes with transformers
        return False
    for filename in ("config.json", "tokenizer_config.json"):
        try:
            if isinstance(try_to_load_from_cache(name, filename), str):
                return True
        except ValueError:  # not a valid repository id
            return False
    return False


# --------------------------------------------------------------------------------- model


def hf_config_for(cfg: RunConfig, vocab_size: int, tokenizer=None):
    """A Hugging Face config for a from-scratch model of ``cfg.model.arch`` (its
    :class:`~cyb.families.Family`), with the tokenizer's pad, bos and eos ids."""
    special = {}
    if tokenizer is not None:
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            val = getattr(tokenizer, name, None)
            if val is not None:
                special[name] = val
    return families.family(cfg.model.arch).hf_config(cfg.model, vocab_size, **special)


def build_model(cfg: RunConfig, tokenizer):
    """A :class:`~cyb.model.PauseModel` for the run's method (pretrained or from scratch), with
    LoRA adapters and trainable pause rows when ``lora.rank > 0`` (:func:`cyb.model.lora.apply_lora`)
    and pause-step adapters when ``method.pause_adapter_rank > 0``
    (:mod:`cyb.model.pause_adapters`; a frozen base with ``method.pause_adapter_base: freeze``);
    before any DDP/FSDP wrapping, which must see the final set of trainable parameters."""
    from .model import gates, pause_adapters
    from .model.lora import apply_lora, is_lora

    model = _load_model(cfg, tokenizer)
    rows = int(model.hf_model.get_input_embeddings().weight.shape[0])
    if cfg.model.name_or_path and len(tokenizer) > rows:
        field = "data.tokenizer" if cfg.data.tokenizer else "model.name_or_path"
        raise ValueError(f"the tokenizer of {field} has {len(tokenizer)} tokens but the model of "
                         f"model.name_or_path ({cfg.model.name_or_path}) has {rows} embedding rows: give the "
                         "tokenizer saved with the model")
    if is_lora(model):
        raise ValueError(f"model.name_or_path ({cfg.model.name_or_path}) is a LoRA folder: merge it into a "
                         "plain model first (cyb merge FOLDER OUT) and fine-tune that")
    if model.pause_visibility == "gated":
        if not model.gates_loaded:
            gates.fill_gates(model.hf_model, cfg.method.pause_gate_init)
        if cfg.method.pause_gate_anneal_steps:  # opened on a schedule (the trainer), not learned
            for p in gates.gate_parameters(model):
                p.requires_grad_(False)
    if cfg.lora.rank > 0:
        apply_lora(model, cfg.lora)
    if cfg.method.pause_adapter_rank > 0:  # after LoRA: on peft's base layers, trainable
        pause_adapters.add_pause_adapters(model, pause_adapters.PauseAdapterSpec.of_method(cfg.method))
    if cfg.method.pause_adapter_base == "freeze":
        pause_adapters.freeze_base(model)
    return model


def _load_model(cfg: RunConfig, tokenizer):
    from .model import PauseModel

    me, spec = cfg.method, cfg.method.spec
    pause_kw = dict(num_steps=spec.model_steps(me.num_steps), use_dk=spec.has_dk,
                    psi_dk=me.psi_dk, method=me.name, position_scheme=spec.position_scheme(me),
                    pause_visibility=me.pause_visibility if spec.uses_pauses else "shared")
    # auto: float32 parameters (bf16 autocast on GPU), also for checkpoints stored in bf16
    dtype = {"auto": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16}[cfg.model.dtype]
    try:
        if cfg.model.name_or_path:
            return _named(lambda name: PauseModel.from_pretrained(
                name, tokenizer=tokenizer, torch_dtype=dtype, attn_implementation=cfg.model.attn_implementation,
                reconfigure=True, **pause_kw), cfg.model.name_or_path, "model.name_or_path")
        hf_config = hf_config_for(cfg, len(tokenizer), tokenizer)
        return PauseModel.from_config(hf_config, tokenizer, torch_dtype=dtype,
                                      attn_implementation=cfg.model.attn_implementation,
                                      new_rows=cfg.model.pause_init, **pause_kw)
    except ValueError as e:
        if cfg.data.tokenizer and "pass the tokenizer saved with the model" in str(e):
            raise ValueError(f"data.tokenizer ({cfg.data.tokenizer}) does not fit model.name_or_path "
                             f"({cfg.model.name_or_path}): {e}") from None
        if "attention implementation" not in str(e):
            raise
        other = "eager" if cfg.model.attn_implementation == "sdpa" else "sdpa"
        raise ValueError(f"model.attn_implementation: this model does not support "
                         f"{cfg.model.attn_implementation!r} ({str(e).splitlines()[0][:160]}); "
                         f"use {other}") from None


def task_tokenizer(cfg):
    """The tokenizer of a task run: ``data.tokenizer``, else the tokenizer saved with
    ``model.name_or_path`` (a folder, a ``.gguf`` file, a known model's name or a hub id in the
    local cache); the character tokenizer when neither gives one.  A model trained on a task from
    scratch saved the character tokenizer with its pause and dk tokens: that one is kept, since the
    model's settings name those tokens (fine-tuning it again)."""
    from pathlib import Path

    from .model.loading import load_tokenizer as model_tokenizer
    from .model.sources import resolve_model_source
    from .data.synthetic import CharTokenizer
    from .data.tokenizer import load_tokenizer

    def saved_with_model(name):
        source = resolve_model_source(name)
        return model_tokenizer(source, {}) if Path(str(source)).expanduser().is_dir() else load_tokenizer(source)

    tok = None
    if cfg.data.tokenizer:
        tok = _named(load_tokenizer, cfg.data.tokenizer, "data.tokenizer")
    elif cfg.model.name_or_path:
        tok = _named(saved_with_model, cfg.model.name_or_path, "model.name_or_path")
    if tok is None:
        return CharTokenizer().to_hf()
    if isinstance(tok, CharTokenizer):  # saved as char_tokenizer.json: its special tokens kept
        return tok.to_hf()
    return tok  # the character tokenizer (and a saved model's pause tokens), or a pretrained one

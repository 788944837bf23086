"""Build a run's pieces from its configuration: device, tokenizer and model (the data streams are
:mod:`cyb.run_data`)."""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

import torch

from . import families, runtime
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
    (:func:`task_tokenizer`); text runs use ``data.tokenizer``, else the
    pretrained model's, else a byte-level BPE trained on the training documents.
    """
    from .data.tokenizer import load_tokenizer, train_bpe_tokenizer

    saved = run_dir / TOKENIZER_DIR
    if cfg.data.task:  # characters, or the pretrained model's tokenizer (tasks as text)

        return task_tokenizer(cfg)
    if cfg.data.tokenizer:
        return load_tokenizer(cfg.data.tokenizer)
    if cfg.model.name_or_path:
        from .model.sources import resolve_model_source  # a .gguf file or short name: its folder

        return load_tokenizer(resolve_model_source(cfg.model.name_or_path))
    with main_first(info):
        if not (saved / "tokenizer.json").is_file() and info.is_main:
            texts, _ = train_texts(cfg)
            try:
                docs = list(itertools.islice(texts(), cfg.data.bpe_train_docs))
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
    LoRA adapters and trainable pause rows when ``lora.rank > 0`` (:func:`cyb.model.lora.apply_lora`;
    before any DDP/FSDP wrapping, which must see the final set of trainable parameters)."""
    from .model.lora import apply_lora, is_lora

    model = _load_model(cfg, tokenizer)
    if is_lora(model):
        raise ValueError(f"model.name_or_path ({cfg.model.name_or_path}) is a LoRA folder: merge it into a "
                         "plain model first (cyb merge FOLDER OUT) and fine-tune that")
    if cfg.lora.rank > 0:
        apply_lora(model, cfg.lora)
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


def task_tokenizer(cfg):
    """The tokenizer of a task run: ``data.tokenizer``, else the tokenizer saved with
    ``model.name_or_path`` (a folder, a ``.gguf`` file, a known model's name or a hub id in the
    local cache); the character tokenizer when neither gives one, or when the one found is the
    character tokenizer."""
    from pathlib import Path

    from .model.loading import load_tokenizer as model_tokenizer
    from .model.sources import resolve_model_source
    from .data.synthetic import CharTokenizer
    from .data.synthetic.text_task import is_char_tokenizer
    from .data.tokenizer import load_tokenizer

    tok = None
    if cfg.data.tokenizer:
        tok = load_tokenizer(cfg.data.tokenizer)
    elif cfg.model.name_or_path:
        source = resolve_model_source(cfg.model.name_or_path)
        tok = model_tokenizer(source, {}) if Path(str(source)).expanduser().is_dir() else load_tokenizer(source)
    if is_char_tokenizer(tok):
        return CharTokenizer().to_hf()
    return tok

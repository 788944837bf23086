"""LoRA fine-tuning of a :class:`~cyb.model.PauseModel` through peft, with trainable pause rows.

:func:`apply_lora` freezes the pretrained weights, adds rank-``r`` adapters to the chosen
projections and makes the embedding rows of the pause and dk tokens trainable (peft's
``trainable_token_indices``: a small ``[ids, H]`` tensor replaces those rows, the matrix itself
stays frozen).  Models that tie the output projection to the input embedding share those rows;
untied models get the same ids trainable in the output projection too, so the dk logit and
the pauses' output rows learn (``lm_head.weight`` reads back with the rows in place, which the
fused readout uses).

A LoRA model is saved as an adapter folder (:func:`save_adapter`)::

    adapter_config.json, adapter_model.safetensors   peft's layout (adapters and pause rows)
    cyb_lora.json                                     the base model it adapts
    cyb_pause.json, tokenizer files                   as for any saved pause model

:meth:`PauseModel.from_pretrained <cyb.model.PauseModel.from_pretrained>` recognises such a
folder and rebuilds the model from its base (:func:`load_adapter_model`); :func:`merge_lora`
folds the adapters and rows into the weights, giving a plain model that loads without peft.

The module works on the model alone (no training code); ``settings`` is anything with
``rank``, ``alpha``, ``dropout`` and ``target_modules`` (``cyb.config.LoraConfig``).
"""

from __future__ import annotations

import json
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from ..checkpoint import DamagedFileError, check_safetensors
from . import hf
from .tokens import TokenPlan, apply_plan

#: Written into a LoRA folder: marks it and names the base model.
LORA_FILE = "cyb_lora.json"
LORA_FORMAT = "cyb.LoRA"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: The adapter's name inside peft (one adapter per model).
ADAPTER = "default"
INSTALL_HINT = "pip install 'cyb[lora]'"
# The PeftModel that owns a model's adapters, kept on the Hugging Face model (not a submodule,
# so it adds no state-dict keys): it merges and saves them.
_PEFT_ATTR = "_cyb_peft_model"


@contextmanager
def _quiet_peft():
    """No deprecation notices that peft's own calls into transformers raise (nothing for a user to change)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def require_peft():
    """The ``peft`` module; ImportError naming the extra to install when it is missing."""
    try:
        import peft
    except ImportError:
        raise ImportError(f"LoRA (lora.rank > 0) needs the peft package: {INSTALL_HINT}") from None
    return peft


def _hf(model) -> torch.nn.Module:
    return getattr(model, "hf_model", model)


def is_lora(model) -> bool:
    """Whether ``model`` (a PauseModel or its Hugging Face model) carries LoRA adapters."""
    return hasattr(_hf(model), "peft_config")


def peft_model_of(model):
    """The ``peft.PeftModel`` holding ``model``'s adapters (ValueError when it has none)."""
    peft_model = _hf(model).__dict__.get(_PEFT_ATTR)
    if peft_model is None:
        raise ValueError("this model has no LoRA adapters (apply_lora or load a LoRA folder first)")
    return peft_model


def trainable_token_ids(settings) -> list[int]:
    """The ids whose embedding (and output) rows train under LoRA: the pause ids and dk, sorted."""
    ids = set(settings.pause_ids)
    if settings.dk_id is not None:
        ids.add(settings.dk_id)
    return sorted(ids)


def _module_name(hf_model, module) -> str:
    return next(name for name, m in hf_model.named_modules() if m is module)


def _token_layers(hf_model, ids: list[int]) -> dict[str, list[int]] | None:
    """peft's ``trainable_token_indices``: the input embedding, plus the output projection
    when it is a matrix of its own."""
    if not ids:
        return None
    emb, out = hf_model.get_input_embeddings(), hf_model.get_output_embeddings()
    layers = {_module_name(hf_model, emb): ids}
    if out is not None and out.weight is not emb.weight:
        layers[_module_name(hf_model, out)] = ids
    return layers


def _base_name(hf_model, base: str | None) -> str | None:
    """Where the frozen weights come from: a hub name as given, a local folder made absolute."""
    name = base if base is not None else getattr(hf_model, "name_or_path", None) or None
    if name is None:
        return None
    path = Path(str(name)).expanduser()
    return str(path.resolve()) if path.is_dir() else str(name)


def apply_lora(model, settings, *, base: str | None = None):
    """Add LoRA adapters to ``model`` (a :class:`~cyb.model.PauseModel`) in place; returns it.

    Every weight of the Hugging Face model is frozen; trainable afterwards are the rank-``r``
    adapters on ``settings.target_modules`` (``B`` starts at zero, so the model computes what
    it computed before) and the input-embedding rows of the pause and dk ids, plus their rows of
    the output projection when it is not tied to the embedding.  ``model.hf_model`` stays the
    same object; its projections and embeddings are replaced by peft's wrappers.  Trainable
    tensors are float32 whatever the base dtype (they are cast to it in the forward).

    ``base``: the name or folder the frozen weights are reloaded from when the adapter is
    loaded (default: the folder or hub name the model was loaded from).  Raises ImportError
    without peft, ValueError when no module matches ``settings.target_modules`` or the model
    already has adapters.
    """
    peft = require_peft()
    if settings.rank < 1:
        raise ValueError(f"lora.rank must be >= 1 to apply LoRA, got {settings.rank}")
    hf_model = model.hf_model
    if is_lora(hf_model):
        raise ValueError("the model already has LoRA adapters (a LoRA folder?): merge them first "
                         "(cyb merge) to fine-tune it again")
    config = peft.LoraConfig(
        r=int(settings.rank), lora_alpha=float(settings.alpha), lora_dropout=float(settings.dropout),
        target_modules=list(settings.target_modules), bias="none",
        trainable_token_indices=_token_layers(hf_model, trainable_token_ids(model.settings)),
        base_model_name_or_path=_base_name(hf_model, base))
    try:
        with _quiet_peft():
            peft_model = peft.get_peft_model(hf_model, config, adapter_name=ADAPTER)
    except ValueError as e:
        if "target_modules" not in str(e) and "Target modules" not in str(e):
            raise
        names = sorted({n.rsplit(".", 1)[-1] for n, m in hf_model.named_modules()
                        if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"lora.target_modules {list(settings.target_modules)}: no such module in "
                         f"{type(hf_model).__name__}; its linear layers are {', '.join(names)}") from None
    hf_model.__dict__[_PEFT_ATTR] = peft_model
    for p in hf_model.parameters():  # float32 masters (peft already keeps adapters so) for bf16 bases
        if p.requires_grad and p.dtype in (torch.bfloat16, torch.float16):
            p.data = p.data.float()
    return model


def parameter_counts(model) -> tuple[int, int]:
    """``(trainable, total)`` parameters of a PauseModel (tied matrices counted once)."""
    return model.num_parameters(only_trainable=True), model.num_parameters()


# ----------------------------------------------------------------------- state for checkpoints


def trainable_names(model) -> list[str]:
    """Names (Hugging Face model keys) of the trainable parameters of a LoRA model."""
    return [n for n, p in _hf(model).named_parameters() if p.requires_grad]


def trainable_state(model, state: dict | None = None) -> dict:
    """The trainable tensors (adapters, pause rows) of a LoRA model, keyed as the Hugging Face
    model's ``state_dict``: taken from ``state`` (e.g. gathered under FSDP) or the model."""
    names = trainable_names(model)
    if state is None:
        params = dict(_hf(model).named_parameters())
        return {n: params[n].detach().cpu() for n in names}
    missing = [n for n in names if n not in state]
    if missing:
        raise ValueError(f"the state lacks trainable LoRA tensors: {missing[:3]}")
    return {n: state[n] for n in names}


def load_trainable_state(model, state: dict) -> None:
    """Load :func:`trainable_state` output into a LoRA model (the frozen weights stay as
    loaded).  ValueError when the tensors are not exactly the model's trainable ones."""
    names = set(trainable_names(model))
    missing, extra = sorted(names - set(state)), sorted(set(state) - names)
    if missing or extra:
        raise ValueError(
            "the checkpoint's weights do not match this LoRA model's trainable tensors "
            f"(missing {missing[:3]}, unexpected {extra[:3]}): a checkpoint of a run with other "
            "lora settings, or of full fine-tuning?")
    _hf(model).load_state_dict(state, strict=False)


# ----------------------------------------------------------------------- folders


def lora_folder(name_or_path, hf_kwargs: dict | None = None) -> Path | None:
    """The LoRA folder at ``name_or_path`` (a local folder holding ``cyb_lora.json``), else None."""
    path = Path(str(name_or_path)).expanduser()
    folder = path / ((hf_kwargs or {}).get("subfolder") or "")
    return folder if (folder / LORA_FILE).is_file() else None


def save_adapter(model, directory, *, state_dict: dict | None = None) -> None:
    """Write the adapter of a LoRA PauseModel into ``directory``: peft's
    ``adapter_config.json`` and ``adapter_model.safetensors`` (adapters and pause rows), and
    ``cyb_lora.json`` naming the base model.  ``state_dict`` (Hugging Face keys, e.g. gathered
    under FSDP) replaces the model's own.  The tokenizer and ``cyb_pause.json`` are
    :meth:`PauseModel.save_pretrained`'s business."""
    peft = require_peft()
    from safetensors.torch import save_file

    directory = Path(directory)
    peft_model = peft_model_of(model)
    hf_model = _hf(model)
    state = state_dict if state_dict is not None else hf_model.state_dict()
    prefix = "base_model.model."  # the keys as seen from the PeftModel, as peft saves them
    adapter = peft.get_peft_model_state_dict(peft_model, state_dict={prefix + k: v for k, v in state.items()},
                                             adapter_name=ADAPTER, save_embedding_layers=False)
    adapter = {k: v.detach().to("cpu").contiguous() for k, v in adapter.items()}
    save_file(adapter, str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = peft_model.peft_config[ADAPTER]
    config.save_pretrained(str(directory))
    base = config.base_model_name_or_path
    (directory / LORA_FILE).write_text(json.dumps(
        {"format": LORA_FORMAT, "base_model": base, "vocab_size": int(model.settings.vocab_size),
         "trainable_token_ids": trainable_token_ids(model.settings)}, indent=2))


def read_lora_file(folder) -> dict:
    """``cyb_lora.json`` of a LoRA folder, checked (ValueError naming the file)."""
    f = Path(folder) / LORA_FILE
    try:
        data = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{f} cannot be read ({e})") from None
    if not isinstance(data, dict) or data.get("format") != LORA_FORMAT or not data.get("base_model"):
        raise ValueError(f"{f} is not a cyb LoRA file (format {LORA_FORMAT!r} with a base_model)")
    return data


def check_lora_folder(folder) -> None:
    """Raise :class:`~cyb.checkpoint.DamagedFileError` naming the first file of a LoRA folder
    that is missing or does not read back (the adapter config and weights, ``cyb_lora.json``)."""
    folder = Path(folder)
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (folder / name).is_file():
            raise DamagedFileError(folder / name, "missing", "", f"{folder} is a LoRA folder without {name}: "
                                   "restore it from a copy or train the model again")
    for name in (ADAPTER_CONFIG, LORA_FILE):
        try:
            json.loads((folder / name).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DamagedFileError(folder / name, f"not valid JSON: {e}") from e
    check_safetensors(folder / ADAPTER_WEIGHTS, "restore it from a copy or train the model again")


def load_adapter_model(folder, settings, *, torch_dtype=None, attn_implementation=None, **hf_kwargs):
    """The Hugging Face model of a LoRA folder: its base loaded (``hf_kwargs`` go to
    ``from_pretrained``), grown to the saved vocabulary, the adapters and pause rows put in.
    Returns the Hugging Face model (frozen, adapters in place) for a PauseModel to wrap."""
    peft = require_peft()
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    check_lora_folder(folder)
    info = read_lora_file(folder)
    base = info["base_model"]
    kwargs = {k: v for k, v in hf_kwargs.items() if k != "subfolder"}
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(
            base, attn_implementation=attn_implementation, **hf.dtype_kwargs(torch_dtype), **kwargs)
    except OSError as e:
        raise FileNotFoundError(
            f"{folder} is a LoRA adapter of the base model {base}, which cannot be loaded ({str(e).splitlines()[0]}); "
            f"make it available there, or edit base_model in {folder / LORA_FILE}") from None
    rows = int(hf_model.get_input_embeddings().weight.shape[0])
    if rows < settings.vocab_size:
        # the rows added for pause/dk in training: the same mean initialisation (the pause rows
        # themselves come from the adapter; any other new row must match training)
        new = tuple(range(rows, settings.vocab_size))
        apply_plan(hf_model, TokenPlan((), (), None, None, "added", new, settings.vocab_size, rows))
    with _quiet_peft():
        peft_model = peft.PeftModel.from_pretrained(hf_model, str(folder), adapter_name=ADAPTER, is_trainable=False)
    hf_model.__dict__[_PEFT_ATTR] = peft_model
    return hf_model


def merge_lora(model):
    """A plain :class:`~cyb.model.PauseModel` with the adapters and pause rows folded into its
    weights (same logits, no peft needed to load it once saved).  Consumes ``model``: its
    Hugging Face model is the one merged."""
    peft_model = peft_model_of(model)
    hf_model = peft_model.merge_and_unload()
    hf_model.__dict__.pop(_PEFT_ATTR, None)
    for p in hf_model.parameters():
        p.requires_grad_(True)
    return type(model)(hf_model, model.settings, model.tokenizer)


__all__ = ["ADAPTER", "LORA_FILE", "apply_lora", "check_lora_folder", "is_lora", "load_adapter_model",
           "load_trainable_state", "lora_folder", "merge_lora", "parameter_counts", "peft_model_of",
           "read_lora_file", "require_peft", "save_adapter", "trainable_names", "trainable_state",
           "trainable_token_ids"]

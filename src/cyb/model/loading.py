"""Finding the pieces of a saved model: its pause settings and its tokenizer; checking that a
saved folder's files read back before loading it."""

from __future__ import annotations

import json
from pathlib import Path

from ..checkpoint import DamagedFileError, check_safetensors
from .settings import SETTINGS_FILE, TRAINING_STATE_FILE

_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_CHAR_TOKENIZER_FILE = "char_tokenizer.json"
_HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "trust_remote_code", "subfolder")


def hub_kwargs(hf_kwargs: dict) -> dict:
    """The loading options that also apply to the tokenizer and to ``cyb_pause.json``."""
    return {k: hf_kwargs[k] for k in _HUB_KWARGS if k in hf_kwargs}


def find_settings_file(name_or_path, hf_kwargs: dict) -> Path | None:
    """``cyb_pause.json`` of a local folder or a hub repository, or None when it has none."""
    path = Path(str(name_or_path)).expanduser()
    if path.is_dir():
        sub = hf_kwargs.get("subfolder") or ""
        found = path / sub / SETTINGS_FILE
        return found if found.is_file() else None
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return None
    opts = hub_kwargs(hf_kwargs)
    opts.pop("trust_remote_code", None)
    try:
        return Path(hf_hub_download(str(name_or_path), SETTINGS_FILE, **opts))
    except EntryNotFoundError:  # the repository (or the offline cache) has no settings file
        return None


def load_tokenizer(name_or_path, hf_kwargs: dict):
    """The tokenizer saved with a model: Hugging Face, else a ``CharTokenizer``, else None.

    A local folder without tokenizer files gives None; a hub name is loaded with
    ``AutoTokenizer`` (errors propagate).
    """
    path = Path(str(name_or_path)).expanduser()
    opts = hub_kwargs(hf_kwargs)
    if path.is_dir():
        folder = path / (hf_kwargs.get("subfolder") or "")
        if any((folder / f).is_file() for f in _HF_TOKENIZER_FILES):
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(str(path), **opts)
        if (folder / _CHAR_TOKENIZER_FILE).is_file():
            from ..data.synthetic.char_tokenizer import CharTokenizer

            return CharTokenizer.load(folder)
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(name_or_path), **opts)


def trained_on(folder, tokenizer) -> tuple[str, str] | None:
    """``(task, its characters)`` for a model trained on a synthetic task with the character
    tokenizer (the ``training_state.json`` of ``cyb train`` names the task), such as
    ``("task addition (digits=3)", "0123456789+=")``, else None (text, a reasoning-gym task, a
    pretrained model's tokenizer, which read all kinds of text before its task, an older folder).
    A prompt with another character is one the model never saw
    (:func:`cyb.data.tokenizer.check_text`)."""
    from ..data.synthetic import make_task
    from ..data.synthetic.text_task import is_char_tokenizer

    if tokenizer is None:
        return None
    try:
        state = json.loads((Path(str(folder)) / TRAINING_STATE_FILE).read_text(encoding="utf-8"))
        name, kwargs = state["task"], dict(state.get("task_kwargs") or {})
        task = make_task(name, **kwargs)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not is_char_tokenizer(tokenizer):  # read after the task: a large vocabulary's is costly to list
        return None
    size = ", ".join(f"{k}={v}" for k, v in kwargs.items())
    return (f"task {name}" + (f" ({size})" if size else ""), task.characters)


def save_tokenizer(tokenizer, directory) -> None:
    """Write a Hugging Face tokenizer (``save_pretrained``) or a ``CharTokenizer`` (``save``)."""
    if hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(str(directory))
    elif hasattr(tokenizer, "save"):
        tokenizer.save(directory)
    else:
        raise TypeError(f"do not know how to save a {type(tokenizer).__name__}")


#: What a damaged file of a saved model means, said after the reason.
DAMAGE = "the file is truncated, corrupted or was not fully written"
MODEL_ADVICE = f"{DAMAGE}; restore it from a copy or train the model again"
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "tf_model.h5", "flax_model.msgpack",
                 "model.ckpt.index", *_WEIGHT_INDEXES)


def model_advice(folder: Path) -> str:
    """What to do about a damaged file in ``folder``: for the ``final/`` of a ``cyb train`` run,
    running the run again writes it anew from the run's last checkpoint."""
    import os
    import shlex

    folder = Path(os.path.abspath(folder))  # a command that works from any folder
    run = folder.parent
    if (folder / TRAINING_STATE_FILE).is_file() and (run / "config.yaml").is_file():
        config, out_dir = shlex.quote(str(run / "config.yaml")), shlex.quote(f"train.out_dir={run}")
        return (f"{DAMAGE}; `cyb train {config} --set {out_dir}` writes "
                f"{folder.name}/ anew from the run's last checkpoint (or restore it from a copy)")
    return MODEL_ADVICE


def check_model_folder(name_or_path, hf_kwargs: dict | None = None) -> None:
    """Raise :class:`~cyb.checkpoint.DamagedFileError` (a ValueError) naming the first file of a
    local model folder that does not read back: a JSON file that does not parse, a safetensors
    file whose header is cut short or corrupted, no ``config.json``, no weights, a weight file
    listed in an index but missing.  Hub names (not local folders) are left alone.

    Cheap: reads the JSON files and the headers of the weight files only.
    """
    path = Path(str(name_or_path)).expanduser()
    if not path.is_dir():
        return
    folder = path / ((hf_kwargs or {}).get("subfolder") or "")
    advice = model_advice(folder)
    if not (folder / "config.json").is_file():
        raise DamagedFileError(folder / "config.json", "missing", "", (
            f"{folder} is not a saved model: it has no config.json"))
    if "gguf_file" not in (hf_kwargs or {}) and not any(
            (folder / name).is_file() for name in _WEIGHT_FILES) and not any(folder.glob("*.safetensors")):
        raise DamagedFileError(folder / "model.safetensors", "missing", "", (
            f"{folder} holds no weights (model.safetensors is missing): restore it from a copy or "
            "train the model again"))
    for f in sorted(folder.glob("*.json")):
        try:
            json.loads(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DamagedFileError(f, f"not valid JSON: {e}", advice) from e
    for index in _WEIGHT_INDEXES:
        if (folder / index).is_file():
            data = json.loads((folder / index).read_text(encoding="utf-8"))
            names = set((data.get("weight_map") or {}).values()) if isinstance(data, dict) else set()
            for name in sorted(names):
                if not (folder / name).is_file():
                    raise DamagedFileError(folder / name, f"missing: {index} lists it", advice)
    for f in sorted(folder.glob("*.safetensors")):
        check_safetensors(f, advice)

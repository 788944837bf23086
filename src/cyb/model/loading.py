"""Finding the pieces of a saved model: its pause settings and its tokenizer."""

from __future__ import annotations

from pathlib import Path

from .settings import SETTINGS_FILE

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
            from ..data.synthetic.tokenizer import CharTokenizer

            return CharTokenizer.load(folder)
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(name_or_path), **opts)


def save_tokenizer(tokenizer, directory) -> None:
    """Write a Hugging Face tokenizer (``save_pretrained``) or a ``CharTokenizer`` (``save``)."""
    if hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(str(directory))
    elif hasattr(tokenizer, "save"):
        tokenizer.save(directory)
    else:
        raise TypeError(f"do not know how to save a {type(tokenizer).__name__}")

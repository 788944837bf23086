"""Where a model comes from: ``model.name_or_path`` resolved to something ``transformers`` loads.

``model.name_or_path`` (and ``PauseModel.from_pretrained``, ``cyb generate``, ``cyb eval``)
takes any of:

* a **local folder** (a Hugging Face checkpoint, a saved cyb model or run's ``final/``): used
  as it is;
* a **run folder** of ``cyb train``: its ``final/`` model; a **training checkpoint**
  (``ckpt-<step>/``): the model it holds, once :mod:`cyb.run_models` (the training layer, which
  builds a model as the run built it) wrote it into the cache (:mod:`cyb.model.run_folders`);
* a **GGUF file** (``*.gguf``): converted once into a plain model folder in the cache
  (:func:`cyb.model.gguf_convert.cached_conversion`, keyed by the file's content) and that
  folder is used from then on;
* a **known model's short name** (``smollm2-135m``; :mod:`cyb.model.zoo`), when no file or
  folder of that name exists: the folder ``cyb fetch`` wrote, fetched on first use;
* anything else, a **hub id** (``HuggingFaceTB/SmolLM2-135M-Instruct``): left to
  ``transformers``.

The cache (:mod:`cyb.model.cache`) is ``$CYB_CACHE`` (default ``~/.cache/cyb``):
``models/NAME`` for fetched models, ``gguf/KEY`` for converted GGUF files.
"""

from __future__ import annotations

from pathlib import Path

from .cache import is_complete, is_gguf, say


def resolve_model_source(name_or_path, *, fetch: bool = True):
    """What ``transformers`` should load for ``name_or_path`` (see the module docstring).

    Returns a folder path (as a string) for GGUF files, known short names, run folders (their
    ``final/``) and training checkpoints (the model folder :mod:`cyb.run_models` built from one),
    else ``name_or_path`` unchanged (a folder, a hub id, None).  With ``fetch=False`` a known model
    that was not fetched yet, a GGUF file not converted yet, or a checkpoint whose model was not
    built yet, is returned unchanged (nothing is fetched or converted).

    Raises FileNotFoundError for a ``.gguf`` path that does not exist, and ValueError
    (:class:`~cyb.model.zoo.FetchError`) when a known model has to be fetched and neither of
    its sources can be reached, or for a checkpoint whose model is not in the cache yet (this layer
    never builds one: :func:`cyb.run_models.checkpoint_model` does).
    """
    if name_or_path is None:
        return None
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_file() and is_gguf(text):
        from .gguf_convert import cached_conversion, cached_folder

        if not fetch:
            folder = cached_folder(path)
            return str(folder) if is_complete(folder) else name_or_path
        return str(cached_conversion(path))
    if path.is_dir():
        return _run_model(path, name_or_path, fetch)
    if path.exists():
        return name_or_path
    if is_gguf(text):
        raise FileNotFoundError(f"GGUF file {text} does not exist")
    from . import zoo

    known = zoo.find(text)
    if known is None:
        return name_or_path
    folder = zoo.model_dir(known.name)
    if is_complete(folder):
        return str(folder)
    if not fetch:
        return name_or_path
    say(f"{known.name} is not in the cache yet: fetching it once into {folder} (as `cyb fetch {known.name}` does)")
    return str(zoo.fetch(known.name))


def _run_model(path: Path, name_or_path, fetch: bool):
    """A folder: a run folder's ``final/``, a checkpoint's model in the cache, else the folder."""
    from . import run_folders

    if run_folders.is_checkpoint(path):
        folder = run_folders.built_checkpoint_model(path)
        if folder is not None:
            if fetch:
                say(f"{path} is checkpoint step {run_folders.checkpoint_step(path)} of run {path.resolve().parent}: "
                    f"its model is {folder}")
            return str(folder)
        if not fetch:
            return name_or_path
        raise run_folders.not_built(path)
    if run_folders.is_run_folder(path):
        return str(run_folders.run_final(path))
    return name_or_path


def plain_model_kwargs(folder) -> dict:
    """``{"num_steps": 1}`` for a folder that holds a plain Hugging Face model (a config, weights
    and no pause settings), so that commands that load a saved cyb model also take a base model, as a no-pause
    baseline; ``{}`` otherwise."""
    from .settings import SETTINGS_FILE

    folder = Path(folder)
    if not folder.is_dir() or (folder / SETTINGS_FILE).is_file() or not (folder / "config.json").is_file():
        return {}
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
    if not any((folder / w).is_file() for w in weights):
        return {}
    traces = pause_model_traces(folder)
    if traces:
        raise ValueError(f"{folder} has no {SETTINGS_FILE} but was written as a pause model ({traces}): its pause "
                         f"settings are missing; restore {SETTINGS_FILE} from a copy of the folder (without it "
                         "the model would run as a plain model, without pauses)")
    return {"num_steps": 1}


def pause_model_traces(folder) -> str:
    """What shows that ``folder`` held a pause model (``cyb train``'s ``training_state.json``, pause
    or dk tokens in its tokenizer), as a few words; ``""`` for none."""
    import json

    from .settings import TRAINING_STATE_FILE
    from .tokens import DK_TOKEN, PAUSE_TOKEN, SHARED_PAUSE_TOKEN

    folder = Path(folder)
    if (folder / TRAINING_STATE_FILE).is_file():
        return f"{TRAINING_STATE_FILE} of cyb train"
    try:
        added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens") or []
    except (OSError, ValueError, AttributeError):
        return ""
    names = {t.get("content") for t in added if isinstance(t, dict)}
    found = sorted(n for n in names if n in (DK_TOKEN, SHARED_PAUSE_TOKEN, PAUSE_TOKEN.format(j=1)))
    return f"its tokenizer has {', '.join(found)}" if found else ""


def plain_model_note(folder, what: str = "runs") -> str:
    """The one line a command says when it runs a plain model (no pause settings) on purpose."""
    from .settings import SETTINGS_FILE

    return (f"note: {folder} has no {SETTINGS_FILE} (it is not a saved pause model): it {what} as a plain model "
            "without pauses, a no-pause baseline (M = 1)")


def saved_model_folder(path, what: str = "MODEL_DIR", *, allow_plain: bool = False) -> Path:
    """The saved pause model that ``path`` names: a model folder (``cyb_pause.json``), the
    ``final/`` of a ``cyb train`` run folder, a ``.gguf`` file or a known model's short name (their
    folder, :func:`cyb.model.sources.resolve_model_source`), and with ``allow_plain`` a plain
    Hugging Face model folder.  ValueError saying what is wrong (``what`` names the argument): a
    path that does not exist, a run that has not finished, a folder that is not a saved cyb model."""
    from .lora import lora_folder
    from .settings import SETTINGS_FILE

    path = str(resolve_model_source(path))
    folder = Path(path).expanduser()
    if not folder.exists():
        raise ValueError(f"{what} {path} does not exist")
    if not folder.is_dir():
        raise ValueError(f"{what} {path} is not a folder")
    if not (folder / SETTINGS_FILE).is_file() and (folder / "config.yaml").is_file():  # a run folder
        if not (folder / "final" / SETTINGS_FILE).is_file():
            raise ValueError(f"{path} is a run folder whose training has not finished (no final/ model yet); "
                             "finish or resume it with cyb train, or give a saved model folder")
        folder = folder / "final"
        path = str(folder)
    if allow_plain and plain_model_kwargs(folder):
        return folder
    if not (folder / SETTINGS_FILE).is_file():
        raise ValueError(
            f"{path} is not a saved cyb model: expected {SETTINGS_FILE} (the pause settings) beside a "
            "Hugging Face checkpoint (config.json, model.safetensors) and its tokenizer, as written by "
            "`cyb train` or PauseModel.save_pretrained, or a run folder of cyb train")
    if not (folder / "config.json").is_file() and lora_folder(folder) is None:
        raise ValueError(f"{path} has {SETTINGS_FILE} but no config.json: the Hugging Face checkpoint is missing")
    return folder


__all__ = ["pause_model_traces", "plain_model_kwargs", "plain_model_note", "resolve_model_source",
           "saved_model_folder"]

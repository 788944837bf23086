"""Loading a pause model from a name or a path (:meth:`cyb.model.PauseModel.from_pretrained`).

What a name or path holds decides how it becomes a :class:`~cyb.model.PauseModel`:

* a **saved pause model** (a folder or hub repository with ``cyb_pause.json``): its settings,
  which any argument given must agree with (or, with ``reconfigure``, replace);
* a **LoRA folder** (``cyb_lora.json``): its base model with the adapters and pause rows put in;
* any **other causal LM**: its pause/dk ids set up as in :meth:`~cyb.model.PauseModel.from_hf`.

The name is resolved first (:func:`cyb.model.sources.resolve_model_source`: a ``.gguf`` file, a
known model's short name, a run folder or a training checkpoint becomes the folder that holds
the model), and a local folder's files are checked before anything is loaded.
"""

from __future__ import annotations

from pathlib import Path

from safetensors import SafetensorError

from ..checkpoint import DamagedFileError, _short
from . import gates, hf, pause_adapters
from .loading import MODEL_ADVICE, check_model_folder, find_settings_file, load_tokenizer, model_advice, trained_on
from .lora import check_lora_folder, load_adapter_model, lora_folder
from .settings import SETTINGS_FILE, PauseSettings, settings_to_load


def load_pretrained(cls, name_or_path, *, num_steps, use_dk, psi_dk, position_scheme, method,
                    pause_visibility, tokenizer, torch_dtype, attn_implementation, reuse_unused,
                    reconfigure, **hf_kwargs):
    """``cls.from_pretrained(name_or_path, ...)`` (its docstring says what each argument does):
    an instance of ``cls`` (a :class:`~cyb.model.PauseModel`), in eval mode."""
    from transformers import AutoModelForCausalLM

    from .sources import resolve_model_source

    hf.check_attention(attn_implementation)
    name_or_path = resolve_model_source(name_or_path)  # a .gguf file, a short name, a run: its folder
    adapter = lora_folder(name_or_path, hf_kwargs)
    if adapter is None:
        check_model_folder(name_or_path, hf_kwargs)  # a damaged file: one error naming it
    else:
        check_lora_folder(adapter)
    settings_file = find_settings_file(name_or_path, hf_kwargs)
    saved = PauseSettings.load(settings_file) if settings_file is not None else None
    if adapter is not None and saved is None:
        raise ValueError(f"{adapter} is a LoRA folder without {SETTINGS_FILE}: it is not a saved pause model")
    saved = settings_to_load(saved, settings_file, reconfigure=reconfigure, pause_visibility=pause_visibility,
                             num_steps=num_steps, use_dk=use_dk, psi_dk=psi_dk,
                             position_scheme=position_scheme, method=method)
    if saved is None and num_steps is None:
        raise ValueError(f"num_steps (M) is required: {name_or_path!s} has no {SETTINGS_FILE} (it is not a "
                         "saved pause model)")
    if tokenizer is None:
        tokenizer = load_tokenizer(name_or_path, hf_kwargs)
    if adapter is not None:
        if saved is None:  # other pause settings were asked for (reconfigure)
            raise ValueError(f"{adapter} holds LoRA adapters: merge them first (cyb merge) to fine-tune "
                             "it with other pause settings")
        hf_model = load_adapter_model(adapter, saved, torch_dtype=torch_dtype,
                                      attn_implementation=attn_implementation, **hf_kwargs)
        return _trained_on(_with_pause_adapters(cls(hf_model, saved, tokenizer), adapter), adapter).eval()
    try:
        with gates.quiet_load(saved is not None and saved.pause_visibility == "gated"):
            hf_model = AutoModelForCausalLM.from_pretrained(
                str(name_or_path), attn_implementation=attn_implementation,
                **hf.dtype_kwargs(torch_dtype), **hf_kwargs,
            )
    except SafetensorError as e:  # a hub download cut short, or a file changed while loading
        raise DamagedFileError(name_or_path, _short(e), model_advice(Path(str(name_or_path))),
                               f"the weights of {name_or_path} are damaged ({_short(e)}): {MODEL_ADVICE}") from e
    if saved is not None:
        model = cls(hf_model, saved, tokenizer)
        if saved.pause_visibility == "gated":
            model.gates_loaded = gates.load_gates(hf_model, name_or_path) > 0
        folder = Path(str(name_or_path)) / (hf_kwargs.get("subfolder") or "")
        return _trained_on(_with_pause_adapters(model, folder), folder).eval()
    return cls.from_hf(hf_model, tokenizer, num_steps=num_steps, use_dk=use_dk, psi_dk=psi_dk,
                       position_scheme=position_scheme, method=method,
                       pause_visibility=pause_visibility, reuse_unused=reuse_unused).eval()


def _trained_on(model, folder):
    """``model`` knowing the synthetic task it was trained on, where ``folder`` says."""
    model.trained_on = trained_on(folder, model.tokenizer)
    return model


def _with_pause_adapters(model, folder):
    """``model`` with the pause-step adapters saved in ``folder`` put in, if it has any."""
    if pause_adapters.saved_in(folder):
        pause_adapters.load_pause_adapters(model, folder)
    return model


__all__ = ["load_pretrained"]

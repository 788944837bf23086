"""Hugging Face causal LMs with pauses: :class:`PauseModel` and its :class:`PauseSettings`.

* :mod:`cyb.model.settings`: ``PauseSettings``, saved as ``cyb_pause.json`` beside the weights.
* :mod:`cyb.model.tokens`: reserving pause and dk ids (existing, unused, added or appended) and
  mean-initialising the embedding rows of new ones.
* :mod:`cyb.model.hf`: what is specific to ``transformers`` (attention masks and kernels, cache
  argument names, the decoder, logit softcapping).
* :mod:`cyb.model.wrapper`: ``PauseModel`` and ``PauseForward``.
* :mod:`cyb.model.pretrained`: what ``PauseModel.from_pretrained`` does with a name or path (saved
  pause models, LoRA folders, plain models that get their pause ids).
* :mod:`cyb.model.lora`: LoRA through peft (adapters and trainable pause/dk rows, the adapter
  folder, merging).
"""

from .hf import SUPPORTED_ATTENTION
from .settings import DEFAULT, FORMAT_VERSION, SETTINGS_FILE, PauseSettings
from .tokens import DK_TOKEN, PAUSE_TOKEN, SHARED_PAUSE_TOKEN, UNUSED_TOKEN_PATTERNS, TokenPlan
from .wrapper import PauseForward, PauseModel

__all__ = [
    "DEFAULT",
    "DK_TOKEN",
    "FORMAT_VERSION",
    "PAUSE_TOKEN",
    "SETTINGS_FILE",
    "SHARED_PAUSE_TOKEN",
    "SUPPORTED_ATTENTION",
    "UNUSED_TOKEN_PATTERNS",
    "PauseForward",
    "PauseModel",
    "PauseSettings",
    "TokenPlan",
]

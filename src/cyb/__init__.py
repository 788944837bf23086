"""cyb: language models that pause for breath.

Implements "Catch Your Breath" (CYB): after each real token a causal language model may emit
``<don't know>`` (dk) and take another computation step on a ``<pause>`` input before it answers.

Main entry points (imported lazily, so ``import cyb`` is cheap):

* :class:`cyb.PauseModel`, :class:`cyb.PauseSettings`: a Hugging Face causal LM with pauses.
* :mod:`cyb.losses`: the paper's losses as tensor functions.
* :mod:`cyb.readout`, :mod:`cyb.layout`: per-step readout and sequence layouts.
* :class:`cyb.RunConfig` and :func:`cyb.train.train`: configured training.
"""

__version__ = "0.1.0"

_LAZY = {
    "PauseModel": ("cyb.model", "PauseModel"),
    "PauseSettings": ("cyb.model", "PauseSettings"),
    "PauseVocab": ("cyb.layout", "PauseVocab"),
    "RunConfig": ("cyb.config", "RunConfig"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'cyb' has no attribute {name!r}")

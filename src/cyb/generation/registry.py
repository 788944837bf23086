"""The decoders, in one table: their names, what each is, where each runs, how one is built.

Every place that chooses a decoder asks this module: :class:`~cyb.generation.GenerationConfig`
(``decoder=``, and through it :func:`cyb.generation.generate`), ``cyb generate --decoder``, the
lm-eval model (``decoder=``) and ``cyb bench decode``.  :data:`DECODERS` are the names a user
may give, :func:`resolve_decoder` says what ``auto`` means for a model and why a name cannot run
it.  All decoders make the same decisions (greedy or sampled, fixed or adaptive mode, each
prompt drawing from its own random stream); they differ in speed and in the models they
support:

* ``graph``: the engine (:mod:`cyb.engine`): rows that advance on their own and come and go,
  on a preallocated KV cache, each decoding step replayed as a CUDA graph; CUDA only, models
  with sdpa or eager attention, every pause layout, sliding windows included.
* ``static``: the engine with its steps run eagerly; any device, the same models.
* ``eager``: batches of prompts on a growing ``DynamicCache`` (:mod:`cyb.generation.decoders`,
  :mod:`cyb.generation.private`); every model and device; gated pauses recompute the whole row
  every step.
* ``auto`` (the default of every caller, :data:`DEFAULT`): the first of :data:`AUTO_ORDER` that
  can run the model -- ``graph`` on CUDA, ``static`` elsewhere.

Within the eager decoder the mode picks the class.  Fixed mode has one; adaptive mode feeds
either whole blocks (the token and its ``M - 1`` pauses, the steps after the stop step masked
out: one forward per real token) or one position per step.  ``one_position`` forces that choice;
otherwise it feeds blocks on CUDA for models without sliding-window layers (a forward of ``M``
positions costs about one of a single position there) and one position elsewhere.  Models with
private pauses keep real tokens only in the cache (:mod:`cyb.generation.private`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..engine import unsupported_reason
from ..model import hf
from .decoders import (AdaptiveDecoder, BlockAdaptiveDecoder, FixedDecoder, RecomputeAdaptiveDecoder,
                       RecomputeFixedDecoder, StepReadout)
from .private import private_decoder


@dataclass(frozen=True)
class Decoder:
    """One entry of :data:`REGISTRY`.

    Attributes:
        name: what users choose (``GenerationConfig.decoder``, ``cyb generate --decoder``).
        summary: one line for help texts.
        engine: it is the engine (:mod:`cyb.engine`), with CUDA graphs when ``needs_cuda``.
        build: the eager decoders' ``build(model, ids, mask, readout, *, mode, one_position)``
            (see :func:`make_decoder`); None for the engine.
        needs_cuda: it runs only with the model on a CUDA device.
        instead: what to use where it cannot run for want of CUDA (an error message's advice).
    """

    name: str
    summary: str
    engine: bool = False
    build: Callable[..., object] | None = None
    needs_cuda: bool = False
    instead: str = "use 'auto' or 'eager'"


def _eager(model, ids, mask, readout, *, mode, one_position=None):
    if model.pause_visibility == "private":  # a cache of real tokens (cyb.generation.private)
        return private_decoder(model, ids, mask, readout, mode=mode, sparse=one_position)
    if model.pause_visibility == "gated":  # no DynamicCache holds the gates' bias on earlier pauses
        return (RecomputeFixedDecoder if mode == "fixed" else RecomputeAdaptiveDecoder)(model, ids, mask, readout)
    if mode == "fixed":
        return FixedDecoder(model, ids, mask, readout)
    if one_position is None:
        one_position = ids.device.type != "cuda" or hf.has_sliding_window(model.config)
    return (AdaptiveDecoder if one_position else BlockAdaptiveDecoder)(model, ids, mask, readout)


#: the decoders by name, in the order help texts list them
REGISTRY: dict[str, Decoder] = {d.name: d for d in (
    Decoder("graph", "the engine: continuous batching on a preallocated KV cache, each step a CUDA graph "
                     "(CUDA)", engine=True, needs_cuda=True,
            instead="use 'auto', 'static' (the engine without graphs) or 'eager'"),
    Decoder("static", "the engine without CUDA graphs (any device)", engine=True),
    Decoder("eager", "a batch on a growing DynamicCache (any model, any device)", build=_eager),
)}
AUTO = "auto"
#: what ``auto`` tries, in order: the first that can run the model
AUTO_ORDER = ("graph", "static", "eager")
#: the names a user may give
DECODERS = (AUTO, *REGISTRY)
#: the decoder of every caller that is not told otherwise
DEFAULT = AUTO
#: the generation modes every decoder runs: Recipe 1 (all pauses) and Recipe 2 (pauses after dk)
MODES = ("fixed", "adaptive")


def describe() -> str:
    """The decoders in one line, for help texts."""
    parts = [f"{d.name} = {d.summary}" for d in REGISTRY.values()]
    return "; ".join(parts + [f"{AUTO} = graph on CUDA, else static"])


def _check_name(choice: str) -> None:
    if choice not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {choice!r}")


def _problem(entry: Decoder, model) -> str | None:
    """Why ``entry`` cannot run ``model`` where it is (an error message), or None."""
    if entry.engine:
        reason = unsupported_reason(model)
        if reason is not None:
            return (f"decoder={entry.name!r} is not available: {reason}; use decoder='eager' "
                    "(or 'auto', which falls back to it)")
    if entry.needs_cuda and model.device.type != "cuda":
        return (f"decoder={entry.name!r} needs the model on a CUDA device, it is on "
                f"{model.device}; {entry.instead}")
    return None


def resolve_decoder(model, choice: str) -> str:
    """The decoder that ``choice`` means for ``model`` (a :class:`cyb.PauseModel`) on its
    device: a name of :data:`REGISTRY`.

    ``auto``: the first of :data:`AUTO_ORDER` that can run the model; any other name is
    returned as it is when it can run the model, else a ``ValueError`` says why (``graph`` needs
    CUDA; the engine needs sdpa or eager attention).
    """
    _check_name(choice)
    if choice == AUTO:
        return next(name for name in AUTO_ORDER if _problem(REGISTRY[name], model) is None)
    problem = _problem(REGISTRY[choice], model)
    if problem is not None:
        raise ValueError(problem)
    return choice


def make_decoder(model, ids, mask, readout: StepReadout | None = None, *, mode: str = "fixed",
                 one_position: bool | None = None):
    """The eager decoder for ``model`` on a batch of prompts (the engine is
    :class:`cyb.engine.Engine`).

    Args:
        model: a :class:`cyb.PauseModel` in eval mode.
        ids: ``[B, P]`` prompt ids, left-padded; ``mask``: ``[B, P]``, 1 for tokens, 0 for padding.
        readout: the decision rule (default: greedy, the model's dk id and prior).
        mode: ``"fixed"`` (Recipe 1) or ``"adaptive"`` (Recipe 2).
        one_position: adaptive mode: feed one position per step (True) or whole blocks (False);
            None: the decoder's own rule (see the module docstring).

    Returns:
        an object with ``start()`` and ``step()`` (each returns a
        :class:`~cyb.generation.decoders.StepOutput`), ``positions_per_step``, ``keeps_rows``
        and ``keep(rows)``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if readout is None:
        readout = StepReadout(model.vocab, model.dk_bias)
    return REGISTRY["eager"].build(model, ids, mask, readout, mode=mode, one_position=one_position)

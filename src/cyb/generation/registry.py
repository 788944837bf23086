"""The decoders, in one table: their names, what each is, where each runs, how one is built.

Every place that chooses a decoder asks this module: :class:`~cyb.generation.GenerationConfig`
(``decoder=``, and through it :func:`cyb.generation.generate`), ``cyb generate --decoder``, the
lm-eval model (``decoder=``) and ``cyb bench decode`` (its ``cyb_eager`` and ``cyb_graph`` rows,
and the scripts in ``benchmarks/``).  :data:`DECODERS` are the names a user may give,
:func:`resolve_decoder` says what ``auto`` means for a model and why a name cannot run it, and
:func:`make_decoder` builds the decoder.  All decoders make the same decisions (greedy or
sampled, fixed or adaptive mode); they differ in speed and in the models they support:

* ``graph``: a preallocated KV cache with each decode step replayed as a CUDA graph
  (:mod:`cyb.generation.static`); CUDA only, full-attention models with sdpa or eager attention.
* ``static``: the same decoder with its step run eagerly; any device, the same models.
* ``eager``: a growing ``DynamicCache`` (:mod:`cyb.generation.decoders`); every model, every device.
* ``auto`` (the default of every caller, :data:`DEFAULT`): the first of :data:`AUTO_ORDER` that
  can run the model -- ``graph`` on CUDA where the model supports a static cache, else ``eager``.

Models with private pauses (:mod:`cyb.visibility`) keep real tokens only in the cache:
``eager`` builds :mod:`cyb.generation.private`'s decoders (``one_position`` there means: run
pauses only for the rows that ask for them), ``graph`` and ``static``
:class:`~cyb.generation.static.StaticPrivateDecoder`; fixed and adaptive mode then make the
same decisions.

Models with gated pauses have no cache that holds their gates: ``eager`` builds
:class:`~cyb.generation.decoders.RecomputeFixedDecoder` or ``RecomputeAdaptiveDecoder`` (one
position per step), which run the whole row again for every step; ``graph`` and ``static``
refuse them.

Within a decoder the mode picks the class.  Fixed mode has one; adaptive mode feeds either whole
blocks (the token and its ``M - 1`` pauses, the steps after the stop step masked out: one forward
per real token, greedy only) or one position per step.  ``one_position`` forces that choice;
otherwise the eager decoder feeds blocks when greedy on CUDA for models without sliding-window
layers (a forward of ``M`` positions costs about one of a single position there, and a window
counts the masked-out slots too), and the static decoders whenever greedy.

Adding a decoder: write its class (``start()`` and ``step()`` returning a
:class:`~cyb.generation.decoders.StepOutput`, ``positions_per_step``, ``keeps_rows``,
``prompt_positions``; see the classes of :mod:`cyb.generation.decoders`) and add one
:class:`Decoder` to :data:`REGISTRY` (docs/architecture.md, "Adding a decoder").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..model import hf
from .decoders import (AdaptiveDecoder, BlockAdaptiveDecoder, FixedDecoder, RecomputeAdaptiveDecoder,
                       RecomputeFixedDecoder, StepReadout)
from .private import private_decoder
from .static import StaticAdaptiveDecoder, StaticBlockAdaptiveDecoder, StaticCacheOptions
from .static import StaticFixedDecoder, StaticPrivateDecoder, unsupported_reason


@dataclass(frozen=True)
class Decoder:
    """One entry of :data:`REGISTRY`.

    Attributes:
        name: what users choose (``GenerationConfig.decoder``, ``cyb generate --decoder``).
        summary: one line for help texts.
        build: ``build(model, ids, mask, readout, *, mode, max_new_tokens, one_position,
            cache_options)`` -> the decoder object (see :func:`make_decoder`).
        static_cache: it runs on a preallocated cache, which only full-attention models with
            sdpa or eager attention support (:func:`cyb.generation.static.unsupported_reason`).
        needs_cuda: it runs only with the model on a CUDA device.
        instead: what to use where it cannot run for want of CUDA (an error message's advice).
    """

    name: str
    summary: str
    build: Callable[..., object]
    static_cache: bool = False
    needs_cuda: bool = False
    instead: str = "use 'auto' or 'eager'"


def _eager(model, ids, mask, readout, *, mode, max_new_tokens=None, one_position=None,
           cache_options=None):
    if model.pause_visibility == "private":  # a cache of real tokens (cyb.generation.private)
        return private_decoder(model, ids, mask, readout, mode=mode, sparse=one_position)
    if model.pause_visibility == "gated":  # no cache holds the gates' bias on earlier pauses
        return (RecomputeFixedDecoder if mode == "fixed" else RecomputeAdaptiveDecoder)(model, ids, mask, readout)
    if mode == "fixed":
        return FixedDecoder(model, ids, mask, readout)
    if one_position is None:
        one_position = (readout.random or ids.device.type != "cuda"
                        or hf.has_sliding_window(model.config))
    return (AdaptiveDecoder if one_position else BlockAdaptiveDecoder)(model, ids, mask, readout)


def _static(cuda_graph: bool):
    def build(model, ids, mask, readout, *, mode, max_new_tokens=None, one_position=None,
              cache_options=None):
        if model.pause_visibility == "private":  # one slot per real token, both modes
            return StaticPrivateDecoder(model, ids, mask, readout, max_new_tokens=max_new_tokens,
                                        cuda_graph=cuda_graph, cache_options=cache_options, mode=mode)
        if mode == "fixed":
            cls = StaticFixedDecoder
        else:
            if one_position is None:
                one_position = readout.random
            cls = StaticAdaptiveDecoder if one_position else StaticBlockAdaptiveDecoder
        return cls(model, ids, mask, readout, max_new_tokens=max_new_tokens, cuda_graph=cuda_graph,
                   cache_options=cache_options)
    return build


#: the decoders by name, in the order help texts list them
REGISTRY: dict[str, Decoder] = {d.name: d for d in (
    Decoder("graph", "preallocated KV cache with each step replayed as a CUDA graph (CUDA, "
                     "full-attention models)", _static(cuda_graph=True), static_cache=True,
            needs_cuda=True, instead="use 'auto', 'static' (same decoder without the graph) or 'eager'"),
    Decoder("static", "the same without the graph", _static(cuda_graph=False), static_cache=True),
    Decoder("eager", "a growing DynamicCache (any model, any device)", _eager),
)}
AUTO = "auto"
#: what ``auto`` tries, in order: the first that can run the model
AUTO_ORDER = ("graph", "eager")
#: the names a user may give
DECODERS = (AUTO, *REGISTRY)
#: the decoder of every caller that is not told otherwise
DEFAULT = AUTO
#: the generation modes every decoder runs: Recipe 1 (all pauses) and Recipe 2 (pauses after dk)
MODES = ("fixed", "adaptive")


def describe() -> str:
    """The decoders in one line, for help texts."""
    parts = [f"{d.name} = {d.summary}" for d in REGISTRY.values()]
    return "; ".join(parts + [f"{AUTO} = graph on CUDA where supported, else eager"])


def _check_name(choice: str) -> None:
    if choice not in DECODERS:
        raise ValueError(f"decoder must be one of {DECODERS}, got {choice!r}")


def _problem(entry: Decoder, model) -> str | None:
    """Why ``entry`` cannot run ``model`` where it is (an error message), or None."""
    if entry.static_cache:
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
    CUDA; ``graph`` and ``static`` need a full-attention model).
    """
    _check_name(choice)
    if choice == AUTO:
        return next(name for name in AUTO_ORDER if _problem(REGISTRY[name], model) is None)
    problem = _problem(REGISTRY[choice], model)
    if problem is not None:
        raise ValueError(problem)
    return choice


def make_decoder(name: str, model, ids, mask, readout: StepReadout | None = None, *,
                 mode: str = "fixed", max_new_tokens: int | None = None,
                 one_position: bool | None = None, cache_options: StaticCacheOptions | None = None):
    """The decoder ``name`` (``auto`` is resolved first) for ``model`` on a batch of prompts.

    Args:
        name: one of :data:`DECODERS`.
        model: a :class:`cyb.PauseModel` in eval mode.
        ids: ``[B, P]`` prompt ids, left-padded; ``mask``: ``[B, P]``, 1 for tokens, 0 for padding.
        readout: the decision rule (default: greedy, the model's dk id and prior).
        mode: ``"fixed"`` (Recipe 1) or ``"adaptive"`` (Recipe 2).
        max_new_tokens: real tokens per row at most: sizes the static decoders' cache (they
            need it; the eager decoder grows its cache and ignores it).
        one_position: adaptive mode: feed one position per step (True) or whole blocks (False,
            greedy only); None: the decoder's own rule (see the module docstring).
        cache_options: the static decoders' cache size and attention limits (default: the
            library's); the eager decoder has no such cache and ignores them.

    Returns:
        an object with ``start()`` and ``step()`` (each returns a
        :class:`~cyb.generation.decoders.StepOutput`), ``positions_per_step``, ``keeps_rows``
        and, for the eager decoder, ``keep(rows)``.
    """
    _check_name(name)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if name == AUTO:
        name = resolve_decoder(model, name)
    if readout is None:
        readout = StepReadout(model.vocab, model.dk_bias)
    return REGISTRY[name].build(model, ids, mask, readout, mode=mode, max_new_tokens=max_new_tokens,
                                one_position=one_position, cache_options=cache_options)

"""What the engine of this checkout offers, asked in one place, so that the size benchmark runs
on an engine whose rows are one slot of ``max_model_len`` columns each and picks up paged rows,
prefix caching and preemption where the engine has them.

* :data:`OPTIONS`: :class:`cyb.engine.EngineOptions` fields the benchmark sets when they exist:
  ``block_size`` (columns a cache block holds), ``prefix_caching`` (reuse the blocks of a
  shared prompt prefix; None: the engine's default) and ``step_budget`` (prompts written inside
  the decoding steps).
* :data:`STATS`: ``Engine.stats`` counters it reports when they exist: prefix blocks found and
  looked up, rows preempted, and mixed steps.

A field or counter the engine lacks reads None, which the benchmark's JSON and tables show as
"n/a".
"""

from __future__ import annotations

import dataclasses

#: EngineOptions fields that not every engine has
OPTIONS = ("block_size", "prefix_caching", "step_budget")
#: Engine.stats counters that not every engine has
STATS = ("prefix_hit_blocks", "prefix_lookup_blocks", "preemptions", "mixed_steps")


def option_fields() -> set[str]:
    """The fields of this checkout's :class:`cyb.engine.EngineOptions`."""
    from ..engine import EngineOptions

    return {f.name for f in dataclasses.fields(EngineOptions)}


def has_option(name: str) -> bool:
    """Whether :class:`cyb.engine.EngineOptions` has the field ``name``."""
    return name in option_fields()


def engine_options(**fields):
    """``(EngineOptions, dropped)``: the options with every field this engine has; a field of
    :data:`OPTIONS` it lacks is left out and named in ``dropped`` (None values are left out too:
    the engine's default).  Any other unknown field is an error, as it is for EngineOptions."""
    from ..engine import EngineOptions

    known = option_fields()
    given = {k: v for k, v in fields.items() if v is not None}
    dropped = [k for k in given if k in OPTIONS and k not in known]
    return EngineOptions(**{k: v for k, v in given.items() if k not in dropped}), dropped


def stat(stats: dict, name: str):
    """Counter ``name`` of an engine's ``stats`` (or a difference of two), None when the engine
    does not count it."""
    return stats.get(name)


def features() -> dict:
    """What this engine offers: ``{"options": {name: bool}, "paged": bool}``; ``paged``: its
    cache takes blocks (``block_size`` exists)."""
    known = option_fields()
    return {"options": {k: k in known for k in OPTIONS}, "paged": "block_size" in known}


def prefix_hit_rate(stats: dict) -> float | None:
    """Prefix blocks found over blocks looked up, None when not counted (or nothing looked up)."""
    hit, looked = stat(stats, "prefix_hit_blocks"), stat(stats, "prefix_lookup_blocks")
    if hit is None or not looked:
        return None
    return hit / looked


__all__ = ["OPTIONS", "STATS", "engine_options", "features", "has_option", "option_fields", "prefix_hit_rate",
           "stat"]

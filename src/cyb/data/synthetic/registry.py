"""Task registry: names to task classes."""

from __future__ import annotations

import dataclasses

from .arithmetic import Addition, Multiplication
from .base import Task
from .lookup import VariableLookup
from .parity import Parity
from .three_sum import ThreeSum

TASKS: dict[str, type[Task]] = {
    cls.name: cls for cls in (Addition, Multiplication, ThreeSum, Parity, VariableLookup)
}


def make_task(name: str, **size_kwargs) -> Task:
    """Build the task registered as ``name`` (see :data:`TASKS`) with the given sizes.

    Raises ValueError for an unknown name, an unknown size argument, or a size out of range.
    """
    if name not in TASKS:
        raise ValueError(f"unknown synthetic task {name!r}; choose one of {sorted(TASKS)}")
    cls = TASKS[name]
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(size_kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"task {name!r} takes size arguments {allowed}, got unknown {unknown}")
    return cls(**size_kwargs)

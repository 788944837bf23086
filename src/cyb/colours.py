"""The pause colour scale, shared by terminal shading and HTML pages: white (no pause) to dark
blue (every pause), linear in RGB."""

from __future__ import annotations

import math

WHITE = (255, 255, 255)
DARK_BLUE = (8, 48, 107)


def pause_rgb(fraction: float) -> tuple[int, int, int]:
    """The colour at ``fraction`` of the scale (clipped to ``[0, 1]``; non-finite -> white).
    Every channel is non-increasing in ``fraction``."""
    f = min(max(fraction, 0.0), 1.0) if math.isfinite(fraction) else 0.0
    return tuple(round(w + (b - w) * f) for w, b in zip(WHITE, DARK_BLUE))  # type: ignore[return-value]


def is_light(rgb: tuple[int, int, int]) -> bool:
    """Whether black text reads better than white on ``rgb`` (perceived brightness)."""
    return 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 140


def hex_colour(rgb: tuple[int, int, int]) -> str:
    return "#{:02x}{:02x}{:02x}".format(*rgb)


__all__ = ["DARK_BLUE", "WHITE", "hex_colour", "is_light", "pause_rgb"]

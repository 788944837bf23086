"""Terminal shading by steps used: white (1 step) to dark blue (``M`` steps), ANSI escapes.

Truecolor (``ESC[48;2;R;G;Bm``) where the terminal says it supports it (``COLORTERM`` is
``truecolor`` or ``24bit``), else the nearest colour of the 256-colour cube (``ESC[48;5;Nm``).
"""

from __future__ import annotations

import os

from ..colours import is_light, pause_rgb

RESET = "\x1b[0m"


def supports_truecolor(env=None) -> bool:
    """Whether the terminal advertises 24-bit colour (``COLORTERM``)."""
    env = os.environ if env is None else env
    return env.get("COLORTERM", "").lower() in ("truecolor", "24bit")


def step_rgb(steps: int, num_steps: int) -> tuple[int, int, int]:
    """Colour of a token that used ``steps`` of ``num_steps`` (linear from white to dark blue)."""
    return pause_rgb(0.0 if num_steps <= 1 else (steps - 1) / (num_steps - 1))


def _cube(rgb: tuple[int, int, int]) -> int:
    r, g, b = (round(c / 255 * 5) for c in rgb)
    return 16 + 36 * r + 6 * g + b


def escape(rgb: tuple[int, int, int], truecolor: bool) -> str:
    """Background escape for ``rgb``, with black or white text, whichever reads better."""
    fg = "\x1b[30m" if is_light(rgb) else "\x1b[97m"
    if truecolor:
        return f"\x1b[48;2;{rgb[0]};{rgb[1]};{rgb[2]}m{fg}"
    return f"\x1b[48;5;{_cube(rgb)}m{fg}"


NEWLINE_MARK = "\u21b5"  # a line break is shown as this mark on its colour, then broken


def shade(text: str, steps: int, num_steps: int, *, truecolor: bool) -> str:
    """``text`` on the background of its step count; a line break shows as ``↵`` on that
    background before the break, so tokens that are only line breaks stay visible."""
    if not text:
        return ""
    code = escape(step_rgb(steps, num_steps), truecolor)
    parts = text.split("\n")
    return "\n".join(f"{code}{part}{NEWLINE_MARK if i < len(parts) - 1 else ''}{RESET}"
                     if part or i < len(parts) - 1 else "" for i, part in enumerate(parts))


def legend(num_steps: int, *, truecolor: bool) -> str:
    """One line: each step count ``1..M`` on its colour, and what the ends mean (a model without
    pauses, ``M = 1``, says so)."""
    cells = " ".join(shade(f" {i} ", i, num_steps, truecolor=truecolor) for i in range(1, num_steps + 1))
    if num_steps == 1:
        return f"steps used per token (M = 1: the model has no pauses, every token takes 1 step): {cells}"
    pauses = "its pause" if num_steps == 2 else f"all {num_steps - 1} pauses"
    return f"steps used per token (1 = no pause, {num_steps} = {pauses}): {cells}"

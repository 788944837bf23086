"""What makes a Hugging Face causal LM a pause model: ``PauseSettings`` (``cyb_pause.json``).

The settings live beside the weights in ``cyb_pause.json``; the weights folder itself stays a
plain Hugging Face checkpoint.  The file records ``M``, the pause and dk ids, the token strings
they were given, the dk prior and the position scheme, so a saved model reloads exactly as it
was trained.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ..layout import POSITION_SCHEMES, PauseVocab
from ..readout import DEFAULT_PSI_DK, dk_logit_bias
from ..visibility import DEFAULT_VISIBILITY, VISIBILITIES

SETTINGS_FILE = "cyb_pause.json"
#: Written by ``cyb train`` beside a final model: the step and epochs it was trained for.
TRAINING_STATE_FILE = "training_state.json"
FORMAT = "cyb.PauseSettings"
FORMAT_VERSION = 1


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class _Default:
    """Marks an argument left at its default (so ``psi_dk=None``, "no prior", stays distinct)."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT = _Default()


@dataclass(frozen=True)
class PauseSettings:
    """The pause layout of a model (JSON-serialisable; saved as ``cyb_pause.json``).

    Attributes:
        num_steps: ``M`` >= 1, steps per real token (the token and ``M-1`` pauses).
        pause_ids: ids fed at steps ``2..M`` (length ``M-1``); distinct for the ``"shared"``
            scheme, one repeated id for ``"advance"`` (original TBYS).
        vocab_size: rows of the model's output projection (``|V|``, dk included).
        dk_id: the ``<don't know>`` id, or None (baseline, TBYS).
        psi_dk: the dk prior probability ``psi'_dk`` in (0, 1), or None for no prior.  Always
            None without a dk id.
        position_scheme: ``"shared"`` (a pause takes its real token's position) or
            ``"advance"`` (pauses advance positions).
        method: informational label (``"cyb"``, ``"tbys"``, ``"baseline"``, ...).
        pause_tokens: the token strings of ``pause_ids`` (same length), or ``()`` when the
            ids were reserved without a tokenizer.
        dk_token: the token string of ``dk_id``, or None.
        pause_visibility: what later tokens see of a token's pauses (:mod:`cyb.visibility`):
            ``"shared"`` (the paper's layout: everything) or ``"private"`` (nothing: each
            token's pauses are seen only by its own later steps).
        format_version: version of this file format.
    """

    num_steps: int
    pause_ids: tuple[int, ...]
    vocab_size: int
    dk_id: int | None = None
    psi_dk: float | None = DEFAULT_PSI_DK
    position_scheme: str = "shared"
    method: str = "cyb"
    pause_tokens: tuple[str, ...] = ()
    dk_token: str | None = None
    pause_visibility: str = DEFAULT_VISIBILITY
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "pause_ids", tuple(self.pause_ids))
        object.__setattr__(self, "pause_tokens", tuple(self.pause_tokens))
        if self.format_version != FORMAT_VERSION:
            raise ValueError(
                f"format_version {self.format_version!r} is not supported (this code reads "
                f"version {FORMAT_VERSION})"
            )
        if self.position_scheme not in POSITION_SCHEMES:
            raise ValueError(
                f"position_scheme must be one of {POSITION_SCHEMES}, got {self.position_scheme!r}"
            )
        if self.position_scheme == "advance" and len(set(self.pause_ids)) > 1:
            raise ValueError(
                "position_scheme='advance' (original TBYS) uses one shared pause id, got "
                f"pause_ids={list(self.pause_ids)}"
            )
        if not _is_int(self.vocab_size) or self.vocab_size < 2:
            raise ValueError(f"vocab_size must be an int >= 2, got {self.vocab_size!r}")
        if self.dk_id is None:
            object.__setattr__(self, "psi_dk", None)
            if self.dk_token is not None:
                raise ValueError(f"dk_token={self.dk_token!r} given without a dk_id")
        elif self.psi_dk is not None:
            p = self.psi_dk
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p < 1.0:
                raise ValueError(
                    f"psi_dk (the dk prior probability) must lie in (0, 1) or be None, got {p!r}")
            object.__setattr__(self, "psi_dk", float(p))
        if self.pause_tokens and len(self.pause_tokens) != len(self.pause_ids):
            raise ValueError(
                f"pause_tokens must name each pause id: {len(self.pause_ids)} ids, "
                f"{len(self.pause_tokens)} tokens"
            )
        if not isinstance(self.method, str) or not self.method:
            raise ValueError(f"method must be a non-empty string label, got {self.method!r}")
        if self.pause_visibility not in VISIBILITIES:
            raise ValueError(f"pause_visibility must be one of {VISIBILITIES}, got {self.pause_visibility!r}")
        self.vocab()  # validates M, the ids, their range and collisions

    # ------------------------------------------------------------------ derived views
    @property
    def use_dk(self) -> bool:
        """Whether the model has a ``<don't know>`` output."""
        return self.dk_id is not None

    def vocab(self) -> PauseVocab:
        """The :class:`cyb.layout.PauseVocab` used by ``expand`` and the readout."""
        return PauseVocab(
            num_steps=self.num_steps,
            pause_ids=self.pause_ids,
            dk_id=self.dk_id,
            vocab_size=self.vocab_size,
            position_scheme=self.position_scheme,  # type: ignore[arg-type]
        )

    def dk_bias(self, vocab_size: int | None = None) -> float:
        """The dk prior as an offset on the dk logit (0.0 without dk or without a prior).

        ``vocab_size`` defaults to :attr:`vocab_size`.
        """
        if self.dk_id is None or self.psi_dk is None:
            return 0.0
        return dk_logit_bias(self.vocab_size if vocab_size is None else vocab_size, self.psi_dk)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        """A JSON-ready dict (lists for tuples) with a ``format`` tag."""
        data = asdict(self)
        data["pause_ids"] = list(self.pause_ids)
        data["pause_tokens"] = list(self.pause_tokens)
        return {"format": FORMAT, **data}

    @classmethod
    def from_dict(cls, data: dict) -> "PauseSettings":
        """Inverse of :meth:`to_dict`; unknown keys or another format are errors."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not pause settings (expected format {FORMAT!r})")
        body = {k: v for k, v in data.items() if k != "format"}
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(body) - known)
        if unknown:
            raise ValueError(f"unknown fields in pause settings: {unknown}")
        if body.get("format_version", FORMAT_VERSION) != FORMAT_VERSION:
            raise ValueError(
                f"pause settings format_version {body.get('format_version')!r} is not supported "
                f"(this code reads version {FORMAT_VERSION})"
            )
        psi = body.get("psi_dk")
        if isinstance(psi, float) and not math.isfinite(psi):
            raise ValueError(f"psi_dk must be finite, got {psi!r}")
        return cls(**body)

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``<directory>/cyb_pause.json`` atomically and return its path."""
        from ..files import write_json_atomic

        return write_json_atomic(Path(directory) / SETTINGS_FILE, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PauseSettings":
        """Read ``cyb_pause.json`` (give the file or the folder holding it)."""
        path = Path(path)
        if path.is_dir():
            path = path / SETTINGS_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no pause settings at {path}")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from e
        return cls.from_dict(data)


# ------------------------------------------------------------------ set-up arguments


def resolve_arguments(num_steps, use_dk, psi_dk, position_scheme, method, pause_visibility=DEFAULT):
    """Fill in the defaults of the set-up arguments:
    ``(M, use_dk, psi_dk, scheme, method, visibility)``.

    ``use_dk`` defaults to ``M > 1``, ``psi_dk`` to 0.9 (None without dk), the scheme to
    ``"shared"``, the method label to ``"cyb"`` / ``"tbys"`` / ``"baseline"``, the pause
    visibility to ``"shared"``.
    """
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
        raise ValueError(f"num_steps (M) must be an integer >= 1, got {num_steps!r}")
    use_dk = (num_steps > 1) if use_dk is DEFAULT else bool(use_dk)
    psi_dk = DEFAULT_PSI_DK if psi_dk is DEFAULT else psi_dk
    position_scheme = "shared" if position_scheme is DEFAULT else position_scheme
    if method is None:
        from ..methods import infer

        method = infer(use_dk, num_steps)
    # Checked here too, before any tokenizer or model is changed.
    if position_scheme not in POSITION_SCHEMES:
        raise ValueError(f"position_scheme must be one of {POSITION_SCHEMES}, got {position_scheme!r}")
    if use_dk and psi_dk is not None and (
        isinstance(psi_dk, bool) or not isinstance(psi_dk, (int, float)) or not 0.0 < psi_dk < 1.0
    ):
        raise ValueError(f"psi_dk (the dk prior probability) must lie in (0, 1) or be None, got {psi_dk!r}")
    if not isinstance(method, str) or not method:
        raise ValueError(f"method must be a non-empty string label, got {method!r}")
    pause_visibility = DEFAULT_VISIBILITY if pause_visibility is DEFAULT else pause_visibility
    if pause_visibility not in VISIBILITIES:
        raise ValueError(f"pause_visibility must be one of {VISIBILITIES}, got {pause_visibility!r}")
    return num_steps, use_dk, (psi_dk if use_dk else None), position_scheme, method, pause_visibility


def settings_to_load(saved: PauseSettings | None, where, *, reconfigure: bool, pause_visibility,
                     **given) -> PauseSettings | None:
    """The saved settings ``from_pretrained`` loads a model with, given the arguments it got:
    ``saved`` when they agree (ValueError naming the first that does not, unless
    ``reconfigure``), None when ``reconfigure`` asks for other pause settings (the model is then
    set up anew), ``saved`` with the visibility replaced when only that differs."""
    if saved is not None and reconfigure and given.get("num_steps") is not None and not agrees(saved, **given):
        return None  # fine-tune a saved pause model with other pause settings
    if (saved is not None and reconfigure and pause_visibility is not DEFAULT
            and pause_visibility != saved.pause_visibility):
        saved = dataclasses.replace(saved, pause_visibility=pause_visibility)
    if saved is not None:
        check_agrees(saved, where, pause_visibility=pause_visibility, **given)
    return saved


def agrees(saved: PauseSettings, **given) -> bool:
    """Whether the arguments given to ``from_pretrained`` agree with the saved settings."""
    try:
        check_agrees(saved, "the saved settings", **given)
    except ValueError:
        return False
    return True


def check_agrees(saved: PauseSettings, where, **given) -> None:
    """Raise if an argument given to ``from_pretrained`` contradicts the saved settings."""
    have = {
        "num_steps": saved.num_steps,
        "use_dk": saved.use_dk,
        "psi_dk": saved.psi_dk,
        "position_scheme": saved.position_scheme,
        "method": saved.method,
        "pause_visibility": saved.pause_visibility,
    }
    for key, value in given.items():
        if value is DEFAULT or (value is None and key in ("num_steps", "method")):
            continue
        if key == "psi_dk" and not saved.use_dk:
            continue  # no dk: the prior does not exist
        if value != have[key]:
            raise ValueError(
                f"{key}={value!r} disagrees with {where} ({key}={have[key]!r}); leave it out to use "
                "the saved value"
            )

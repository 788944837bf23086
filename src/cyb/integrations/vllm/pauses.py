"""What the vLLM plugin knows of a saved pause model, without vLLM: which folders it serves, why
it refuses the others, how a prompt is laid out and how steps are read back from an output.

Nothing here imports vLLM, so clients (and the tests of the main environment) use it as they
are: :func:`steps_per_token` reads the steps of each token from a vLLM output.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ...model.settings import SETTINGS_FILE, PauseSettings

MODES = ("fixed", "adaptive")
#: what every refusal points to
CYB_SERVE = "serve it with `cyb serve MODEL` instead"


class Unservable(ValueError):
    """A pause model that vLLM cannot run; the message is one line that says why."""


@dataclass(frozen=True)
class ServedPauses:
    """The pause layout of a model that vLLM serves.

    Attributes:
        num_steps: ``M``.
        pause_ids: ``<pause_1> .. <pause_{M-1}>`` (one repeated id with advance positions).
        dk_id: the ``<don't know>`` id, or None (TBYS, baselines).
        dk_bias: the dk prior, an offset on the dk logit.
        position_scheme: ``"shared"`` (a pause takes its token's position; vLLM's positions are
            divided by ``M``) or ``"advance"`` (pauses advance positions: the plain model).
        default_mode: the mode of a request that names none: adaptive for a model with dk whose
            pauses advance positions, fixed otherwise.
    """

    num_steps: int
    pause_ids: tuple[int, ...]
    dk_id: int | None
    dk_bias: float
    position_scheme: str

    @classmethod
    def of(cls, settings: PauseSettings) -> "ServedPauses":
        return cls(settings.num_steps, tuple(settings.pause_ids), settings.dk_id, settings.dk_bias(),
                   settings.position_scheme)

    @property
    def shared_positions(self) -> bool:
        return self.position_scheme == "shared"

    @property
    def default_mode(self) -> str:
        return "adaptive" if self.dk_id is not None and not self.shared_positions else "fixed"

    @property
    def special_ids(self) -> frozenset:
        return frozenset(self.pause_ids) | ({self.dk_id} if self.dk_id is not None else frozenset())

    def mode_error(self, mode) -> str | None:
        """Why a request may not ask for ``mode``, or None."""
        return mode_error(mode, self.shared_positions and self.num_steps > 1)

    def layout(self, ids: Sequence[int]) -> list[int]:
        """The prompt as training laid it out: every token but the last followed by its
        ``M - 1`` pauses (the first decoding step reads the last token's first step).  Raises
        :class:`ValueError` for an empty prompt or one holding pause or dk ids."""
        if not ids:
            raise ValueError("the prompt is empty: a pause model needs at least one prompt token")
        special = self.special_ids
        for i, t in enumerate(ids):
            if t in special:
                raise ValueError(f"prompt token {i} is id {t}, reserved for pauses and <don't know> "
                                 f"(pause ids {list(self.pause_ids)}, dk id {self.dk_id})")
        pauses = list(self.pause_ids)
        out: list[int] = []
        for t in ids[:-1]:
            out.append(int(t))
            out += pauses
        out.append(int(ids[-1]))
        return out


def mode_error(mode, shared_positions: bool) -> str | None:
    """Why a request may not ask for ``mode`` of a model whose pauses share their token's position
    (``shared_positions``) or not, or None."""
    if mode not in MODES:
        return f"mode must be one of {', '.join(MODES)} (extra_args), got {mode!r}"
    if mode == "adaptive" and shared_positions:
        return ("mode 'adaptive' needs per-request position offsets that vLLM's model forward does not see "
                "(this model's pauses share their token's position): ask for mode 'fixed', or serve it with "
                "`cyb serve MODEL` for adaptive decoding")
    return None


def settings_of(folder) -> PauseSettings | None:
    """The pause settings saved in a model folder, or None when it holds none."""
    path = Path(str(folder)) / SETTINGS_FILE
    return PauseSettings.load(path) if path.is_file() else None


def refusal(folder, settings: PauseSettings) -> str | None:
    """Why vLLM cannot serve the saved pause model in ``folder``, in one line, or None."""
    from ...model.lora import LORA_FILE
    from ...model.pause_adapters import CONFIG_FILE as PAUSE_ADAPTERS_FILE

    folder = Path(str(folder))
    name = f"{folder}:"
    if settings.pause_visibility in ("private", "gated"):
        what = ("hides other tokens' pauses" if settings.pause_visibility == "private"
                else "adds a learned gate to other tokens' pauses")
        return (f"{name} its pauses are {settings.pause_visibility}: attention that {what}, which vLLM's "
                f"attention backends do not offer; {CYB_SERVE}")
    if (folder / LORA_FILE).is_file():
        return (f"{name} it holds LoRA adapters and pause rows apart from the base model: merge them first "
                "(`cyb merge`) or " + CYB_SERVE)
    if (folder / PAUSE_ADAPTERS_FILE).is_file():
        return (f"{name} it has pause-step adapters (weights that act at pause positions only), which vLLM's "
                f"model does not apply; {CYB_SERVE}")
    if not (folder / "config.json").is_file():
        return f"{name} it has no config.json (not a Hugging Face model folder); {CYB_SERVE}"
    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return (f"{name} it has no Hugging Face tokenizer (a character tokenizer, or none), which vLLM needs; "
                f"{CYB_SERVE}")
    return None


def read_config(folder) -> dict:
    return json.loads((Path(str(folder)) / "config.json").read_text(encoding="utf-8"))


def steps_per_token(token_ids: Sequence[int], pause_ids: Sequence[int], codes: Sequence[float] | None = None,
                    ) -> list[int]:
    """Steps of each real token of a vLLM output (``1`` = no pause), in order.

    Args:
        token_ids: the output's ids as vLLM returns them (pauses included).
        pause_ids: the model's pause ids (:attr:`ServedPauses.pause_ids`, or the ``pause_ids``
            of its ``cyb_pause.json``).
        codes: what the plugin writes as each output token's logprob (vLLM's ``logprobs`` of
            the sampled tokens, asked for with ``logprobs=0`` under the plugin's
            ``processed_logits`` mode): a real token's steps.  Fixed mode feeds every pause
            whatever the readout decided, so its steps are only in these; without them the
            steps are counted from the pauses fed before each token (adaptive mode's steps).

    Pauses at the end that no token followed yet (an output cut by ``max_tokens``) count for
    nothing.
    """
    pauses = set(int(p) for p in pause_ids)
    if codes is not None and len(codes) != len(token_ids):
        raise ValueError(f"codes must hold one value per output token: {len(token_ids)} ids, {len(codes)} codes")
    out, run = [], 0
    for k, t in enumerate(token_ids):
        if int(t) in pauses:
            run += 1
            continue
        if codes is not None:
            c = codes[k]
            if c is None or not math.isfinite(float(c)) or round(float(c)) < 1:
                raise ValueError(f"output token {k} has no step in codes ({c!r}): ask vLLM for logprobs=0 "
                                 "of a server that runs the plugin's processed_logits mode")
            out.append(int(round(float(c))))
        else:
            out.append(run + 1)
        run = 0
    return out


def real_tokens(token_ids: Sequence[int], pause_ids: Sequence[int]) -> list[int]:
    """The output's ids without its pauses."""
    pauses = set(int(p) for p in pause_ids)
    return [int(t) for t in token_ids if int(t) not in pauses]


__all__ = ["CYB_SERVE", "MODES", "ServedPauses", "Unservable", "mode_error", "read_config", "real_tokens", "refusal",
           "settings_of", "steps_per_token"]

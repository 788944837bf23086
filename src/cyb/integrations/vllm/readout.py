"""The readout of a pause model as a vLLM logits processor, on both of vLLM's model runners.

vLLM samples one token per request per step and feeds it back; a pause model's token is the
readout of a block of ``M`` steps (:mod:`cyb.decision`).  The readout makes vLLM's sampled
token the token cyb's engine feeds at that step: for every request of the batch it finds which
step of its current block comes next (the pauses at the end of what was fed: none, step 1) and
which token it is deciding (the real tokens of its output), decides as cyb's engine decides
(:class:`cyb.engine` rows with one position per step), and leaves one finite logit: the token
to feed.

* The dk prior is added to the dk logit; dk is taken when it beats the best real token (greedy,
  ties to the smaller id) or, sampling, when the request's uniform of that step is below ``d``;
  the token is the best real token or a draw from the tempered, top-k/top-p cut distribution
  without dk and the pauses.  The uniforms come from the request's own stream
  (:func:`cyb.decision.stream_uniforms` of its key and the token's index): a request with
  ``seed`` s draws what ``cyb.generation.generate(prompt, seed=s)`` draws, whatever else runs.
* **Adaptive mode**: on dk the only token left is the next ``<pause_i>``, else the answer; at
  step ``M`` dk and the pauses are banned.
* **Fixed mode**: every step before ``M`` feeds the next pause whatever the readout says; the
  readout of each step is kept, and step ``M`` feeds the answer of the first step that answered.

The one finite logit is the token's *step code*: the step the token was read at for a real token
(its steps, ``1 .. M``), 0 for a pause.  Under vLLM's ``processed_logits`` logprobs mode (the
plugin's default for pause models) that is the logprob vLLM returns with each sampled token, so
:func:`cyb.integrations.vllm.pauses.steps_per_token` reads fixed mode's steps from an output.

vLLM 0.32 runs one of two model runners, whose logits processors differ.  The classes this
module hands vLLM (:func:`readout_class`) subclass both interfaces, so either loader takes them,
and keep their state the way the runner at hand calls them:

* the V1 runner (the CPU build; ``VLLM_USE_V2_MODEL_RUNNER=0``): rows by batch index, moved by
  ``update_state``, each request's output read from vLLM's live list
  (:mod:`~cyb.integrations.vllm.readout_v1`);
* Model Runner V2 (vLLM's default wherever triton has a GPU backend): state by request slot
  from ``add_request``, rows mapped to slots anew each step, the tokens fed read from the
  runner's own token table on the device (:mod:`~cyb.integrations.vllm.readout_v2`).

vLLM's own sampling (temperature, top-k, top-p, seed) picks the only token left; its settings
are read here as the readout's.  Settings that would change the logits after the readout
(penalties, bias, banned or allowed words, structured output) are refused per request.
"""

from __future__ import annotations

import json

import torch

from .pauses import ServedPauses, mode_error

#: the attribute of vLLM's Hugging Face config that carries the pause layout (JSON)
CONFIG_KEY = "cyb_pauses"


def pauses_of(hf_config) -> ServedPauses | None:
    """The pause layout the plugin put into vLLM's model config, or None (not a pause model)."""
    data = getattr(hf_config, CONFIG_KEY, None)
    if not data:
        return None
    d = json.loads(data) if isinstance(data, str) else dict(data)
    return ServedPauses(int(d["num_steps"]), tuple(int(p) for p in d["pause_ids"]),
                        None if d["dk_id"] is None else int(d["dk_id"]), float(d["dk_bias"]),
                        str(d["position_scheme"]))


def config_value(pauses: ServedPauses) -> str:
    """What :func:`pauses_of` reads back (a JSON string: vLLM's config overrides keep it as is)."""
    return json.dumps({"num_steps": pauses.num_steps, "pause_ids": list(pauses.pause_ids),
                       "dk_id": pauses.dk_id, "dk_bias": pauses.dk_bias,
                       "position_scheme": pauses.position_scheme})


def _neutral(params) -> str | None:
    """The first sampling setting that would change the logits after the readout, or None."""
    checks = (
        ("presence_penalty", lambda v: v not in (None, 0, 0.0)),
        ("frequency_penalty", lambda v: v not in (None, 0, 0.0)),
        ("repetition_penalty", lambda v: v not in (None, 1, 1.0)),
        ("logit_bias", lambda v: bool(v)),
        ("min_tokens", lambda v: bool(v)),
        ("bad_words", lambda v: bool(v)),
        ("allowed_token_ids", lambda v: v is not None),
        ("structured_outputs", lambda v: v is not None),
    )
    for name, bad in checks:
        if bad(getattr(params, name, None)):
            return name
    return None


class PauseReadout:
    """The readout (see the module docstring).  vLLM builds it with ``(vllm_config, device,
    is_pin_memory)`` on the V1 runner and ``(vllm_config, req_states)`` on Model Runner V2; it
    keeps its state in the matching helper and forwards each runner's calls to it.  The plugin
    hands vLLM a subclass that knows the model's position scheme (:func:`readout_class`), so
    that a request's mode is checked when it arrives."""

    #: whether the model's pauses share their token's position (adaptive mode refused)
    shared_positions = True
    default_mode = "fixed"

    @classmethod
    def validate_params(cls, params) -> None:
        extra = params.extra_args or {}
        error = mode_error(extra.get("mode", cls.default_mode), cls.shared_positions)
        if error is not None:
            raise ValueError(error)
        if params.skip_special_tokens is False:
            raise ValueError("skip_special_tokens: must stay true for a pause model (the text would hold its "
                             "pause tokens)")
        bad = _neutral(params)
        if bad is not None:
            raise ValueError(f"{bad}: not offered for a pause model (the readout decides every token from the "
                             "model's logits); leave it at its default")

    def __init__(self, vllm_config, device_or_states, is_pin_memory: bool | None = None) -> None:
        self.pauses = pauses_of(vllm_config.model_config.hf_config)
        if hasattr(device_or_states, "all_token_ids"):  # Model Runner V2's LogitsProcRequestState
            from .readout_v2 import SlotReadout

            self.state = SlotReadout(self.pauses, device_or_states) if self.pauses is not None else None
        else:
            from .readout_v1 import RowReadout

            self.state = RowReadout(self.pauses) if self.pauses is not None else None

    # -- both runners
    def apply(self, logits: torch.Tensor, ctx=None) -> torch.Tensor:
        if self.state is None:
            return logits
        return self.state.apply(logits) if ctx is None else self.state.apply(logits, ctx)

    # -- the V1 runner
    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        if self.state is not None:
            self.state.update_state(batch_update)

    # -- Model Runner V2
    def add_request(self, req_idx: int, sampling_params) -> bool:
        if self.state is None:
            return False
        self.state.add_request(req_idx, sampling_params)
        return True

    def apply_staged_writes(self) -> None:
        if self.state is not None:
            self.state.apply_staged_writes()


def readout_class(pauses: ServedPauses) -> str:
    """The qualified name of the readout class for ``pauses`` (what vLLM's
    ``logits_processors`` takes)."""
    name = "SharedPositionsReadout" if pauses.shared_positions and pauses.num_steps > 1 else (
        "AdaptiveReadout" if pauses.default_mode == "adaptive" else "AdvancePositionsReadout")
    return f"{__name__}:{name}"


def _subclass(name: str, shared: bool, mode: str):
    from vllm.v1.sample.logits_processor import LogitsProcessor as V1Processor
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2Processor

    return type(name, (PauseReadout, V1Processor, V2Processor),
                {"shared_positions": shared, "default_mode": mode, "__module__": __name__})


def __getattr__(name: str):
    # built on first use, so that importing this module needs no vLLM
    kinds = {"SharedPositionsReadout": (True, "fixed"), "AdvancePositionsReadout": (False, "fixed"),
             "AdaptiveReadout": (False, "adaptive")}
    if name in kinds:
        cls = _subclass(name, *kinds[name])
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CONFIG_KEY", "PauseReadout", "config_value", "pauses_of", "readout_class"]

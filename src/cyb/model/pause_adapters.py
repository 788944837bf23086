"""Pause-step adapters: low-rank weights of their own for the positions whose input is a pause.

With ``method.pause_adapter_rank = r`` every chosen projection ``W`` (by default the attention and
MLP projections of every block) computes, at position ``p``::

    y_p = W x_p + [input_p is a pause] * (alpha / r) * B (A dropout(x_p))

with ``A`` ``[r, in]`` drawn as peft draws LoRA's ``A`` and ``B`` ``[out, r]`` starting at zero.  At
initialisation the model computes exactly what it computed without adapters, and real-token
positions (step 1 of every block) never see the adapters: under private pauses the real-token
stream of a wrapped pretrained model stays the base model's whatever the adapters learn, while
the pause steps get capacity of their own (as Think-at-Hard's adapters act only on its extra
iterations).  The rest of the model trains as the run says: every weight (full fine-tuning), LoRA
adapters (``lora.rank > 0``), or nothing (``method.pause_adapter_base: freeze``: only the pause
adapters and the embedding rows of the pause and dk tokens train, :func:`freeze_base`).

**Which positions are pauses.** Exactly those whose input id is a pause id, in every layout and
every path: Recipe 1 and 2 rows in training, the prompts and decoding steps of the engine and
of the eager decoders, the no-cache references.  A forward pre-hook on the Hugging Face decoder
reads each call's ``input_ids`` and keeps where they equal a pause id (on the device, with no
host read or copy, so a CUDA graph captures it); a forward hook on each adapted projection adds the
masked delta.  Nothing is patched: the hooks and parameters are put on module instances
(``register_parameter``, ``register_forward_hook``), the adapters act on the projections
(outside any attention kernel, so FlexAttention and SDPA paths are the same), and they live in
their layer (sharded with it under FSDP, recomputed with it under activation checkpointing:
a checkpointed layer recomputes in backward with the mask of the latest forward, so the
backward of a forward must come before the next forward, as in cyb's training loop).

Under LoRA (peft) the adapters sit on peft's base layer (``q_proj.base_layer``): peft's own
adapter is added on top, merging it (``cyb merge``) keeps them, and they are named as without
peft in the files.

**Files.** A saved model keeps them beside its weights: ``pause_adapters.json`` (rank, alpha,
dropout, targets) and ``pause_adapters.safetensors`` (float32 ``A`` and ``B`` of every adapted
projection, keyed ``model.layers.0.self_attn.q_proj.pause_adapter_a``).  The weights file holds
the base model only, so plain ``transformers`` loads the base (what the model computes at real
positions) and :meth:`PauseModel.from_pretrained` puts the adapters back.  A merged model cannot
fold them into its weights (they act at pause positions only): ``cyb merge`` folds LoRA into the
base and writes the pause adapters beside it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from . import hf

CONFIG_FILE = "pause_adapters.json"
WEIGHTS_FILE = "pause_adapters.safetensors"
FORMAT = "cyb.PauseAdapters"
A_NAME, B_NAME = "pause_adapter_a", "pause_adapter_b"
BASES = ("train", "freeze")
#: Set on a parameter that must not be weight-decayed (:mod:`cyb.optim` reads it): the frozen
#: embedding of :func:`freeze_base`, whose rows other than the pause and dk rows get no gradient.
NO_DECAY_ATTR = "_cyb_no_weight_decay"
# The adapters' state on the Hugging Face model (kept out of its submodules: no state-dict keys).
_STATE_ATTR = "_cyb_pause_adapters"


@dataclass(frozen=True)
class PauseAdapterSpec:
    """What :func:`add_pause_adapters` adds: rank ``r`` >= 1, ``alpha`` > 0 (the delta is scaled by
    ``alpha / r``), ``dropout`` in [0, 1) on the adapters' input, ``targets``: module names
    matched at the end of each module's path (``q_proj`` ...)."""

    rank: int
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def __post_init__(self) -> None:
        object.__setattr__(self, "targets", tuple(self.targets))
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"method.pause_adapter_rank must be an integer >= 1 to add adapters, got {self.rank!r}")
        if not math.isfinite(self.alpha) or self.alpha <= 0:
            raise ValueError(f"method.pause_adapter_alpha must be finite and > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"method.pause_adapter_dropout must lie in [0, 1), got {self.dropout}")
        if not self.targets or not all(isinstance(t, str) and t.strip() for t in self.targets):
            raise ValueError(f"method.pause_adapter_targets must list module names, got {list(self.targets)!r}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def to_dict(self) -> dict:
        return {"format": FORMAT, "rank": self.rank, "alpha": self.alpha, "dropout": self.dropout,
                "targets": list(self.targets)}

    @classmethod
    def from_dict(cls, data: dict) -> "PauseAdapterSpec":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not pause-adapter settings (expected format {FORMAT!r})")
        return cls(rank=data["rank"], alpha=float(data["alpha"]), dropout=float(data["dropout"]),
                   targets=tuple(data["targets"]))

    @classmethod
    def of_method(cls, method) -> "PauseAdapterSpec":
        """The spec of a ``MethodConfig`` with ``pause_adapter_rank >= 1``."""
        return cls(rank=int(method.pause_adapter_rank), alpha=float(method.pause_adapter_alpha),
                   dropout=float(method.pause_adapter_dropout), targets=tuple(method.pause_adapter_targets))


def check_settings(method, model, lora, train=None) -> None:
    """Check the ``method.pause_adapter_*`` fields of a run configuration (its ``method``,
    ``model``, ``lora`` and ``train`` sections); ValueError in one line naming the field."""
    def need(ok: bool, field: str, msg: str) -> None:
        if not ok:
            raise ValueError(f"method.{field}: {msg}")

    need(method.pause_adapter_rank >= 0, "pause_adapter_rank", f"must be >= 0 (0 = none), got {method.pause_adapter_rank}")
    need(method.pause_adapter_base in BASES, "pause_adapter_base",
         f"must be one of {', '.join(BASES)}; got {method.pause_adapter_base!r}")
    if method.pause_adapter_rank:
        PauseAdapterSpec.of_method(method)  # alpha, dropout and targets, each error naming its field
        need(method.spec.uses_pauses, "pause_adapter_rank",
             f"{method.name} has no pauses for the adapters to act on: use a method with pauses or set it to 0")
    if method.pause_adapter_base == "freeze":
        need(method.pause_adapter_rank > 0, "pause_adapter_base",
             "freeze trains the pause-step adapters alone: set method.pause_adapter_rank >= 1, or use train")
        need(model.name_or_path is not None, "pause_adapter_base", "freeze keeps a pretrained model as loaded: set "
             "model.name_or_path (a random model would keep its random weights), or use train")
        need(not lora.rank, "pause_adapter_base", "freeze trains the pause-step adapters alone, LoRA trains adapters "
             "of the base: set lora.rank = 0, or method.pause_adapter_base = train (the base then trains through LoRA)")
        need(train is None or train.distributed not in ("fsdp", "hsdp"), "pause_adapter_base",
             "freeze keeps the embedding's other rows by a gradient hook that FSDP's sharded parameters do not run: "
             "use train.distributed ddp or none, or method.pause_adapter_base = train")


class _State:
    """One model's adapters: the spec, the adapted modules by canonical name, the hook handles
    and the pause mask of the decoder's latest call."""

    def __init__(self, spec: PauseAdapterSpec, pause_ids: tuple[int, ...]):
        self.spec = spec
        self.pause_ids = pause_ids
        self.modules: dict[str, torch.nn.Linear] = {}
        self.handles: list = []
        self.mask: torch.Tensor | None = None
        self._mask_casts: dict[torch.dtype, torch.Tensor] = {}  # the mask as [..., 1] of each dtype

    def set_mask(self, mask: torch.Tensor) -> None:
        self.mask, self._mask_casts = mask, {}

    def mask_as(self, dtype: torch.dtype) -> torch.Tensor:
        """The mask as ``[..., 1]`` 0/1 of ``dtype``, cast once per decoder call (every adapted
        projection of the call multiplies by it)."""
        m = self._mask_casts.get(dtype)
        if m is None:
            m = self._mask_casts[dtype] = self.mask.unsqueeze(-1).to(dtype)
        return m

    def pauses(self, ids: torch.Tensor) -> torch.Tensor:
        """Bool ``ids.shape``: where ``ids`` is a pause id (comparisons with Python ints: no
        tensor is copied to the device, so a CUDA graph can capture it)."""
        mask = ids == self.pause_ids[0]
        for pause in self.pause_ids[1:]:
            mask = mask | (ids == pause)
        return mask


def _hf(model) -> torch.nn.Module:
    return getattr(model, "hf_model", model)


def state_of(model) -> _State | None:
    return _hf(model).__dict__.get(_STATE_ATTR)


def has_pause_adapters(model) -> bool:
    """Whether ``model`` (a PauseModel or its Hugging Face model) has pause-step adapters."""
    return state_of(model) is not None


def spec_of(model) -> PauseAdapterSpec | None:
    """The adapters' :class:`PauseAdapterSpec`, or None without adapters."""
    state = state_of(model)
    return None if state is None else state.spec


def _canonical(name: str) -> str:
    """A module path without peft's wrappers (``...q_proj.base_layer`` -> ``...q_proj``)."""
    return ".".join(p for p in name.split(".") if p != "base_layer")


def _innermost(module: torch.nn.Module) -> torch.nn.Module:
    while hasattr(module, "base_layer"):
        module = module.base_layer
    return module


def _targets(hf_model, targets: tuple[str, ...]) -> dict[str, torch.nn.Linear]:
    found: dict[str, torch.nn.Linear] = {}
    for name, module in hf_model.named_modules():
        if name.rsplit(".", 1)[-1] not in targets:
            continue
        inner = _innermost(module)
        if isinstance(inner, torch.nn.Linear):
            found.setdefault(_canonical(name), inner)
    if not found:
        names = sorted({n.rsplit(".", 1)[-1] for n, m in hf_model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"method.pause_adapter_targets {list(targets)}: no such linear module in "
                         f"{type(hf_model).__name__}; its linear layers are {', '.join(names)}")
    return found


def _mask_hook(state: _State):
    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            raise ValueError("a model with pause-step adapters runs on input_ids (the adapters find the pauses "
                             "by their ids), not on inputs_embeds")
        state.set_mask(state.pauses(ids))
    return hook


def _delta_hook(state: _State):
    def hook(module, args, output):
        x = args[0]
        mask = state.mask
        if mask is None or tuple(mask.shape) != tuple(x.shape[:-1]):
            raise ValueError("a pause-step adapter ran outside a decoder call of its model (no pause mask of "
                             f"the input's shape {tuple(x.shape[:-1])})")
        a = getattr(module, A_NAME)
        b = getattr(module, B_NAME)
        spec = state.spec
        h = F.dropout(x, spec.dropout, training=module.training) if spec.dropout else x
        delta = F.linear(F.linear(h, a.to(h.dtype)), b.to(h.dtype))
        # output + scale * delta * mask in one kernel (decoding runs this on every projection)
        return torch.addcmul(output, delta, state.mask_as(delta.dtype), value=spec.scale)
    return hook


def add_pause_adapters(model, spec: PauseAdapterSpec):
    """Give ``model`` (a :class:`~cyb.model.PauseModel`) pause-step adapters of ``spec``, in place;
    returns it.  ``B`` starts at zero, so the model computes exactly what it did.  The adapters'
    parameters are float32 and trainable whatever the model's dtype (cast in the forward).

    Raises ValueError for a model without pauses, one that has adapters of another spec
    already (the same spec: nothing is done), or targets that match no linear module."""
    hf_model = _hf(model)
    settings = model.settings
    if not settings.pause_ids:
        raise ValueError(f"method.pause_adapter_rank: the model has no pauses (M = {settings.num_steps}, "
                         f"method {settings.method}): pause-step adapters act on pause positions")
    old = state_of(hf_model)
    if old is not None:
        if old.spec == spec:
            return model
        raise ValueError(f"the model already has pause-step adapters ({old.spec.to_dict()}), not {spec.to_dict()}: "
                         "set method.pause_adapter_rank and the other fields as saved with it")
    state = _State(spec, tuple(int(i) for i in settings.pause_ids))
    state.modules = _targets(hf_model, spec.targets)
    for module in state.modules.values():
        w = module.weight
        a = torch.empty(spec.rank, module.in_features, dtype=torch.float32, device=w.device)
        torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # as peft's LoRA A
        module.register_parameter(A_NAME, torch.nn.Parameter(a))
        module.register_parameter(B_NAME, torch.nn.Parameter(
            torch.zeros(module.out_features, spec.rank, dtype=torch.float32, device=w.device)))
        state.handles.append(module.register_forward_hook(_delta_hook(state)))
    state.handles.append(hf.decoder_of(hf_model).register_forward_pre_hook(_mask_hook(state), with_kwargs=True))
    hf_model.__dict__[_STATE_ATTR] = state
    return model


def remove_pause_adapters(model) -> None:
    """Take the adapters out again (hooks and parameters); the model computes as before them."""
    hf_model = _hf(model)
    state = hf_model.__dict__.pop(_STATE_ATTR, None)
    if state is None:
        return
    for handle in state.handles:
        handle.remove()
    for module in state.modules.values():
        for name in (A_NAME, B_NAME):
            delattr(module, name)


def adapter_parameters(model) -> list[torch.nn.Parameter]:
    """Every ``A`` and ``B`` of the model's adapters."""
    state = state_of(model)
    if state is None:
        return []
    return [getattr(m, n) for m in state.modules.values() for n in (A_NAME, B_NAME)]


def is_adapter_key(key: str) -> bool:
    """Whether a state-dict key is an adapter's ``A`` or ``B``."""
    return key.rsplit(".", 1)[-1] in (A_NAME, B_NAME)


def without_adapters(state_dict: dict) -> dict:
    """``state_dict`` without the adapters' tensors (what the Hugging Face weights file holds)."""
    return {k: v for k, v in state_dict.items() if not is_adapter_key(k)}


def adapter_state(model, state_dict: dict | None = None) -> dict[str, torch.Tensor]:
    """The adapters' tensors keyed by canonical names (no peft ``base_layer``), float32 on the
    CPU: from ``state_dict`` (Hugging Face keys, e.g. gathered under FSDP) or the model."""
    if state_dict is None:
        state_dict = {n: p for n, p in _hf(model).named_parameters() if is_adapter_key(n)}
    return {_canonical(k): v.detach().to("cpu", torch.float32).contiguous()
            for k, v in state_dict.items() if is_adapter_key(k)}


def save_pause_adapters(model, directory, state_dict: dict | None = None) -> None:
    """Write ``pause_adapters.json`` and ``pause_adapters.safetensors`` into ``directory``."""
    from safetensors.torch import save_file

    from ..files import write_json_atomic

    spec = spec_of(model)
    if spec is None:
        raise ValueError("the model has no pause-step adapters to save")
    directory = Path(directory)
    tensors = adapter_state(model, state_dict)
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    write_json_atomic(directory / CONFIG_FILE, spec.to_dict())


def saved_in(folder) -> bool:
    """Whether the local folder holds pause-step adapters."""
    return (Path(str(folder)).expanduser() / CONFIG_FILE).is_file()


def load_pause_adapters(model, folder) -> None:
    """Add the adapters saved in ``folder`` to ``model`` and put their values in.  Raises
    :class:`~cyb.checkpoint.DamagedFileError` for a file that does not read back, ValueError
    when the tensors do not fit the model."""
    from safetensors.torch import load_file

    from ..checkpoint import DamagedFileError, check_safetensors

    folder = Path(str(folder)).expanduser()
    advice = "restore it from a copy or train the model again"
    try:
        spec = PauseAdapterSpec.from_dict(json.loads((folder / CONFIG_FILE).read_text()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise DamagedFileError(folder / CONFIG_FILE, f"not valid pause-adapter settings: {e}") from e
    if not (folder / WEIGHTS_FILE).is_file():
        raise DamagedFileError(folder / WEIGHTS_FILE, "missing", "", f"{folder} names pause-step adapters in "
                               f"{CONFIG_FILE} but has no {WEIGHTS_FILE}: {advice}")
    check_safetensors(folder / WEIGHTS_FILE, advice)
    add_pause_adapters(model, spec)
    tensors = load_file(str(folder / WEIGHTS_FILE))
    state = state_of(model)
    want = {f"{name}.{n}": getattr(m, n) for name, m in state.modules.items() for n in (A_NAME, B_NAME)}
    missing, extra = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
    if missing or extra:
        raise ValueError(f"{folder / WEIGHTS_FILE} does not fit the model's projections (missing {missing[:2]}, "
                         f"unexpected {extra[:2]}): adapters of another model?")
    with torch.no_grad():
        for key, param in want.items():
            if tuple(tensors[key].shape) != tuple(param.shape):
                raise ValueError(f"{folder / WEIGHTS_FILE}: {key} has shape {tuple(tensors[key].shape)}, the model "
                                 f"needs {tuple(param.shape)}")
            param.copy_(tensors[key])


def freeze_base(model) -> list[torch.nn.Parameter]:
    """Freeze every weight of the model but the pause adapters (and the gates of gated pauses):
    the base model stays as loaded.  The embedding rows of the pause and dk tokens still train
    (and their output rows when the output projection is not tied to the embedding): those
    matrices keep ``requires_grad``, a gradient hook zeroes every other row and they are marked
    for no weight decay (:data:`NO_DECAY_ATTR`), so AdamW leaves the other rows exactly as they
    are.  Returns the parameters that keep training."""
    from .gates import gate_parameters

    hf_model = _hf(model)
    keep = {id(p) for p in adapter_parameters(model)} | {id(p) for p in gate_parameters(hf_model)}
    for p in hf_model.parameters():
        if id(p) not in keep:
            p.requires_grad_(False)
    settings = model.settings
    ids = sorted(set(settings.pause_ids) | ({settings.dk_id} if settings.dk_id is not None else set()))
    for w in hf.embedding_weights(hf_model):
        mask = torch.zeros(w.shape[0], 1, dtype=w.dtype, device=w.device)
        mask[ids] = 1
        w.requires_grad_(True)
        w.register_hook(lambda g, m=mask: g * m.to(device=g.device, dtype=g.dtype))
        setattr(w, NO_DECAY_ATTR, True)
    return [p for p in hf_model.parameters() if p.requires_grad]


def describe(model) -> str:
    """A few words for the run's header: ``pause adapters rank 8 on q_proj, v_proj``."""
    spec = spec_of(model)
    return "" if spec is None else f"pause adapters rank {spec.rank} on {', '.join(spec.targets)}"


__all__ = ["A_NAME", "B_NAME", "BASES", "CONFIG_FILE", "NO_DECAY_ATTR", "PauseAdapterSpec", "WEIGHTS_FILE",
           "adapter_parameters", "adapter_state", "add_pause_adapters", "check_settings", "describe", "freeze_base",
           "has_pause_adapters", "is_adapter_key", "load_pause_adapters", "remove_pause_adapters", "saved_in",
           "spec_of", "state_of", "without_adapters"]


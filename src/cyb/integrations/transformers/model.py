"""The module a ``transformers.Trainer`` trains: a :class:`~cyb.model.PauseModel` and its objective.

:func:`with_pauses` turns what a Trainer script already has (a causal LM and its tokenizer, or
a model name) into a :class:`PauseTrainingModel`.  Its ``forward`` is the forward of ``cyb
train``'s own loss module (:class:`cyb.objective.LossModule`): it lays nothing out, it runs the model
on a batch that :class:`~cyb.integrations.transformers.PauseCollator` laid out and returns the
training loss *summed* over the batch's target tokens with the metric sums of
:class:`cyb.objective.LossOutput`.  Going through ``forward`` is what lets DDP and FSDP see every
forward, as in ``cyb train``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ...config import ConfigError, LoraConfig, MethodConfig, RunConfig
from ...objective import LossModule, Objective

#: What a model with pauses answers to ``method.name`` and friends (:class:`cyb.config.MethodConfig`).
METHOD_FIELDS = tuple(f.name for f in dataclasses.fields(MethodConfig))


class PauseTrainingModel(LossModule):
    """A :class:`~cyb.model.PauseModel` and its training objective, as one ``torch.nn.Module``.

    ``forward(prep)`` takes a laid-out batch (:class:`cyb.objective.Prepared`, what
    :class:`~cyb.integrations.transformers.PauseCollator` returns under the key ``prep``) and returns
    ``(loss_sum, sums)``: the training loss summed over the batch's target tokens (a scalar
    tensor) and the detached metric sums (objective, perplexity NLL, target count and, with dk,
    ``E[S]`` and ``Pr(S=i)``).  The trainer divides by the target tokens of the whole optimiser
    step.  Build one with :func:`with_pauses`.

    Attributes:
        model: the :class:`~cyb.model.PauseModel` (its ``hf_model`` is the Hugging Face model).
        objective: the :class:`~cyb.objective.Objective` of ``method``.
        method: the method section (:class:`cyb.config.MethodConfig`).
    """

    #: Trainer's ``accepts_loss_kwargs``: the loss is normalised by the trainer, not here.
    accepts_loss_kwargs = True

    def __init__(self, model, method: MethodConfig, *, loss_impl: str = "auto"):
        super().__init__(model, Objective(method, model.vocab, model.dk_bias, loss_impl))
        self.method = method

    # -- what Trainer and TRL ask of a model ---------------------------------------------------------
    @property
    def pause_model(self):
        """The :class:`~cyb.model.PauseModel` being trained."""
        return self.model

    @property
    def config(self):
        """The Hugging Face model's config (Trainer and TRL read it)."""
        return self.model.config

    @property
    def generation_config(self):
        return getattr(self.model.hf_model, "generation_config", None)

    @property
    def name_or_path(self) -> str:
        return getattr(self.model.hf_model, "name_or_path", "") or ""

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs: dict | None = None,
                                        every_n_layers: int = 1, offload: bool = False) -> None:
        """Recompute block activations in backward (``TrainingArguments(gradient_checkpointing=True)``;
        TRL's default): every block, or every ``every_n_layers``-th, non-reentrant unless the
        kwargs say otherwise."""
        if every_n_layers == 1 and not offload:
            self.model.gradient_checkpointing_enable(activation_checkpointing_kwargs)
            return
        enable = getattr(self.model.hf_model, "activation_checkpointing_enable", None)
        if enable is None:
            raise ValueError("every_n_layers and offload need a transformers with activation_checkpointing_enable")
        enable(activation_checkpointing_kwargs=activation_checkpointing_kwargs or {"use_reentrant": False},
               every_n_layers=every_n_layers, offload=offload)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None, **kwargs) -> None:
        """The older name of :meth:`activation_checkpointing_enable`."""
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    def gradient_checkpointing_disable(self) -> None:
        self.model.gradient_checkpointing_disable()

    activation_checkpointing_disable = gradient_checkpointing_disable

    @property
    def is_gradient_checkpointing(self) -> bool:
        return self.model.is_gradient_checkpointing

    def add_model_tags(self, tags) -> None:
        """Tags for the Hugging Face model's card (TRL adds its trainer's name)."""
        add = getattr(self.model.hf_model, "add_model_tags", None)
        if add is not None:
            add(tags)

    # -- saving ----------------------------------------------------------------------------------------
    def hf_state_dict(self, state_dict: dict) -> dict:
        """``state_dict`` of this module (keys ``model.hf_model.…``, e.g. gathered under FSDP) keyed as
        the Hugging Face model's own; keys outside the Hugging Face model are dropped."""
        prefix = "model." + self.model.hf_prefix
        return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}

    def save_pretrained(self, directory, *, state_dict: dict | None = None) -> Path:
        """Write a cyb model folder (the Hugging Face weights or a LoRA adapter folder, the
        tokenizer, ``cyb_pause.json``) that ``cyb generate``, ``cyb eval`` and
        :meth:`cyb.model.PauseModel.from_pretrained` read.  ``state_dict``: this module's state
        (its keys as :meth:`state_dict` gives them), e.g. gathered under FSDP."""
        hf_state = None if state_dict is None else self.hf_state_dict(state_dict)
        if hf_state is not None:
            hf_model = self.model.hf_model
            unique = {n for n, _ in hf_model.named_parameters()}
            tied = {n for n, _ in hf_model.named_parameters(remove_duplicate=False)} - unique
            hf_state = {k: v for k, v in hf_state.items() if k not in tied}
        return self.model.save_pretrained(directory, state_dict=hf_state)


def method_config(method, num_steps: int | None = None, **fields) -> MethodConfig:
    """A checked :class:`cyb.config.MethodConfig` from a method name (or a MethodConfig, or a dict
    of its fields) and ``fields`` (``omega``, ``gamma0``, ``psi_dk``, ``pause_visibility``, …).

    Raises :class:`cyb.config.ConfigError` naming the first bad field (``method.omega: ...``)
    or an unknown one.
    """
    if isinstance(method, MethodConfig):
        base = dataclasses.asdict(method)
    elif isinstance(method, dict):
        base = dict(method)
    elif isinstance(method, str):
        base = {"name": method}
    else:
        raise TypeError(f"method must be a method name, a cyb.config.MethodConfig or a dict, got "
                        f"{type(method).__name__}")
    if num_steps is not None:
        base["num_steps"] = num_steps
    base.update(fields)
    unknown = sorted(set(base) - set(METHOD_FIELDS))
    if unknown:
        raise ConfigError(f"method.{unknown[0]}: unknown field; known: {', '.join(METHOD_FIELDS)}")
    if base.get("name") == "baseline_nx":
        raise ConfigError("method.name: baseline_nx lengthens cyb train's packed text blocks; here the rows are "
                          "the examples given: make them longer and use baseline")
    # tbys_scheme append puts the pauses after a prompt: here the tokens the examples' labels leave out
    data = {"task": "addition"} if base.get("tbys_scheme") == "append" else {}
    cfg = RunConfig.from_dict({"method": base, "data": data})
    cfg.validate()
    if cfg.method.pause_visibility == "gated":
        raise ConfigError("method.pause_visibility: gated pauses train their gates at their own learning "
                          "rate, which only cyb train sets up; use shared or private here")
    if cfg.method.pause_rows != "train":
        raise ConfigError("method.pause_rows: frozen pause rows are put back after each step of cyb train's "
                          "loop, which a transformers Trainer does not run; use train here")
    return cfg.method


def lora_settings(lora) -> LoraConfig:
    """cyb's LoRA settings from a ``peft.LoraConfig`` (``r``, ``lora_alpha``, ``lora_dropout``,
    ``target_modules``), a :class:`cyb.config.LoraConfig` or a dict of its fields.  A peft option
    cyb's LoRA does not apply (``use_dora``, ``use_rslora``, ``modules_to_save``, ``bias``) is
    refused with a ValueError naming it."""
    if isinstance(lora, LoraConfig):
        out = lora
    elif isinstance(lora, dict):
        out = RunConfig.from_dict({"lora": lora}).lora
    elif hasattr(lora, "lora_alpha") and hasattr(lora, "r"):
        for name, default in (("use_dora", False), ("use_rslora", False), ("modules_to_save", None), ("bias", "none")):
            if getattr(lora, name, default) not in (default, [], ()):
                raise ValueError(f"LoraConfig.{name}={getattr(lora, name)!r}: cyb's LoRA takes r, lora_alpha, "
                                 "lora_dropout and target_modules (the pause and dk rows train by themselves)")
        targets = lora.target_modules
        if isinstance(targets, str):
            raise ValueError(f"LoraConfig.target_modules={targets!r}: give a list of module names")
        out = LoraConfig(rank=int(lora.r), alpha=float(lora.lora_alpha), dropout=float(lora.lora_dropout),
                         **({"target_modules": sorted(targets)} if targets else {}))
    else:
        raise TypeError(f"lora must be a peft.LoraConfig, a cyb.config.LoraConfig or a dict, got "
                        f"{type(lora).__name__}")
    if out.rank < 1:
        raise ConfigError(f"lora.rank: must be >= 1 to train adapters, got {out.rank}")
    # the checks of cyb train's lora section (the model is the one given to with_pauses)
    RunConfig.from_dict({"model": {"name_or_path": "pretrained"}, "lora": dataclasses.asdict(out)}).validate()
    return out


def _pause_kwargs(method: MethodConfig) -> dict:
    """The pause settings a model needs for ``method`` (as ``cyb train`` builds it)."""
    spec = method.spec
    return dict(num_steps=spec.model_steps(method.num_steps), use_dk=spec.has_dk, psi_dk=method.psi_dk,
                method=method.name, position_scheme=spec.position_scheme(method),
                pause_visibility=method.pause_visibility if spec.uses_pauses else "shared")


def _pause_model(model, tokenizer, method: MethodConfig, **load_kwargs):
    from ...model import PauseModel

    kwargs = _pause_kwargs(method)
    if isinstance(model, PauseModel):
        s = model.settings
        have = dict(num_steps=s.num_steps, use_dk=s.dk_id is not None, position_scheme=s.position_scheme,
                    pause_visibility=s.pause_visibility)
        for name, value in have.items():
            if kwargs[name] != value:
                raise ValueError(f"the PauseModel has {name}={value!r} but method {method.name!r} asks for "
                                 f"{kwargs[name]!r}; build the model for the method (with_pauses of the plain model)")
        return model
    if isinstance(model, (str, Path)):
        from ...run_models import prepare

        prepare(model)  # a training checkpoint: the model it holds, written once into the cache
        return PauseModel.from_pretrained(str(model), tokenizer=tokenizer, reconfigure=True, **kwargs, **load_kwargs)
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "get_output_embeddings"):
        raise TypeError(f"model must be a transformers causal LM, a cyb PauseModel or a model name or folder, "
                        f"got {type(model).__name__}")
    if hasattr(model, "peft_config"):
        raise ValueError("the model already carries peft adapters: give the plain model and "
                         "with_pauses(..., lora=LoraConfig(...)), which makes the pause and dk rows trainable too")
    if tokenizer is None:
        raise ValueError("with_pauses needs the model's tokenizer (the pause and dk tokens are added to it, and "
                         "the saved model folder holds it)")
    return PauseModel.from_hf(model, tokenizer, **kwargs)


def with_pauses(model, tokenizer=None, *, method="cyb", num_steps: int | None = None, lora=None,
                loss_impl: str = "auto", **method_fields) -> PauseTrainingModel:
    """The model a ``Trainer`` / ``SFTTrainer`` script trains with pauses, for any method of
    :mod:`cyb.methods`.

    Args:
        model: a ``transformers`` causal LM with rotary positions (its embeddings grow by the pause
            and dk tokens where the tokenizer has no unused ones), a :class:`cyb.model.PauseModel`,
            or a name: a hub id, a folder (a saved cyb model keeps its pause settings), a ``.gguf``
            file or a known short name (``smollm2-135m``), as :meth:`cyb.model.PauseModel.from_pretrained`
            reads them.
        tokenizer: the model's tokenizer (required with a model object; mutated: the pause and dk
            tokens are added to it when it has no unused tokens to reuse).
        method: a method name (``"cyb"``, ``"tbys"``, ``"baseline"``, …), a
            :class:`cyb.config.MethodConfig` or a dict of its fields.
        num_steps: ``M``, the real token and ``M - 1`` pauses (default: the method's, 4).
        lora: a ``peft.LoraConfig`` (or :class:`cyb.config.LoraConfig`): freeze the model and
            train rank-``r`` adapters plus the pause and dk rows (:func:`cyb.model.lora.apply_lora`).
        loss_impl: ``"auto"`` (the fused readout on CUDA), ``"fused"`` or ``"naive"``, as
            ``train.loss_impl``.
        method_fields: other fields of :class:`cyb.config.MethodConfig` (``omega``, ``gamma0``,
            ``psi_dk``, ``pause_visibility``, ``recipe``, ``rho``, ``alpha``, …).

    Returns:
        a :class:`PauseTrainingModel`, in training mode.

    Raises:
        cyb.config.ConfigError: a bad or unknown method field (named); ValueError or TypeError
        for a model that cannot take pauses; :class:`cyb.extras.MissingPackage` for LoRA without
        peft.
    """
    from ...model.lora import apply_lora, is_lora

    me = method_config(method, num_steps, **method_fields)
    pause_model = _pause_model(model, tokenizer, me)
    if is_lora(pause_model):
        raise ValueError("the model is a LoRA folder: merge it into a plain model first (cyb merge FOLDER OUT) "
                         "and train that")
    if lora is not None:
        apply_lora(pause_model, lora_settings(lora))
    return PauseTrainingModel(pause_model, me, loss_impl=loss_impl).train()


__all__ = ["PauseTrainingModel", "lora_settings", "method_config", "with_pauses"]

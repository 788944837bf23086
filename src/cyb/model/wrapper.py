"""``PauseModel``: a Hugging Face causal LM with pauses and a ``<don't know>`` output.

The wrapper owns no weights of its own: it holds the Hugging Face model (``hf_model``), the
:class:`~cyb.model.settings.PauseSettings` and the tokenizer, and runs the decoder with explicit
positions and an explicit attention mask (see :mod:`cyb.model.hf` for why).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..layout import IGNORE_INDEX, Expanded, PauseVocab, collapse, expand
from ..readout import readout
from ..visibility import BlockSteps, inverse_order, reorder
from . import attention, gates, hf, pause_adapters
from .loading import save_tokenizer
from .lora import is_lora, save_adapter
from .settings import DEFAULT, PauseSettings, resolve_arguments
from .tokens import apply_plan, check_tokenizer, reserve_tokens


@dataclass
class PauseForward:
    """What :meth:`PauseModel.forward` returns for a batch of ``B`` rows of ``L`` real tokens.

    Attributes:
        layout: the Recipe 1 layout (:class:`cyb.layout.Expanded`, tensors ``[B, L*M]``).
        hidden: ``[B, L, M, H]`` last hidden states, grouped by real token (model dtype).
        log_t, log_d, log_not_d: ``[B, L, M]`` float32 per-step readout (``log_t`` is 0 where a
            block has no target; ``log_d = -inf``, ``log_not_d = 0`` without dk).  The network's
            ``d_M`` is reported as is; the losses treat it as 0.
        logits: ``[B, L, M, V]`` when asked for (``return_logits=True``), else None.
    """

    layout: Expanded
    hidden: torch.Tensor
    log_t: torch.Tensor
    log_d: torch.Tensor
    log_not_d: torch.Tensor
    logits: torch.Tensor | None = None

    @property
    def target_mask(self) -> torch.Tensor:
        """``[B, L]`` True where a real token's block has a target (the next real token)."""
        return self.layout.block_labels != IGNORE_INDEX


class PauseModel(torch.nn.Module):
    """A Hugging Face causal LM run with pauses (wrapped, never subclassed or patched).

    Build one with :meth:`from_pretrained`, :meth:`from_config` or :meth:`from_hf`; the
    constructor wraps a model whose pause/dk ids are already in place.

    Args:
        hf_model: a ``transformers`` causal LM that takes ``position_ids`` (rotary models:
            Llama, Mistral, Qwen2/3, Gemma 1/2/3...), with ``sdpa`` or ``eager`` attention.
        settings: its pause settings; ``settings.vocab_size`` must equal the rows of the
            output projection.
        tokenizer: optional; when given, its ids for the saved token strings must match.
    """

    #: Prefix of the Hugging Face model's keys inside this module's ``state_dict``.
    hf_prefix = "hf_model."

    def __init__(self, hf_model: torch.nn.Module, settings: PauseSettings, tokenizer=None) -> None:
        super().__init__()
        if not isinstance(settings, PauseSettings):
            raise TypeError(f"settings must be a PauseSettings, got {type(settings).__name__}")
        hf.check_attention(hf.attention_of(hf_model))
        decoder = hf.decoder_of(hf_model)
        hf.check_position_ids(decoder)
        self._cache_arg = hf.cache_arg_name(decoder)
        head = hf_model.get_output_embeddings()
        if head is None or not hasattr(head, "weight"):
            raise TypeError(f"{type(hf_model).__name__} has no output projection (lm_head)")
        rows = int(head.weight.shape[0])
        if settings.vocab_size != rows:
            raise ValueError(
                f"the pause settings are for a vocabulary of {settings.vocab_size} ids but the model's "
                f"output projection has {rows} rows (a checkpoint of another model?)"
            )
        if tokenizer is not None:
            check_tokenizer(tokenizer, settings)
        if settings.pause_visibility != "shared":
            attention.use_pause_attention(hf_model)  # FlexAttention for block-sparse masks on CUDA
        if settings.pause_visibility == "gated":
            if hf.attention_of(hf_model) != hf.PAUSE_ATTENTION:
                raise ValueError("gated pauses need sdpa attention (their gates act in the attention "
                                 f"function), got {hf.attention_of(hf_model)!r}")
            gates.add_gates(hf_model)
        self.hf_model = hf_model
        #: how private and gated layouts attend: "auto", "dense", "flex" or "split"
        #: (:func:`cyb.model.attention.choose_kernel`)
        self.pause_kernel = "auto"
        self._settings = settings
        self._vocab = settings.vocab()
        self._tokenizer = tokenizer
        self._dk_bias = settings.dk_bias()
        #: whether the gates (pause_visibility gated) came from a saved model, not their start
        self.gates_loaded = False
        #: ``(task, characters)`` of a model trained on a synthetic task with the character
        #: tokenizer, as :meth:`from_pretrained` reads it from the folder; a prompt with another
        #: character is refused (:func:`cyb.data.tokenizer.check_text`).  None: not known
        self.trained_on: tuple[str, str] | None = None

    # ================================================================== construction
    @classmethod
    def from_hf(
        cls,
        hf_model: torch.nn.Module,
        tokenizer=None,
        *,
        num_steps: int,
        use_dk=DEFAULT,
        psi_dk=DEFAULT,
        position_scheme=DEFAULT,
        method: str | None = None,
        pause_visibility=DEFAULT,
        reuse_unused: bool = True,
        new_rows: str = "mean",
    ) -> "PauseModel":
        """Reserve pause/dk ids on an already loaded model and wrap it.

        Ids come from tokens the tokenizer already has, else named unused tokens
        (``<unused0>``, ``<|reserved_special_token_0|>``, ...) when ``reuse_unused``, else new
        tokens ``<pause_1>`` .. ``<pause_{M-1}>`` (``<pause>`` for ``"advance"``) and
        ``<dont_know>`` added to the tokenizer, with the embeddings grown and the new rows set
        to the mean of the existing ones.  Without a tokenizer, ids are appended after the
        last embedding row.  ``new_rows="random"`` draws new rows at random with the spread
        of the existing ones instead of the mean (for randomly initialised models).  Mutates
        ``hf_model`` and ``tokenizer``.

        Args:
            num_steps: ``M`` >= 1.
            use_dk: reserve a ``<don't know>`` id (default: ``M > 1``).
            psi_dk: dk prior probability in (0, 1), None for no prior (default 0.9).
            position_scheme: ``"shared"`` (default) or ``"advance"``.
            method: label stored in the settings (default ``"cyb"`` with dk, ``"tbys"`` with
                pauses only, ``"baseline"`` for ``M = 1``).
            pause_visibility: ``"shared"`` (default, the paper's layout) or ``"private"``
                (:mod:`cyb.visibility`).
        """
        m, use_dk, psi_dk, scheme, method, visibility = resolve_arguments(
            num_steps, use_dk, psi_dk, position_scheme, method, pause_visibility)
        hf.check_attention(hf.attention_of(hf_model))
        hf.check_position_ids(hf.decoder_of(hf_model))
        rows = int(hf_model.get_input_embeddings().weight.shape[0])
        plan = reserve_tokens(tokenizer, num_steps=m, use_dk=use_dk, position_scheme=scheme,
                              num_rows=rows, reuse_unused=reuse_unused)
        apply_plan(hf_model, plan, new_rows)
        settings = PauseSettings(
            num_steps=m,
            pause_ids=plan.pause_ids,
            vocab_size=int(hf_model.get_output_embeddings().weight.shape[0]),
            dk_id=plan.dk_id,
            psi_dk=psi_dk,
            position_scheme=scheme,
            method=method,
            pause_tokens=plan.pause_tokens,
            dk_token=plan.dk_token,
            pause_visibility=visibility,
        )
        return cls(hf_model, settings, tokenizer)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path,
        *,
        num_steps: int | None = None,
        use_dk=DEFAULT,
        psi_dk=DEFAULT,
        position_scheme=DEFAULT,
        method: str | None = None,
        pause_visibility=DEFAULT,
        tokenizer=None,
        torch_dtype=None,
        attn_implementation: str | None = None,
        reuse_unused: bool = True,
        reconfigure: bool = False,
        **hf_kwargs,
    ) -> "PauseModel":
        """Load a causal LM (hub name, folder, GGUF file or a known model's short name such as
        ``smollm2-135m``; see :mod:`cyb.model.sources`) as a pause model, in eval mode (as Hugging
        Face's ``from_pretrained``; call ``.train()`` to train it).

        A folder (or repository) with ``cyb_pause.json`` is a saved pause model: its settings
        are used, and any argument given here must agree with them.  A LoRA folder (written by
        a ``lora.rank > 0`` run, see :mod:`cyb.model.lora`) loads its base model and puts the
        adapters and pause rows in (needs peft).  Any other model gets its
        pause/dk ids set up as in :meth:`from_hf` (``num_steps`` is then required).

        A local folder's files are checked first (JSON parses, safetensors headers read back);
        a damaged one raises :class:`~cyb.checkpoint.DamagedFileError` (a ValueError) naming it
        and saying what to do.

        Args:
            tokenizer: default: the one saved with the model (Hugging Face or CharTokenizer),
                or None when the folder has none.
            torch_dtype: parameter dtype (a ``torch.dtype``, its name, or ``"auto"``).
            attn_implementation: ``"sdpa"`` or ``"eager"``; None picks sdpa where the
                architecture supports it, else eager.  Flash attention is refused.
            reconfigure: a saved pause model whose settings differ from the arguments given
                here (e.g. a no-pause base model fine-tuned with CYB) gets the requested
                settings, its existing pause/dk tokens reused where present, instead of an
                error.  Only the pause visibility differing: the saved ids are kept and the
                visibility replaced.
            **hf_kwargs: passed to ``AutoModelForCausalLM.from_pretrained`` (``revision``,
                ``local_files_only``, ...).
        """
        from .pretrained import load_pretrained

        return load_pretrained(cls, name_or_path, num_steps=num_steps, use_dk=use_dk, psi_dk=psi_dk,
                               position_scheme=position_scheme, method=method,
                               pause_visibility=pause_visibility, tokenizer=tokenizer, torch_dtype=torch_dtype,
                               attn_implementation=attn_implementation, reuse_unused=reuse_unused,
                               reconfigure=reconfigure, **hf_kwargs)

    @classmethod
    def from_config(
        cls,
        hf_config,
        tokenizer=None,
        *,
        num_steps: int,
        use_dk=DEFAULT,
        psi_dk=DEFAULT,
        position_scheme=DEFAULT,
        method: str | None = None,
        pause_visibility=DEFAULT,
        torch_dtype=None,
        attn_implementation: str | None = None,
        reuse_unused: bool = True,
        new_rows: str = "mean",
    ) -> "PauseModel":
        """A randomly initialised model of ``hf_config`` (from-scratch runs), ids as in :meth:`from_hf`.

        The embeddings grow to cover the whole tokenizer when it is larger than
        ``hf_config.vocab_size``.  New pause/dk rows are set to the mean of the other rows
        (``new_rows="mean"``, near zero in a random model, every pause alike) or drawn at random
        like the others (``"random"``, distinct pauses start distinct).  Mean rows gave clearly
        lower perplexity when pretraining CYB on text (docs/record/results/text.md).
        """
        from transformers import AutoModelForCausalLM

        hf.check_attention(attn_implementation)
        hf_model = AutoModelForCausalLM.from_config(
            hf_config, attn_implementation=attn_implementation, **hf.dtype_kwargs(torch_dtype)
        )
        return cls.from_hf(hf_model, tokenizer, num_steps=num_steps, use_dk=use_dk, psi_dk=psi_dk,
                           position_scheme=position_scheme, method=method,
                           pause_visibility=pause_visibility, reuse_unused=reuse_unused,
                           new_rows=new_rows)

    # ================================================================== persistence
    def save_pretrained(self, directory, *, state_dict: dict | None = None, **hf_kwargs) -> Path:
        """Write the Hugging Face model (safetensors), the tokenizer and ``cyb_pause.json``.

        The folder loads with :meth:`from_pretrained` and with plain
        ``AutoModelForCausalLM.from_pretrained``.  A model with LoRA adapters writes its
        adapter folder instead (:func:`cyb.model.lora.save_adapter`: adapters, pause rows, the base
        model's name), which :meth:`from_pretrained` loads too.  Pause-step adapters go beside
        the weights (:mod:`cyb.model.pause_adapters`).  ``state_dict`` (Hugging Face
        keys, e.g. gathered under FSDP) replaces the module's own; ``hf_kwargs`` go to the
        model's ``save_pretrained``.  The settings file is written last.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        adapters = pause_adapters.has_pause_adapters(self.hf_model)
        if is_lora(self.hf_model):
            save_adapter(self, directory, state_dict=state_dict)
        else:
            if state_dict is not None or adapters:  # the weights file holds the base model alone
                full = state_dict if state_dict is not None else self.hf_model.state_dict()
                hf_kwargs["state_dict"] = pause_adapters.without_adapters(full)
            self.hf_model.save_pretrained(str(directory), **hf_kwargs)
        if adapters:  # beside the weights (cyb.model.pause_adapters)
            pause_adapters.save_pause_adapters(self, directory, state_dict=state_dict)
        if self._tokenizer is not None:
            save_tokenizer(self._tokenizer, directory)
        self._settings.save(directory)
        return directory

    def load_hf_state_dict(self, state_dict: dict, strict: bool = True):
        """Load weights keyed as the Hugging Face model's own ``state_dict``."""
        return self.hf_model.load_state_dict(state_dict, strict=strict)

    # ================================================================== properties
    @property
    def settings(self) -> PauseSettings:
        return self._settings

    @property
    def vocab(self) -> PauseVocab:
        return self._vocab

    @property
    def tokenizer(self):
        return self._tokenizer

    @property
    def config(self):
        """The Hugging Face model's config."""
        return self.hf_model.config

    @property
    def num_steps(self) -> int:
        return self._settings.num_steps

    @property
    def pause_visibility(self) -> str:
        """``"shared"``, ``"private"`` or ``"gated"`` (:mod:`cyb.visibility`)."""
        return self._settings.pause_visibility

    @property
    def dk_bias(self) -> float:
        """The dk prior offset added to the dk logit in the readout (0.0 without dk/prior)."""
        return self._dk_bias

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.hf_model.parameters()).dtype

    @property
    def decoder(self) -> torch.nn.Module:
        """The Hugging Face decoder under the LM head."""
        return hf.decoder_of(self.hf_model)

    def decoder_layers(self) -> list[torch.nn.Module]:
        """The transformer blocks, in order (units for FSDP wrapping or compilation)."""
        num_layers = getattr(hf.text_config(self.config), "num_hidden_layers", None)
        return hf.decoder_layers(self.decoder, num_layers)

    def num_parameters(self, only_trainable: bool = False) -> int:
        """Parameters of the wrapped model (tied matrices counted once)."""
        params = {id(p): p for p in self.hf_model.parameters() if p.requires_grad or not only_trainable}
        return sum(p.numel() for p in params.values())

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        """Recompute each block's activations in backward (non-reentrant by default)."""
        kwargs = gradient_checkpointing_kwargs
        if kwargs is None:
            kwargs = {"use_reentrant": False}
        enable = getattr(self.hf_model, "activation_checkpointing_enable", None)  # newer name
        if enable is not None:
            enable(activation_checkpointing_kwargs=kwargs)
        else:
            self.hf_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)

    def gradient_checkpointing_disable(self) -> None:
        disable = getattr(self.hf_model, "activation_checkpointing_disable", None)
        (disable or self.hf_model.gradient_checkpointing_disable)()

    @property
    def is_gradient_checkpointing(self) -> bool:
        """Whether activation (gradient) checkpointing is on."""
        for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
            if hasattr(type(self.hf_model), name):
                return bool(getattr(self.hf_model, name))
        return False

    def extra_repr(self) -> str:
        s = self._settings
        return (f"method={s.method!r}, num_steps={s.num_steps}, pause_ids={list(s.pause_ids)}, "
                f"dk_id={s.dk_id}, psi_dk={s.psi_dk}, position_scheme={s.position_scheme!r}")

    # ================================================================== forward pieces
    def new_cache(self):
        """An empty ``DynamicCache`` set up for this model (sliding-window layers included)."""
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.config)
        except TypeError:  # older transformers without the config argument
            return DynamicCache()

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        past_key_values=None,
        use_cache: bool = False,
        check_positions: bool = True,
        steps: BlockSteps | None = None,
    ) -> tuple[torch.Tensor, object | None]:
        """Last hidden states of the decoder, with explicit positions and attention mask.

        Args:
            input_ids: ``[B, T]`` long ids (real tokens and pauses, as laid out).
            position_ids: ``[B, T]`` (or ``[1, T]``) rotary positions; may repeat.
            attention_mask: ``[B, P + T]`` 1 for valid steps, 0 for padding, covering the ``P``
                cached steps and the new ones; None means nothing is padded.  Or a ready 4-D
                mask ``[B, 1, T, P + T]`` (bool for sdpa, additive for eager attention), passed
                to the decoder as it is: no query row may be all masked.  Models with
                sliding-window layers need the 2-D form, or (pauses not shared) a dict of
                4-D masks per layer type that applies the windows
                (:func:`cyb.model.attention.dense_masks`).
            past_key_values: a cache (e.g. :meth:`new_cache`) holding ``P`` earlier steps; it is
                extended in place with the new ones.
            use_cache: return a cache (a new one when ``past_key_values`` is None).
            check_positions: check the position ids against ``max_position_embeddings`` (a
                host read of the device tensor; decode loops check their positions up front).
            steps: the layout's blocks (:class:`cyb.visibility.BlockSteps`, e.g.
                ``Expanded.steps``): required, without a cache, by a model whose pauses are not
                shared, which then builds its own mask from them and ``attention_mask`` (2-D)
                and ignores nothing else; unused by shared models.

        Returns:
            ``(hidden [B, T, H] in the model dtype, cache or None)``.  Steps that are padding
            give finite values that mean nothing.  Without a cache, rows with leading padding
            run rolled (padding last, then unmasked, as valid steps never attend to later ones)
            and come back in the input order, so that no step has an empty softmax (NaN
            gradients with some attention kernels).
        """
        hf.check_attention(hf.attention_of(self.hf_model))
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must have shape [B, T], got {tuple(input_ids.shape)}")
        b, t = input_ids.shape
        if position_ids is None:
            raise ValueError("position_ids are required: pauses repeat positions, which must be explicit")
        if position_ids.dim() != 2 or position_ids.shape[1] != t or position_ids.shape[0] not in (1, b):
            raise ValueError(
                f"position_ids must have shape [B, T] = [{b}, {t}] (or [1, {t}]), got "
                f"{tuple(position_ids.shape)}"
            )
        past = int(past_key_values.get_seq_length()) if past_key_values is not None else 0
        per_layer = isinstance(attention_mask, dict)
        four_d = per_layer or (attention_mask is not None and attention_mask.dim() == 4)
        if attention_mask is None:
            attention_mask = torch.ones((b, past + t), dtype=torch.long, device=input_ids.device)
        elif four_d:
            for mask in (attention_mask.values() if per_layer else [attention_mask]):
                if tuple(mask.shape) != (b, 1, t, past + t):
                    raise ValueError(f"a 4-D attention_mask must have shape [B, 1, T, cached + new] = "
                                     f"[{b}, 1, {t}, {past + t}], got {tuple(mask.shape)}")
            if not per_layer and hf.has_sliding_window(self.config) and self.pause_visibility == "shared":
                raise ValueError("this model has sliding-window layers: give a 2-D attention_mask")
        elif tuple(attention_mask.shape) != (b, past + t):
            raise ValueError(
                f"attention_mask must have shape [B, cached + new] = [{b}, {past} + {t}], got "
                f"{tuple(attention_mask.shape)}"
            )
        if check_positions:
            hf.check_positions(position_ids, self.config)
        if self.pause_visibility == "gated" and (past_key_values is not None or use_cache or four_d):
            raise ValueError("a model with gated pauses runs whole laid-out rows (steps=...), without a "
                             "KV cache or a ready 4-D mask (cyb.generation's eager decoder recomputes the "
                             "row every step)")
        if self.pause_visibility != "shared" and past_key_values is None and not use_cache and not four_d:
            if steps is None:
                raise ValueError(f"this model's pauses are {self.pause_visibility}: give the layout's "
                                 "steps (steps=...) or a ready 4-D attention mask")
            return self._pause_masked(input_ids, position_ids.expand(b, t), steps), None
        lead = None
        if past_key_values is None and not use_cache and not four_d:
            input_ids, position_ids, attention_mask, lead = hf.padding_last(
                input_ids, position_ids.expand(b, t), attention_mask)
        out = self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            **{self._cache_arg: past_key_values},
        )
        hidden = out.last_hidden_state
        if lead is not None:
            hidden = hf.roll_rows(hidden, -lead)
        cache = None
        if use_cache or past_key_values is not None:
            cache = past_key_values if past_key_values is not None else hf.cache_of(out)
        return hidden, cache

    def _pause_masked(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                      steps: BlockSteps) -> torch.Tensor:
        """Hidden states under private or gated pauses, through the kernel that
        :func:`cyb.model.attention.choose_kernel` picks: FlexAttention on CUDA (private
        pauses block-sparse over the real-first order, gated ones with the gate in the scores),
        the split attention (long gated rows of Recipe 1 layouts in bf16/fp16 on CUDA), or a
        dense 4-D mask in the layout's order."""
        visibility = self.pause_visibility
        steps = steps.to(input_ids.device)
        kernel = attention.choose_kernel(self.pause_kernel, visibility, steps, self.hf_model,
                                         half=self._half_precision(input_ids.device), training=self.training)
        gated = visibility == "gated"
        run = dict(use_cache=False, **{self._cache_arg: None})
        if kernel == "split":  # padding moves to the end of each row, where causal calls never see it
            input_ids, position_ids, _, lead = hf.padding_last(input_ids, position_ids, steps.valid)
            out = self.decoder(input_ids=input_ids, attention_mask=None, position_ids=position_ids,
                               pause_split=(steps.layout_key[2], gated), **run).last_hidden_state
            return out if lead is None else hf.roll_rows(out, -lead)
        if kernel == "dense":
            additive = self.dtype if hf.is_eager(self.hf_model) else None
            mask = attention.dense_masks(steps, visibility, position_ids, self.config,
                                         additive_dtype=additive)
            extra = {"pause_blocks": (steps.token, steps.step)} if gated else {}
            return self.decoder(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                                **run, **extra).last_hidden_state
        order, mask = attention.flex_layout(steps, visibility, position_ids, self.config)
        extra = {"pause_blocks": (reorder(steps.token, order), reorder(steps.step, order))} if gated else {}
        out = self.decoder(input_ids=reorder(input_ids, order), attention_mask=mask,
                           position_ids=reorder(position_ids, order), **run, **extra)
        return reorder(out.last_hidden_state, inverse_order(order))

    def _half_precision(self, device: torch.device) -> bool:
        """Whether the decoder computes in bf16/fp16 (its dtype, or autocast on ``device``)."""
        half = (torch.bfloat16, torch.float16)
        if self.dtype in half:
            return True
        return torch.is_autocast_enabled(device.type) and torch.get_autocast_dtype(device.type) in half

    def output_projection(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(weight [V, H], bias [V] or None)`` such that
        ``logits(h) == softcap(h @ weight.T + bias)`` with ``softcap`` from
        :attr:`final_logit_softcap`.

        These are the head's own parameters, except for models that scale their logits
        (Cohere, Granite), where the scaled copies are returned (gradients still flow).
        """
        head = self.hf_model.get_output_embeddings()
        weight, bias = head.weight, getattr(head, "bias", None)
        scale = hf.logit_scale(self.hf_model)
        if scale is not None:
            weight = weight * scale
            bias = bias * scale if bias is not None else None
        return weight, bias

    @property
    def final_logit_softcap(self) -> float | None:
        """Gemma 2/3 ``final_logit_softcapping`` (logits become ``c * tanh(z / c)``), or None."""
        return hf.final_logit_softcap(self.config)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., V]`` logits of hidden states ``[..., H]``, exactly as the HF forward computes
        them (head, logit scaling, softcap), in the model dtype.  No dk prior is added."""
        head = self.hf_model.get_output_embeddings()
        return hf.apply_logit_transforms(head(hidden), self.hf_model, self.final_logit_softcap)

    def readout(self, hidden: torch.Tensor, targets: torch.Tensor):
        """``(log_t, log_d, log_not_d)`` (float32, shape of ``targets``) of hidden states
        ``[..., H]`` with the model's dk id and prior; ``targets`` use ``IGNORE_INDEX``."""
        return readout(self.logits(hidden), targets, dk_id=self._settings.dk_id, dk_bias=self._dk_bias)

    def forward(
        self,
        ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        loss_mask: torch.Tensor | None = None,
        *,
        return_logits: bool = False,
        check_ids: bool = True,
    ) -> PauseForward:
        """Recipe 1 forward of real tokens ``ids [B, L]``: lay out, run, read out every step.

        Args:
            ids: ``[B, L]`` real token ids (no pauses).
            attention_mask: ``[B, L]`` 1 for tokens, 0 for padding (left or right).
            loss_mask: ``[B, L]`` which tokens are prediction targets (default: all valid ones).
            return_logits: also return the ``[B, L, M, V]`` logits (memory: ``B*L*M*V``).
            check_ids: raise if ids are outside the vocabulary or equal a pause/dk id.
        """
        m = self.num_steps
        layout = expand(ids, self._vocab, attention_mask=attention_mask, loss_mask=loss_mask,
                        check_ids=check_ids)
        hidden, _ = self.hidden_states(layout.input_ids, layout.position_ids, layout.attention_mask,
                                       steps=layout.steps)
        logits = self.logits(hidden)
        log_t, log_d, log_not_d = readout(logits, layout.labels, dk_id=self._settings.dk_id,
                                          dk_bias=self._dk_bias)
        return PauseForward(
            layout=layout,
            hidden=collapse(hidden, m),
            log_t=collapse(log_t, m),
            log_d=collapse(log_d, m),
            log_not_d=collapse(log_not_d, m),
            logits=collapse(logits, m) if return_logits else None,
        )


"""The ``method`` section of a run's configuration (:class:`MethodConfig`): the training method
and its pauses.  Validated with the rest of the run by :meth:`cyb.config.RunConfig.validate`;
``cyb train --help-config`` prints each field's docstring."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import families, methods
from .visibility import GATE_INIT


@dataclass
class MethodConfig:
    name: str = "cyb"
    """Training method: baseline (no pauses), baseline_nx (no pauses, seq_multiplier x longer
    context), tbys_original (random pauses, advancing positions, one shared pause id), tbys
    (Recipe 1 pauses, cross-entropy at the world's stop), cyb, cyb_va (variational, desired stop
    distribution rho), cyb_dp (CYB plus alpha KL(rho || s)); beyond the paper: cyb_anytime (plus
    aux_weight x every step's cross-entropy), cyb_decoupled (per-step cross-entropy for the
    predictions, CYB for d alone), cyb_ponder (plus ponder_cost x E[S])."""
    num_steps: int = 4
    """M: steps per real token (the token and M-1 pauses). Baselines use 1."""
    position_scheme: str = "shared"
    """shared (a pause takes its real token's position; one id per pause index) or advance."""
    pause_visibility: str = "shared"
    """What later tokens see of a token's pauses: shared (everything, the paper's layout),
    or private (nothing: a token's pauses are seen only by its own later steps, so the real
    tokens run exactly as in the base model and a KV cache holds real tokens only; best for
    fine-tuning a pretrained model), or gated (everything, the logits of other tokens' pauses
    biased by a learned gate per layer and head that starts almost closed; decoded with a KV
    cache whose columns are tagged as pauses or not). docs/concepts/layouts.md compares them."""
    pause_gate_init: float = GATE_INIT
    """pause_visibility gated: the gates' starting bias on the attention logits of other tokens'
    pauses (-8: almost closed, the base model nearly intact; 0: the shared layout). A model
    that was saved gated keeps its trained gates."""
    pause_gate_lr: float = 0.02
    """pause_visibility gated: learning rate of the gates (AdamW, no weight decay, the run's
    schedule); a gate's bias moves by up to about this much per step."""
    pause_gate_anneal_steps: int = 0
    """pause_visibility gated: if > 0, the gates are not learned but opened on a schedule, their
    bias rising linearly from pause_gate_init to 0 (the shared layout) over this many optimiser
    steps."""
    pause_adapter_rank: int = 0
    """Pause-step adapters: rank r of low-rank weights on pause_adapter_targets that act only where
    the input is a pause, zero at the start (under private pauses real tokens stay the base's); 0 = none."""
    pause_adapter_alpha: float = 16.0
    """Pause-step adapters: their delta is scaled by alpha / pause_adapter_rank (> 0)."""
    pause_adapter_dropout: float = 0.0
    """Pause-step adapters: dropout on their input, in [0, 1)."""
    pause_adapter_targets: list[str] = field(default_factory=lambda: list(families.PROJECTIONS))
    """Pause-step adapters: the projections that get them (matched at the end of each module's path)."""
    pause_adapter_base: str = "train"
    """Pause-step adapters: the rest of the model trains (train: every weight, or LoRA with lora.rank > 0)
    or stays as loaded (freeze: only the adapters and the pause/dk embedding rows train)."""
    pause_rows: str = "train"
    """The embedding rows of the pause tokens: train (default) or frozen at their initial values
    (an ablation: the pauses as fixed inputs that add no trainable parameters; the dk row trains).
    Full fine-tuning or pause-step adapters on a frozen base; not with LoRA or FSDP."""
    omega: list[float] | None = None
    """World stop distribution over steps 1..M (ratios); None = one-hot on M."""
    gamma: list[float] | None = None
    """Discount per step, each in [0, 1]; None = no discount (or gamma0 if set)."""
    gamma0: float | None = None
    """Exponential discount gamma_i = gamma0^(i-1), in [0, 1]; excludes gamma."""
    gamma0_anneal_steps: int = 0
    """Optimiser steps over which the discount base falls linearly from 1 (no discount: every
    step trained at full weight) to method.gamma0 (which must be set); 0 = gamma0 from step 1."""
    rho: list[float] | None = None
    """Desired stop distribution for cyb_va / cyb_dp (ratios over steps 1..M)."""
    alpha: float = 0.01
    """cyb_dp: weight of KL(rho || s)."""
    aux_weight: float = 0.1
    """cyb_anytime: weight of the mean cross-entropy of every step's prediction, added to the
    CYB loss so that every step keeps learning whatever d does (>= 0)."""
    ponder_cost: float = 0.01
    """cyb_ponder: cost per expected step, tau in l_CYB + tau E[S] (negative rewards pausing)."""
    psi_dk: float | None = 0.9
    """Prior probability of <don't know> (paper appendix); None = no prior offset."""
    recipe: int = 1
    """1: M-1 pauses after every token. 2: W-1 pauses with W ~ omega, sampled per token."""
    seq_multiplier: int = 1
    """baseline_nx: real context is seq_multiplier x data.block_len (compute-matched baseline)."""
    random_pause_fraction: float = 0.1
    """tbys_original with tbys_scheme=random: pauses inserted at random places of each row, as
    a fraction of its real tokens (0.1 = one pause per ten tokens)."""
    tbys_scheme: str = "random"
    """tbys_original: random (pauses at random places, the pretraining scheme) or append
    (M-1 pauses after the prompt of a synthetic task, the fine-tuning scheme)."""

    @property
    def spec(self) -> "methods.MethodSpec":
        """The method's :class:`~cyb.methods.MethodSpec` (layout, dk, losses, label)."""
        return methods.spec(self.name)

    @property
    def uses_pauses(self) -> bool:
        return self.spec.uses_pauses

    @property
    def uses_dk(self) -> bool:
        return self.spec.has_dk


__all__ = ["MethodConfig"]

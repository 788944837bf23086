"""Training with pauses inside TRL's ``SFTTrainer``.

``PauseSFTTrainer`` is ``SFTTrainer`` with :class:`~cyb.integrations.transformers.PauseTrainerMixin`:
TRL prepares the data set as usual (it tokenises text, conversations or prompt/completion pairs and
marks the tokens to predict in ``labels``), and cyb lays the batches out with pauses and computes
its objective on them.  ``peft_config=LoraConfig(...)`` is applied the cyb way
(:func:`cyb.model.lora.apply_lora`: the adapters plus trainable pause and dk rows), not by TRL.

TRL's padding-free batches and its ``bfd`` packing (which needs them) bring their own collator
and are refused by TRL; ``packing=True`` with ``packing_strategy="wrapped"`` packs documents one
after another into rows that cyb reads as single sequences, as ``cyb train``'s own packing does.
"""

from __future__ import annotations

from ...extras import require
from ...model.lora import apply_lora
from .model import PauseTrainingModel, lora_settings
from .trainer import PauseTrainerMixin

require("trl", "training with TRL's SFTTrainer (cyb.integrations.transformers.PauseSFTTrainer)")
from trl import SFTTrainer  # noqa: E402


class PauseSFTTrainer(PauseTrainerMixin, SFTTrainer):
    """TRL's ``SFTTrainer`` training a :func:`~cyb.integrations.transformers.with_pauses` model
    with cyb's objective; every other argument is SFTTrainer's.  ``peft_config`` (a
    ``peft.LoraConfig``) adds cyb's LoRA to the model before training."""

    def __init__(self, model=None, args=None, data_collator=None, *rest, peft_config=None, **kwargs):
        if peft_config is not None:
            if not isinstance(model, PauseTrainingModel):
                raise TypeError(f"{type(self).__name__} trains a model made by cyb.integrations.transformers."
                                f"with_pauses, got {type(model).__name__}")
            apply_lora(model.pause_model, lora_settings(peft_config))
        super().__init__(model, args, data_collator, *rest, **kwargs)


__all__ = ["PauseSFTTrainer"]

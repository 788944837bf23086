"""cyb inside a ``transformers.Trainer`` or TRL ``SFTTrainer`` script (docs/how-to/integrations.md).

::

    from cyb.integrations.transformers import PauseTrainer, with_pauses

    model = with_pauses(model, tokenizer, method="cyb", num_steps=2)          # was: model
    trainer = PauseTrainer(model=model, args=args, train_dataset=tokenized)   # was: Trainer
    trainer.train()
    trainer.save_model("out/final")     # a cyb model folder: cyb generate out/final ...

* :func:`with_pauses` / :class:`PauseTrainingModel` (:mod:`.model`): the model and its objective
  as the one module the Trainer trains; LoRA from a ``peft.LoraConfig``.
* :class:`PauseCollator` (:mod:`.collator`): pads tokenised examples and lays them out with pauses.
* :class:`PauseTrainer`, :class:`PauseTrainerMixin` (:mod:`.trainer`): ``cyb train``'s loss and
  normalisation, cyb model folders for ``save_model`` and checkpoints (needs ``accelerate``, the
  ``trainer`` extra).
* ``PauseSFTTrainer`` (:mod:`.trl`): the same on TRL's ``SFTTrainer`` (the ``trl`` extra).
* :class:`PauseMetricsCallback` (:mod:`.callback`): E[S] and the stop distribution in every
  logged row.
"""

from .callback import PauseMetrics, PauseMetricsCallback
from .collator import PauseCollator, pad_examples
from .model import PauseTrainingModel, with_pauses


def __getattr__(name):
    """The trainers, imported on first use (they need accelerate, and TRL for ``PauseSFTTrainer``)."""
    if name in ("PauseTrainer", "PauseTrainerMixin", "load_saved_weights"):
        from . import trainer

        return getattr(trainer, name)
    if name == "PauseSFTTrainer":
        from .trl import PauseSFTTrainer

        return PauseSFTTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PauseCollator", "PauseMetrics", "PauseMetricsCallback", "PauseSFTTrainer", "PauseTrainer",
           "PauseTrainerMixin", "PauseTrainingModel", "load_saved_weights", "pad_examples", "with_pauses"]

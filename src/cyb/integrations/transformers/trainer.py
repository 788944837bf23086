"""Training with pauses inside ``transformers.Trainer`` (and trainers built on it, such as TRL's).

:class:`PauseTrainerMixin` is what changes in a Trainer: the loss of a batch is ``cyb train``'s
objective (:class:`cyb.objective.Objective`, through the model's ``forward``), normalised as
``cyb train`` normalises it: the loss of an optimiser step is the mean over the target tokens
of all its micro-batches on all processes, so gradient accumulation and data parallelism give
the update of one large batch.  It also lays batches out (:class:`PauseCollator` by default),
keeps the example columns the collator reads, adds E[S] and the pause statistics to the logs
(:class:`PauseMetricsCallback`), saves cyb model folders (``save_model``, checkpoints) and
resumes from them.

:class:`PauseTrainer` is the mixin on ``transformers.Trainer``; ``PauseSFTTrainer``
(:mod:`cyb.integrations.transformers.trl`) the mixin on TRL's ``SFTTrainer``.  A script with a
Trainer subclass of its own puts the mixin first: ``class MyTrainer(PauseTrainerMixin, MyBase)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...extras import require
from .callback import PauseMetrics, PauseMetricsCallback
from .card import write_trainer_card
from .collator import BATCH_KEY, EXAMPLE_COLUMNS, PauseCollator
from .model import PauseTrainingModel

require("accelerate", "training with transformers.Trainer (cyb.integrations.transformers)")
from transformers import Trainer  # noqa: E402


def _pad_id(processing_class, model: PauseTrainingModel) -> int:
    """A pad id for the collator: the tokenizer's pad, else its end of sequence, else 0 (padding is
    masked, never attended to nor predicted, so any real id does)."""
    for tok in (getattr(processing_class, "tokenizer", processing_class), model.pause_model.tokenizer):
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(tok, name, None)
            if isinstance(value, int):
                return value
    return 0


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    raise ValueError(f"{folder} holds no model.safetensors: not a model folder this trainer saved")


def load_saved_weights(model: PauseTrainingModel, folder) -> None:
    """Put the weights of a folder :meth:`PauseTrainingModel.save_pretrained` wrote (a checkpoint of
    this trainer) back into ``model``: the Hugging Face weights, or a LoRA model's adapters and
    pause rows.  ValueError when the folder does not hold every weight the model needs."""
    from safetensors.torch import load_file

    from ...model.lora import ADAPTER, ADAPTER_WEIGHTS, is_lora, peft_model_of, require_peft

    folder = Path(folder)
    pm = model.pause_model
    if is_lora(pm):
        peft = require_peft("resuming a LoRA run")
        weights = folder / ADAPTER_WEIGHTS
        if not weights.is_file():
            raise ValueError(f"{folder} holds no {ADAPTER_WEIGHTS}: not a LoRA checkpoint of this trainer")
        result = peft.set_peft_model_state_dict(peft_model_of(pm), load_file(str(weights)), adapter_name=ADAPTER)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"{weights} holds tensors this LoRA model lacks: {unexpected[:3]}")
        return
    hf_model = pm.hf_model
    loaded: set[str] = set()
    for path in _weight_files(folder):
        part = load_file(str(path))
        hf_model.load_state_dict(part, strict=False)
        loaded.update(part)
    unique = {n for n, _ in hf_model.named_parameters()}
    tied = {n for n, _ in hf_model.named_parameters(remove_duplicate=False)} - unique
    missing = sorted(set(hf_model.state_dict()) - loaded - tied)
    missing = [k for k in missing if k in unique]
    if missing:
        raise ValueError(f"{folder} lacks weights of this model: {missing[:3]} (a checkpoint of another model?)")


class PauseTrainerMixin:
    """What a ``transformers.Trainer`` needs to train with pauses; put it first among the bases.

    The model must be a :class:`~cyb.integrations.transformers.PauseTrainingModel`
    (:func:`~cyb.integrations.transformers.with_pauses`).  Without a ``data_collator`` the trainer
    uses :class:`PauseCollator`.  The loss it returns for a micro-batch is the objective summed over
    the batch's target tokens divided by the target tokens of the whole optimiser step (every
    micro-batch, every process) and multiplied by the number of processes (DDP averages
    gradients), so one step's gradient is that of ``cyb train`` on the same rows; the logged
    ``loss`` is the step's mean objective per target token.  In evaluation the loss of a batch is
    its own mean per target token.
    """

    #: the loss of compute_loss is already normalised over the accumulated batch (transformers >= 5.19)
    loss_is_scaled_for_ga = True

    def __init__(self, model=None, args=None, data_collator=None, *rest, **kwargs):
        if not isinstance(model, PauseTrainingModel):
            raise TypeError(f"{type(self).__name__} trains a model made by cyb.integrations.transformers.with_pauses "
                            f"(a PauseTrainingModel), got {type(model).__name__}")
        if data_collator is None:
            data_collator = PauseCollator(model, pad_id=_pad_id(kwargs.get("processing_class"), model))
        super().__init__(model, args, data_collator, *rest, **kwargs)
        if self.args.n_gpu > 1:  # Trainer would wrap the model in nn.DataParallel
            raise ValueError(f"{type(self).__name__} does not run nn.DataParallel ({self.args.n_gpu} GPUs visible to one "
                             "process): launch the script with torchrun or accelerate launch (one process per GPU), or "
                             "make one GPU visible with CUDA_VISIBLE_DEVICES")
        # older transformers read this instead of loss_is_scaled_for_ga: the loss is not divided again
        self.model_accepts_loss_kwargs = True
        objective = model.objective
        self.pause_metrics = PauseMetrics(objective.vocab.num_steps, objective.spec.has_dk)
        callback = PauseMetricsCallback(self.pause_metrics)
        self.callback_handler.callbacks.insert(0, callback)  # before TensorBoard, W&B, ... read the row

    # -- data ------------------------------------------------------------------------------------------
    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = list(EXAMPLE_COLUMNS)

    def _get_num_items_in_batch(self, batch_samples: list, device):
        """Target tokens of one optimiser step's micro-batches over every process (the loss normaliser)."""
        local = sum(int(_prepared(b).num_targets) for b in batch_samples)
        total = torch.tensor(float(local), dtype=torch.float64, device=device)
        if self.accelerator.num_processes > 1:
            total = self.accelerator.gather(total.reshape(1)).sum()
        return total

    # -- the loss --------------------------------------------------------------------------------------
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """cyb's objective on a laid-out batch (``inputs["prep"]``), normalised as the class says.
        With ``return_outputs`` also returns ``{"loss_sum", "sums"}``."""
        prep = _prepared(inputs).to(self.args.device, non_blocking=True)
        loss_sum, sums = model(**{BATCH_KEY: prep})
        self.pause_metrics.add("train" if self.model.training else "eval", sums)
        if num_items_in_batch is None:
            loss = loss_sum / max(prep.num_targets, 1)
        else:
            world = self.accelerator.num_processes
            total = torch.as_tensor(num_items_in_batch, device=loss_sum.device)
            loss = loss_sum * (world / total.clamp(min=1)).float()
        return (loss, {"loss_sum": loss_sum, "sums": sums}) if return_outputs else loss

    def evaluation_loop(self, *args, **kwargs):
        """Trainer's evaluation loop, its pause metrics counted from an empty window."""
        self.pause_metrics.windows["eval"] = {}
        return super().evaluation_loop(*args, **kwargs)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """The batch's mean objective per target token (no logits: the readout never builds them)."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    # -- saving and resuming ---------------------------------------------------------------------------
    def _save(self, output_dir=None, state_dict=None):
        """A cyb model folder (``cyb generate``, ``cyb eval`` and ``PauseModel.from_pretrained`` read it),
        with a model card (``README.md``)."""
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        model = self.accelerator.unwrap_model(self.model)
        model.save_pretrained(output_dir, state_dict=state_dict)
        write_trainer_card(output_dir, model, step=self.state.global_step, history=self.state.log_history,
                           trainer_name=type(self).__name__)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if getattr(self, "is_fsdp_enabled", False):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        load_saved_weights(model if model is not None else self.model, resume_from_checkpoint)

    def _load_best_model(self):
        if getattr(self, "is_fsdp_enabled", False):
            return super()._load_best_model()
        load_saved_weights(self.model, self.state.best_model_checkpoint)


def _prepared(batch):
    prep = batch.get(BATCH_KEY) if hasattr(batch, "get") else None
    if prep is None:
        keys = ", ".join(map(str, batch)) if hasattr(batch, "keys") else type(batch).__name__
        raise ValueError(f"the batch has no {BATCH_KEY!r} (it has {keys}): give the trainer "
                         "cyb.integrations.transformers.PauseCollator as data_collator (the default)")
    return prep


class PauseTrainer(PauseTrainerMixin, Trainer):
    """``transformers.Trainer`` training a :func:`~cyb.integrations.transformers.with_pauses` model
    with cyb's objective (see :class:`PauseTrainerMixin`); every other argument is Trainer's."""


__all__ = ["PauseTrainer", "PauseTrainerMixin", "load_saved_weights"]

"""The training loop.

``train(cfg)`` builds the tokenizer, model and data from a :class:`~cyb.config.RunConfig`, then
runs AdamW with a linear-warmup cosine schedule, gradient accumulation normalised by the real
target tokens of the whole optimiser step, gradient clipping, periodic held-out evaluation,
atomic checkpoints with exact resume (at any world size), progress display and JSONL metrics
(and TensorBoard, Weights & Biases).
Under ``torchrun`` the same code runs DDP, FSDP2 or hybrid FSDP2 (HSDP), on one node or several.

:class:`Trainer` exposes the pieces (``accumulate``, ``optimizer_step``, ``evaluate``,
``save``) for tests and custom loops.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from . import __version__
from .build import build_model, build_tokenizer, resolve_device
from .checkpoint import (begin_checkpoint, fault, list_checkpoints, load_checkpoint, load_sharded_state,
                         save_checkpoint, save_sharded_state, temporary_dir)
from .config import RunConfig
from .cpu_numerics import align_compiler, describe as describe_numerics
from .data.packing import resolved_shuffle
from .distributed import (all_reduce_sum, barrier, full_model_state, full_optim_state,
                          gather_objects, init_distributed, load_full_optim_state, main_first, no_sync,
                          reduce_sums, shutdown, wrap)
from .files import replace_dir
from .metrics_log import MetricsLogger, Progress, format_metrics, git_commit
from .model import gates, pause_adapters
from .model.pause_rows import FrozenRows
from .optim import build_optimizer, lr_factor, peak_lr
from .model.lora import is_lora, load_trainable_state, trainable_state, trainable_token_ids
from .run_card import write_run_card
from .model.settings import TRAINING_STATE_FILE
from .objective import LossModule, Objective, merge_sums, summarise
from .run_data import build_data, fraction_choice, fraction_state, row_tokens, trained_task
from .resume import CannotResume, check_resumable, rng_state, set_rng_state
from .run_lock import lock_run
from .run_models import prepare as prepare_model
from .threads import adapt as adapt_threads
from .runtime import autocast

#: Seed family of held-out rows (training rows use the step number).
EVAL_SEED_STEP = -1


def row_seed(seed: int, step: int, row: int) -> int:
    """Seed of the random layout of global row ``row`` at optimiser step ``step``."""
    return ((seed * 1_000_003 + step + 7) * 1_000_033 + row) % (2**62)


@contextmanager
def _quiet_hf_progress():
    """No per-shard progress bar from ``transformers`` while saving (our own output says it)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


@contextmanager
def _rng_kept():
    """The global torch and Python random states as they were before the block."""
    torch_state, py_state = torch.get_rng_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        random.setstate(py_state)


def _strip(batch: dict) -> tuple[dict, list[int]]:
    rows = batch.get("row")
    return {k: v for k, v in batch.items() if k != "row"}, ([] if rows is None else rows.tolist())


class Trainer:
    """A configured run: model, data, optimiser and state, ready to :meth:`run`.

    Construction joins the process group under torchrun, builds everything and resumes from the
    newest checkpoint in ``train.out_dir`` when ``train.resume`` (refusing one of another run).
    """

    def __init__(self, cfg: RunConfig):
        cfg.validate()
        self.run_dir = Path(cfg.train.out_dir)  # as given (the paths written into it are absolute)
        self.cfg = cfg = cfg.with_local_paths()
        t = cfg.train
        self.info = info = init_distributed(
            t.distributed, "cuda" if t.device.startswith("cuda") or (t.device == "auto" and torch.cuda.is_available()) else "cpu")
        self.device = resolve_device(t.device, info)
        per_rank = t.batch_size // info.world_size
        if per_rank * info.world_size != t.batch_size:
            raise ValueError(f"train.batch_size ({t.batch_size}) must be a multiple of the number of "
                             f"processes ({info.world_size})")
        self.micro = t.micro_batch_size or per_rank
        if per_rank % self.micro:
            raise ValueError(f"train.micro_batch_size ({self.micro}) must divide the batch of each of "
                             f"the {info.world_size} processes ({per_rank})")
        self.accum = per_rank // self.micro
        created = info.is_main and not self.run_dir.exists()
        self.lock = lock_run(self.run_dir, info)
        try:
            ckpt = self._checkpoint_to_resume()
            torch.manual_seed(t.seed)
            random.seed(t.seed)
            self._build(ckpt)
        except BaseException:
            self.release()
            if created:  # a run that never started leaves no folder behind (bad data, model, ...)
                shutil.rmtree(self.run_dir, ignore_errors=True)
            raise

    def release(self) -> None:
        """Let the run folder's lock go (at the end of :meth:`run`; idempotent)."""
        if getattr(self, "lock", None) is not None:
            self.lock.release()

    def _build(self, ckpt) -> None:
        """Tokenizer, model, objective, wrappers, optimiser, data; then the checkpoint's state."""
        cfg, t, info = self.cfg, self.cfg.train, self.info
        with main_first(info):  # model.name_or_path a checkpoint: its model, written once into the cache
            if info.is_main:
                prepare_model(cfg.model.name_or_path)
        self.tokenizer = build_tokenizer(cfg, self.run_dir, info)
        if cfg.data.task:  # a task's rows are as long as its longest example: measured before the check
            with _rng_kept():  # the model starts as it would with the data built after it
                self.train_data, self.valid_batches = build_data(cfg, self.tokenizer, info, self.micro)
        self._check_memory(row_tokens(self.train_data) if cfg.data.task else None)
        self.model = model = build_model(cfg, self.tokenizer).to(self.device)
        restored = load_checkpoint(ckpt) if ckpt is not None else None
        if restored is not None and restored[0] is not None:  # full weights go in before any sharding
            if is_lora(model):  # the trainable tensors only; the frozen ones are the base model's
                load_trainable_state(model, restored[0])
            else:
                model.load_hf_state_dict(restored[0])
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if t.compile:
            align_compiler()
            for layer in model.decoder_layers():
                layer.compile()
        # method.pause_rows frozen: the rows as they start (a resumed run's are its checkpoint's)
        self.frozen_rows = FrozenRows.capture(model) if cfg.method.pause_rows == "frozen" else None
        self.objective = Objective(cfg.method, model.vocab, model.dk_bias, t.loss_impl)
        self.loss_module = LossModule(model, self.objective)
        self.wrapped = wrap(self.loss_module, info, layers=model.decoder_layers(),
                            mixed_precision=self.device.type == "cuda" and t.precision != "fp32")
        if not cfg.data.task:  # packed text: tokenised once the memory plan is known to fit
            self.train_data, self.valid_batches = build_data(cfg, self.tokenizer, info, self.micro)
        self._check_positions()
        if t.epochs:  # the schedule ends with the last pass
            t.steps = self.train_data.steps_of(t.epochs, restored[2] if restored is not None else None)
        self.lr = peak_lr(cfg, model.config.hidden_size)
        self.optimizer = build_optimizer(self.loss_module, cfg, self.lr)
        schedule = lambda s: lr_factor(s, warmup=cfg.optim.warmup_steps, total=t.steps,
                                       min_ratio=cfg.optim.min_lr_ratio)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)

        self.step = 0
        self.saved_step = 0  # the step of the newest checkpoint (0: none)
        self.window: dict = {}  # metric sums since the last logged line
        self.last_valid: dict = {}
        if restored is not None:
            model_state, trainer_state, data_state, meta = restored
            if model_state is None:  # sharded: into the model and optimiser as now set up
                load_sharded_state(ckpt, self.loss_module, self.optimizer)
            else:
                load_full_optim_state(self.loss_module, self.optimizer, trainer_state["optimizer"], info)
            self.scheduler.load_state_dict(trainer_state["scheduler"])
            rngs = trainer_state["rng"]
            set_rng_state(rngs[info.rank] if info.rank < len(rngs) else rngs[0])
            self.train_data.load_state_dict(data_state)
            self.step = self.saved_step = int(meta["step"])
            if self.step > t.steps:
                what = f"train.epochs ({t.epochs:g}: {t.steps} steps)" if t.epochs else f"train.steps ({t.steps})"
                raise CannotResume(f"{what} is below the step of the checkpoint in "
                                 f"{self.run_dir} ({self.step}); raise it or use another train.out_dir")
            self.last_valid = meta.get("metrics") or {}
            if info.is_main:
                self.window = dict(meta.get("window") or {})
        self._iter = None

    # ------------------------------------------------------------------------- set-up
    def _checkpoint_to_resume(self):
        import sys

        from .checkpoint import newest_good_checkpoint

        if not list_checkpoints(self.run_dir):
            return None
        if not self.cfg.train.resume:
            raise CannotResume(f"train.out_dir ({self.run_dir}) already holds checkpoints and train.resume "
                             "is false; use another train.out_dir, or resume them (train.resume=true)")
        # the first process reads (and hashes) the checkpoints; every process resumes from its pick
        found = newest_good_checkpoint(self.run_dir) if self.info.is_main else None
        ckpt, skipped = gather_objects(found, self.info)[0]
        if self.info.is_main:
            for path, reason in skipped:
                print(f"warning: not resuming from {path}: {reason}", file=sys.stderr, flush=True)
        if ckpt is None:
            raise CannotResume(f"no checkpoint in {self.run_dir} can be resumed from (all are damaged: "
                             + "; ".join(f"{p.name}: {r}" for p, r in skipped) + "); restore one from a "
                             "copy, or move them away to train this run afresh")
        if skipped and self.info.is_main:
            print(f"warning: resuming from the newest intact checkpoint, {ckpt.path}", file=sys.stderr,
                  flush=True)
        check_resumable(ckpt.meta.get("config", {}), self.cfg, self.run_dir)
        return ckpt

    def _check_memory(self, real_tokens: int | None = None) -> None:
        """On a GPU, refuse (MemoryPlanError) a run whose estimated peak memory per process
        exceeds the free memory (``train.memory_check``); say the estimate when it fits.
        ``real_tokens``: the real tokens of a training row where the data are built already."""
        import sys

        from . import memory_estimate

        if not self.cfg.train.memory_check:
            return
        capacity = memory_estimate.device_capacity(self.device)
        if capacity is None:
            return
        capacity = min(gather_objects(capacity, self.info))  # every process decides alike
        shape = memory_estimate.run_shape(self.cfg, len(self.tokenizer))
        if shape is None:
            if self.info.is_main:
                print("note: no memory estimate (the model's config.json is not available locally)",
                      file=sys.stderr, flush=True)
            return
        est = memory_estimate.estimate(self.cfg, shape, world_size=self.info.world_size,
                                       device_type=self.device.type,
                                       shard_size=self.info.shard_size if self.info.sharded else None,
                                       real_tokens=real_tokens)
        memory_estimate.check_fits(est, capacity, self.cfg)
        if self.info.is_main:
            gib = memory_estimate.GIB
            print(f"memory estimate: {est.peak / gib:.1f} GiB per GPU of {capacity / gib:.1f} "
                  "GiB free (cyb train --estimate-memory shows the breakdown)", file=sys.stderr, flush=True)

    def _check_positions(self) -> None:
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if not isinstance(limit, int) or not self.valid_batches:
            return
        batch, rows = _strip(self.valid_batches[0])
        need = self.objective.prepare(batch, seeds=rows or None).max_position
        if need >= limit:
            field = "model.max_position_embeddings" if not self.cfg.model.name_or_path else "the model's max_position_embeddings"
            raise ValueError(f"sequences need positions up to {need} but {field} = {limit}; "
                             "lower data.block_len (or method.random_pause_fraction) or raise the limit")

    def _seeds(self, rows: list[int], step: int) -> list[int] | None:
        return [row_seed(self.cfg.train.seed, step, r) for r in rows] if rows else None

    # ------------------------------------------------------------------------- one step
    def accumulate(self, batches: list[dict]) -> dict:
        """Forward and backward over this process's micro-batches of one optimiser step.

        Gradients are left in ``.grad``, scaled so that they equal the gradient of the mean
        loss over the real target tokens of the whole step (all micro-batches, all processes).
        Returns the detached metric sums (plus ``real``: real input tokens).
        """
        preps = []
        for b in batches:
            batch, rows = _strip(b)
            preps.append(self.objective.prepare({k: v.cpu() for k, v in batch.items()},
                                                seeds=self._seeds(rows, self.step)))
        local = sum(p.num_targets for p in preps)
        total = all_reduce_sum(local, self.info, self.device)
        if isinstance(total, torch.Tensor):
            scale = (self.info.world_size / total.clamp(min=1)).float()
        else:
            scale = self.info.world_size / max(total, 1)
        sums: dict = {"real": sum(p.num_real for p in preps)}
        for i, prep in enumerate(preps):
            prep = prep.to(self.device, non_blocking=True)
            with no_sync(self.wrapped, self.info, sync=i == len(preps) - 1), autocast(self.device, self.cfg.train.precision):
                loss_sum, part = self.wrapped(prep)
                (loss_sum * scale).backward()
            merge_sums(sums, part)
        return sums

    def optimizer_step(self):
        """Clip, step the optimiser and the LR schedule; returns the gradient norm (a tensor,
        before clipping) or None without clipping."""
        norm = None
        if self.cfg.optim.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.loss_module.parameters(), self.cfg.optim.grad_clip)
        self.optimizer.step()
        if self.frozen_rows is not None:
            self.frozen_rows.restore()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        return norm

    def _prefetch(self) -> None:
        """Draw the first micro-batch now (it is handed out first by :meth:`train_step`)."""
        if self._iter is None:
            it = iter(self.train_data)
            self._iter = itertools.chain([next(it)], it)

    def train_step(self):
        """Draw the next global batch, accumulate, step; returns ``(sums, grad_norm)``."""
        if self._iter is None:
            self._iter = iter(self.train_data)
        batches = [next(self._iter) for _ in range(self.accum)]
        self.objective.set_step(self.step + 1)
        me = self.cfg.method
        if me.pause_visibility == "gated" and me.pause_gate_anneal_steps:
            gates.fill_gates(self.model.hf_model, gates.annealed_bias(me.pause_gate_init, me.pause_gate_anneal_steps,
                                                                       self.step + 1))
        sums = self.accumulate(batches)
        return sums, self.optimizer_step()

    # ------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self) -> dict:
        """Held-out metrics over the same rows at any world size (see :func:`summarise`)."""
        # DDP needs no wrapper without gradients; FSDP must gather its shards.
        module = self.wrapped if self.info.sharded and self.info.enabled else self.loss_module
        module.eval()
        sums: dict = {}
        for b in self.valid_batches:
            batch, rows = _strip(b)
            prep = self.objective.prepare(batch, seeds=self._seeds(rows, EVAL_SEED_STEP))
            with autocast(self.device, self.cfg.train.precision):
                _, part = module(prep.to(self.device, non_blocking=True))
            merge_sums(sums, part)
        module.train()
        if not self.valid_batches:
            return {}
        return summarise(reduce_sums(sums, self.info, self.device))

    # ------------------------------------------------------------------------- persistence
    def _hf_state(self, trainable_only: bool = False) -> dict:
        """The Hugging Face model's full state dict, or its trainable tensors only (a collective
        under FSDP)."""
        full = full_model_state(self.loss_module, self.info, trainable_only=trainable_only)
        prefix = "model." + self.model.hf_prefix
        return {k[len(prefix):]: v for k, v in full.items() if k.startswith(prefix)}

    def save(self) -> None:
        """Write a checkpoint of the current step (every process must call it)."""
        tmp = None
        trainer_state = {"scheduler": self.scheduler.state_dict()}
        if self.cfg.train.checkpoint_format == "sharded":
            if self.info.is_main:
                begin_checkpoint(self.run_dir, self.step, suffix="shards")
            barrier(self.info)
            tmp = temporary_dir(self.run_dir, self.step, suffix="shards")
            save_sharded_state(tmp, self.loss_module, self.optimizer)  # returns once all shards are written
            model_state = None
        else:
            lora = is_lora(self.model)  # the frozen weights are the base model's: not gathered nor written
            model_state = self._hf_state(trainable_only=lora)
            if lora:
                model_state = trainable_state(self.model, model_state) if self.info.is_main else None
            trainer_state["optimizer"] = full_optim_state(self.loss_module, self.optimizer, self.info)
        trainer_state["rng"] = gather_objects(rng_state(), self.info)
        window = reduce_sums(self.window, self.info, self.device) if self.window else {}
        if self.info.is_main:
            save_checkpoint(
                self.run_dir, self.step, model_state=model_state, tmp=tmp, trainer_state=trainer_state,
                data_state=self.train_data.state_dict(),
                meta={"metrics": self.last_valid, "window": window, "config": self.cfg.to_dict(),
                      "version": __version__, "world_size": self.info.world_size},
                keep_last=self.cfg.train.keep_last)
        if self.window:  # the saved window now lives on rank 0 only, as on resume
            self.window = window if self.info.is_main else {}
        barrier(self.info)
        self.saved_step = self.step

    def training_state(self) -> dict:
        """Where training stands: ``step``, ``epochs`` over the training data (None while
        unknown) and ``real_tokens_seen`` (real input tokens of the optimiser steps so far); for a
        task run its task (:func:`cyb.run_data.trained_task`), for a share of the training text
        what it holds (:func:`cyb.run_data.fraction_state`)."""
        t = self.cfg.train
        rows = self.cfg.method.spec.context(self.cfg.method, self.cfg.data.block_len)
        return {"step": self.step, "epochs": self.train_data.epochs(),
                "real_tokens_seen": None if self.cfg.data.task else self.step * t.batch_size * rows,
                **trained_task(self.cfg), **fraction_state(self.train_data)}

    def save_final(self) -> Path:
        """Write ``out_dir/final`` (a plain Hugging Face folder plus ``cyb_pause.json``; for a LoRA
        run the adapter folder of :func:`cyb.model.lora.save_adapter`), replaced atomically."""
        state = None
        if self.info.sharded and self.info.enabled:
            hf_model = self.model.hf_model
            unique = {n for n, _ in hf_model.named_parameters()}
            tied = {n for n, _ in hf_model.named_parameters(remove_duplicate=False)} - unique
            state = {k: v for k, v in self._hf_state(trainable_only=is_lora(self.model)).items()
                     if k not in tied}  # as HF saves them
        final = self.run_dir / "final"
        if self.info.is_main:
            for stale in self.run_dir.glob("final.tmp-*"):  # a killed save's half-written model
                shutil.rmtree(stale, ignore_errors=True)
            tmp = self.run_dir / f"final.tmp-{os.getpid()}"
            with _quiet_hf_progress():
                self.model.save_pretrained(tmp, state_dict=state)
            (tmp / TRAINING_STATE_FILE).write_text(json.dumps(self.training_state(), indent=2))
            write_run_card(tmp, self)  # README.md: base, method, measured numbers, command
            replace_dir(tmp, final)
        barrier(self.info)
        return final

    # ------------------------------------------------------------------------- the loop
    def _log_train(self, logger, progress, grad_norm, elapsed: float) -> dict:
        sums = reduce_sums(self.window, self.info, self.device)
        metrics = summarise(sums)
        if grad_norm is not None and hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        metrics.update(step=self.step, lr=self.scheduler.get_last_lr()[0],
                       grad_norm=None if grad_norm is None else float(grad_norm),
                       tokens_per_s=sums.get("real", 0.0) / max(elapsed, 1e-9),
                       **gates.gate_summary(self.loss_module))
        epochs = self.train_data.epochs()
        if epochs is not None:
            metrics["epoch"] = epochs
        logger.log("train", metrics)
        progress.update(self.step, metrics)
        self.window = {}
        return metrics

    def _log_valid(self, logger, progress) -> None:
        self.last_valid = {**self.evaluate(), "step": self.step}
        epochs = self.train_data.epochs()
        if epochs is not None:
            self.last_valid["epoch"] = epochs
        logger.log("valid", self.last_valid)
        progress.write(f"step {self.step}: held-out {format_metrics(self.last_valid)} "
                       f"({self.last_valid.get('targets', 0):,} tokens)")

    def _announce(self, progress: Progress, resumed: bool) -> None:
        t = self.cfg.train
        params, trainable = self.model.num_parameters(), self.model.num_parameters(only_trainable=True)
        if is_lora(self.model):
            lo = self.cfg.lora
            rows = " and the pause/dk rows" if trainable_token_ids(self.model.settings) else ""
            sizes = (f"{params / 1e6:.2f}M parameters, {trainable:,} trainable ({100 * trainable / params:.2g}%: "
                     f"LoRA rank {lo.rank} on {', '.join(lo.target_modules)}{rows})")
        elif self.cfg.method.pause_adapter_base == "freeze":
            sizes = (f"{params / 1e6:.2f}M parameters, the base frozen: only the pause adapters and the "
                     f"pause/dk embedding rows train")
        elif trainable < params:
            sizes = f"{params / 1e6:.2f}M parameters, all trainable but {params - trainable:,} (gates on a schedule)"
        else:
            sizes = f"{params / 1e6:.2f}M parameters, all trainable"
        if pause_adapters.has_pause_adapters(self.model):
            sizes += f" ({pause_adapters.describe(self.model)})"
        if self.frozen_rows is not None:
            sizes += f", the {len(self.frozen_rows.ids)} pause rows frozen (method.pause_rows)"
        progress.write(
            f"cyb train: {self.cfg.method.name} (M={self.model.num_steps}), {sizes}, "
            f"{self.device} x {self.info.world_size} process(es)"
            + (f" ({torch.get_num_threads()} CPU thread(s), {describe_numerics()})"
               if self.device.type == "cpu" else "")
            + f", batch {t.batch_size} = "
            f"{self.info.world_size} x {self.accum} x {self.micro}, peak lr {self.lr:.3g}, "
            f"out_dir {self.run_dir}" + (f"; resumed at step {self.step}" if resumed else ""))
        d = self.cfg.data
        if not d.task:
            order = resolved_shuffle(d.shuffle, d.source)
            progress.write({"corpus": "training data: all blocks in a seeded random order (data.shuffle = "
                                      "corpus; the corpus is tokenised before the first step)",
                            "buffer": f"training data: random order within windows of {d.shuffle_buffer} "
                                      "blocks (data.shuffle = buffer)",
                            "none": "warning: data.shuffle = none: training blocks come in corpus order, so "
                                    "each batch holds a few consecutive documents; small models reach a much "
                                    "worse held-out perplexity this way (use corpus or buffer)"}[order])
            if (choice := fraction_choice(self.train_data)) is not None:
                progress.write(f"training data: data.fraction = {d.fraction:g}, {choice.describe()}")
        if t.epochs:
            progress.write(f"train.epochs = {t.epochs:g}: {t.steps} steps of {t.batch_size} rows")
        if self.cfg.optim.warmup_steps >= t.steps:
            progress.write(f"note: optim.warmup_steps ({self.cfg.optim.warmup_steps}) >= train.steps "
                           f"({t.steps}): the LR never reaches its peak")

    def run(self) -> dict:
        """Train to ``train.steps``; returns the final held-out metrics."""
        t, info = self.cfg.train, self.info
        logger = MetricsLogger(self.run_dir, enabled=info.is_main, tensorboard=t.tensorboard,
                               wandb=self._wandb_run() if info.is_main else None)
        logger.truncate_after(self.step)
        if info.is_main:
            run_info = {"config": self.cfg.to_dict(), "version": __version__, "git_commit": git_commit(),
                        "world_size": info.world_size, "device": str(self.device),
                        "num_parameters": self.model.num_parameters(),
                        "trainable_parameters": self.model.num_parameters(only_trainable=True),
                        "lora": is_lora(self.model), "peak_lr": self.lr,
                        "settings": self.model.settings.to_dict()}
            (self.run_dir / "run.json").write_text(json.dumps(run_info, indent=2))
            self.cfg.dump(self.run_dir / "config.yaml")
        progress = Progress(t.steps, self.step, f"train {self.cfg.method.name}",
                            enabled=info.is_main, bar=t.progress)
        self._announce(progress, self.step > 0)
        delay = float(fault("step_delay") or 0.0)
        try:
            if self.step == 0 and t.eval_every and self.valid_batches:  # where training starts from
                self._log_valid(logger, progress)
            self._prefetch()  # reading (and, shuffled, tokenising) the corpus is not training time
            window_start = time.perf_counter()
            self.model.train()
            epoch_before = math.floor(self.train_data.epochs() or 0.0)
            while self.step < t.steps:
                adapt_threads()  # the cores other work leaves free (when the command line chose them)
                sums, grad_norm = self.train_step()
                merge_sums(self.window, sums)
                epoch_now = self.train_data.epochs()
                if epoch_now is not None and math.floor(epoch_now) > epoch_before:
                    epoch_before = math.floor(epoch_now)
                    progress.write(f"note: step {self.step} completes epoch {epoch_before} of the training "
                                   "data; from here on the model sees training data it has seen before")
                if delay:
                    time.sleep(delay)
                if self.step % max(t.log_every, 1) == 0 or self.step == t.steps:
                    self._log_train(logger, progress, grad_norm, time.perf_counter() - window_start)
                    window_start = time.perf_counter()
                else:
                    progress.update(self.step)
                paused = time.perf_counter()  # evaluation and checkpoints do not count in tokens/s
                if (t.eval_every and self.step % t.eval_every == 0) or self.step == t.steps:
                    self._log_valid(logger, progress)
                if (t.save_every and self.step % t.save_every == 0) or self.step == t.steps:
                    self.save()
                window_start += time.perf_counter() - paused
            final = self.save_final()
            if info.is_main:
                (self.run_dir / "final_metrics.json").write_text(json.dumps(self.last_valid, indent=2))
                if logger.wandb is not None:
                    logger.wandb.finish_run(final, self.last_valid)
        except KeyboardInterrupt:
            raise TrainingInterrupted(self._interrupted() if info.is_main else "") from None
        finally:
            progress.close()
            logger.close()
            self.release()
        return self.last_valid

    def _wandb_run(self):
        """The W&B run of ``train.wandb`` (:class:`cyb.wandb_log.WandbRun`), or None."""
        t = self.cfg.train
        if not t.wandb:
            return None
        from .wandb_log import WandbRun

        return WandbRun(self.run_dir, self.cfg.to_dict(), project=t.wandb_project, name=t.wandb_name)

    def _interrupted(self) -> str:
        """What an interruption (Ctrl-C) at the current step loses, and how to go on."""
        t, lost = self.cfg.train, self.step - self.saved_step
        if self.saved_step == 0:
            return (f"interrupted at step {self.step}, before the first checkpoint (train.save_every = "
                    f"{t.save_every}): those {lost} step(s) are lost; running the same command again starts "
                    "the run afresh")
        where = f"the last checkpoint (step {self.saved_step}) in {self.run_dir}"
        return (f"interrupted at step {self.step}: " + (f"the {lost} step(s) since {where} are lost"
                                                         if lost else f"nothing is lost, {where} holds it")
                + f"; running the same command again resumes from step {self.saved_step}")


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during training; the message says which steps are lost and how to resume."""


def train(cfg: RunConfig) -> dict:
    """Run training as configured; returns the final held-out metrics."""
    trainer = Trainer(cfg)
    try:
        return trainer.run()
    finally:
        shutdown(trainer.info)


__all__ = ["CannotResume", "LossModule", "Trainer", "TrainingInterrupted", "build_optimizer", "check_resumable",
           "lr_factor", "peak_lr", "row_seed", "train"]

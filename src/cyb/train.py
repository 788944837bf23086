"""The training loop: one readable file.

``train(cfg)`` builds the tokenizer, model and data from a :class:`~cyb.config.RunConfig`, then
runs AdamW with a linear-warmup cosine schedule, gradient accumulation normalised by real
tokens, gradient clipping, periodic held-out evaluation, atomic checkpoints with exact resume,
a progress bar and JSONL metrics.  Under ``torchrun`` the same code runs DDP or FSDP2.
"""

from __future__ import annotations

import json
import math
import random
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from . import __version__
from .build import build_data, build_model, build_tokenizer, resolve_device
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from .config import RunConfig
from .distributed import (DistInfo, all_reduce_dict, all_reduce_sum, barrier, full_model_state,
                          full_optim_state, init_distributed, load_full_optim_state, no_sync,
                          shutdown, wrap)
from .metrics_log import MetricsLogger, git_commit
from .objective import LossOutput, Objective, Prepared, merge_sums, summarise


class LossModule(torch.nn.Module):
    """The model and its objective as one module, so DDP/FSDP hooks see every forward."""

    def __init__(self, model, objective: Objective):
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, prep: Prepared) -> LossOutput:
        return self.objective.loss(self.model, prep)


def peak_lr(cfg: RunConfig, d_model: int) -> float:
    """The configured LR, or the paper's ``alpha / sqrt(d_model)``."""
    return cfg.optim.lr if cfg.optim.lr is not None else cfg.optim.lr_alpha / math.sqrt(d_model)


def lr_factor(step: int, *, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine decay to ``min_ratio`` at ``total`` (step counts from 0)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    span = max(total - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: torch.nn.Module, cfg: RunConfig, lr: float, device: torch.device):
    """AdamW with decoupled weight decay on matrices only (fused kernels on CUDA)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.optim.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    kw = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=lr, betas=(cfg.optim.beta1, cfg.optim.beta2),
                             eps=cfg.optim.eps, **kw)


def _rng_state(gen: torch.Generator) -> dict:
    state = {"torch": torch.get_rng_state(), "gen": gen.get_state(),
             "python": list(random.getstate()[1])}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict, gen: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    gen.set_state(state["gen"])
    random.setstate((3, tuple(int(x) for x in state["python"]), None))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _autocast(device: torch.device, precision: str):
    if precision == "bf16" or (precision == "auto" and device.type == "cuda"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


@torch.no_grad()
def evaluate(module, objective: Objective, batches, device, precision: str, info: DistInfo,
             generator: torch.Generator | None = None) -> dict:
    """Held-out metrics (loss, perplexity, mean steps) over ``batches`` of every process.

    ``module`` is the (possibly wrapped) :class:`LossModule`, called as a module so that
    FSDP gathers its parameters.
    """
    module.eval()
    sums: dict = {}
    for batch in batches:
        batch = {k: v.to(device) for k, v in batch.items()}
        with _autocast(device, precision):
            prep = objective.prepare(batch, generator=generator)
            out = module(prep)
        merge_sums(sums, out.sums)
    module.train()
    return summarise(all_reduce_dict(sums, info, device))


def train(cfg: RunConfig) -> dict:
    """Run training as configured; returns the final held-out metrics."""
    cfg.validate()
    t = cfg.train
    info = init_distributed(t.distributed, "cuda" if t.device.startswith("cuda") or
                            (t.device == "auto" and torch.cuda.is_available()) else "cpu")
    device = resolve_device(t.device, info)
    torch.manual_seed(t.seed)
    random.seed(t.seed)
    run_dir = Path(t.out_dir)
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    barrier(info)

    tokenizer = build_tokenizer(cfg, run_dir, info)
    model = build_model(cfg, tokenizer).to(device)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if t.compile:
        for layer in model.decoder_layers():
            layer.compile()
    objective = Objective(cfg.method, model.vocab, model.dk_bias, t.loss_impl)
    loss_module = LossModule(model, objective)
    wrapped = wrap(loss_module, info, layers=model.decoder_layers(),
                   mixed_precision=device.type == "cuda" and t.precision != "fp32")
    d_model = model.config.hidden_size
    lr = peak_lr(cfg, d_model)
    optimizer = build_optimizer(loss_module, cfg, lr, device)
    schedule = lambda s: lr_factor(s, warmup=cfg.optim.warmup_steps, total=t.steps,
                                   min_ratio=cfg.optim.min_lr_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)

    per_rank = t.batch_size // info.world_size
    if per_rank * info.world_size != t.batch_size:
        raise ValueError(f"train.batch_size ({t.batch_size}) must be a multiple of the world size ({info.world_size})")
    micro = t.micro_batch_size or per_rank
    if per_rank % micro:
        raise ValueError(f"train.micro_batch_size ({micro}) must divide the per-process batch ({per_rank})")
    accum = per_rank // micro
    train_data, valid_batches = build_data(cfg, tokenizer, info, micro)
    gen = torch.Generator().manual_seed(t.seed * 1_000_003 + info.rank)

    step = 0
    ckpt = latest_checkpoint(run_dir) if t.resume else None
    if ckpt is not None:
        model_state, trainer_state, data_state, meta = load_checkpoint(ckpt)
        model.load_hf_state_dict(model_state)
        load_full_optim_state(loss_module, optimizer, trainer_state["optimizer"], info)
        scheduler.load_state_dict(trainer_state["scheduler"])
        _set_rng_state(trainer_state["rng"][info.rank] if info.rank < len(trainer_state["rng"])
                       else trainer_state["rng"][0], gen)
        train_data.load_state_dict(data_state)
        step = meta["step"]

    logger = MetricsLogger(run_dir, enabled=info.is_main, tensorboard=t.tensorboard)
    logger.truncate_after(step)
    if info.is_main:
        run_info = {"config": cfg.to_dict(), "version": __version__, "git_commit": git_commit(),
                    "world_size": info.world_size, "device": str(device),
                    "num_parameters": model.num_parameters(), "peak_lr": lr, "settings": model.settings.to_dict()}
        (run_dir / "run.json").write_text(json.dumps(run_info, indent=2))
        cfg.dump(run_dir / "config.yaml")

    bar = None
    if info.is_main and t.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=t.steps, initial=step, desc=f"train {cfg.method.name}", unit="step",
                   dynamic_ncols=True)
    final_metrics: dict = {}
    window_tokens, window_start = 0, time.perf_counter()
    train_iter = iter(train_data)
    model.train()
    while step < t.steps:
        batches = [{k: v.to(device) for k, v in next(train_iter).items()} for _ in range(accum)]
        with _autocast(device, t.precision):
            preps = [objective.prepare(b, generator=gen) for b in batches]
        local_tokens = sum(p.num_tokens for p in preps)
        global_tokens = all_reduce_sum(local_tokens, info, device)
        scale = info.world_size / max(global_tokens, 1.0)
        sums: dict = {}
        for i, prep in enumerate(preps):
            with no_sync(wrapped, info, sync=i == accum - 1), _autocast(device, t.precision):
                out = wrapped(prep)
                (out.loss_sum * scale).backward()
            merge_sums(sums, out.sums)
        grad_norm = None
        if cfg.optim.grad_clip > 0:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(loss_module.parameters(), cfg.optim.grad_clip))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        step += 1
        window_tokens += global_tokens

        if step % max(t.log_every, 1) == 0 or step == t.steps:
            elapsed = time.perf_counter() - window_start
            metrics = summarise(all_reduce_dict(sums, info, device))
            metrics.update(step=step, lr=scheduler.get_last_lr()[0], grad_norm=grad_norm,
                           tokens_per_s=window_tokens / max(elapsed, 1e-9))
            logger.log("train", metrics)
            if bar is not None:
                post = {"loss": f"{metrics['loss']:.3f}", "tok/s": f"{metrics['tokens_per_s']:.0f}"}
                if "mean_steps" in metrics:
                    post["E[S]"] = f"{metrics['mean_steps']:.2f}"
                bar.set_postfix(post)
            window_tokens, window_start = 0, time.perf_counter()
        if bar is not None:
            bar.update(1)

        if (t.eval_every and step % t.eval_every == 0) or step == t.steps:
            final_metrics = evaluate(wrapped, objective, valid_batches, device, t.precision, info,
                                     generator=torch.Generator().manual_seed(t.seed + 17))
            final_metrics["step"] = step
            logger.log("valid", final_metrics)
            if bar is not None:
                bar.write(f"step {step}: valid loss {final_metrics['loss']:.4f} "
                          f"ppl {final_metrics['ppl']:.3f}" +
                          (f" mean steps {final_metrics['mean_steps']:.2f}" if "mean_steps" in final_metrics else ""))
        if (t.save_every and step % t.save_every == 0) or step == t.steps:
            _save(run_dir, step, model, loss_module, optimizer, scheduler, gen, train_data, info,
                  cfg, final_metrics, t.keep_last)
    if bar is not None:
        bar.close()
    if info.is_main:
        model.save_pretrained(run_dir / "final", state_dict=None if info.mode != "fsdp"
                              else _hf_state(model, loss_module, info))
        (run_dir / "final_metrics.json").write_text(json.dumps(final_metrics, indent=2))
    logger.close()
    barrier(info)
    shutdown(info)
    return final_metrics


def _hf_state(model, loss_module, info: DistInfo) -> dict:
    """The wrapped Hugging Face model's full state dict (gathered under FSDP)."""
    full = full_model_state(loss_module, info)
    prefix = "model." + model.hf_prefix
    return {k[len(prefix):]: v for k, v in full.items() if k.startswith(prefix)}


def _save(run_dir, step, model, loss_module, optimizer, scheduler, gen, train_data, info, cfg,
          metrics, keep_last) -> None:
    model_state = _hf_state(model, loss_module, info)
    optim_state = full_optim_state(loss_module, optimizer, info)
    rng = [_rng_state(gen)]
    if info.enabled:
        import torch.distributed as dist

        gathered = [None] * info.world_size
        dist.all_gather_object(gathered, rng[0])
        rng = gathered
    if info.is_main:
        save_checkpoint(run_dir, step, model_state=model_state,
                        trainer_state={"optimizer": optim_state, "scheduler": scheduler.state_dict(), "rng": rng},
                        data_state=train_data.state_dict(),
                        meta={"metrics": metrics, "version": __version__, "world_size": info.world_size},
                        keep_last=keep_last)
    barrier(info)

"""Process groups, model wrapping (DDP / FSDP2) and full state dicts for any world size.

Started by ``torchrun``, the trainer reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and joins a
process group (NCCL on CUDA, gloo on CPU).  Without those variables everything is a no-op.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    mode: str = "none"  # none | ddp | fsdp

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(mode: str, device_kind: str) -> DistInfo:
    """Join the process group when started by torchrun.

    ``mode``: ``auto`` (DDP when WORLD_SIZE > 1), ``ddp``, ``fsdp`` or ``none``.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or mode == "none":
        return DistInfo()
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        backend = "nccl" if device_kind == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local)
        dist.init_process_group(backend=backend)
    return DistInfo(rank, world, local, "ddp" if mode == "auto" else mode)


def wrap(module: torch.nn.Module, info: DistInfo, *, layers=None, mixed_precision: bool = False):
    """Wrap ``module`` for data parallelism.

    DDP replicates; FSDP2 (``fully_shard``) shards each of ``layers`` and the root, with a bf16
    mixed-precision policy and fp32 gradient reduction when ``mixed_precision``.
    """
    if not info.enabled:
        return module
    if info.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        device_ids = [info.local_rank] if torch.cuda.is_available() and next(module.parameters()).is_cuda else None
        return DDP(module, device_ids=device_ids)
    if info.mode == "fsdp":
        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError:  # torch < 2.6
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
        kw = {}
        if mixed_precision:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in layers or []:
            fully_shard(layer, **kw)
        fully_shard(module, **kw)
        return module
    raise ValueError(f"unknown distributed mode {info.mode!r}")


def no_sync(module, info: DistInfo, sync: bool):
    """Context skipping the gradient all-reduce on non-final micro-batches."""
    if not info.enabled or sync:
        if info.mode == "fsdp" and info.enabled:
            module.set_requires_gradient_sync(True)
        return nullcontext()
    if info.mode == "ddp":
        return module.no_sync()
    module.set_requires_gradient_sync(False)
    return nullcontext()


def all_reduce_sum(value: float | int, info: DistInfo, device) -> float:
    if not info.enabled:
        return value
    t = torch.tensor(float(value), dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t)


def all_reduce_dict(sums: dict, info: DistInfo, device) -> dict:
    """Sum metric dicts (numbers and lists of numbers) over processes."""
    if not info.enabled:
        return sums
    keys = sorted(sums)
    flat, shape = [], []
    for k in keys:
        v = sums[k]
        vals = v if isinstance(v, list) else [v]
        shape.append((k, len(vals), isinstance(v, list)))
        flat.extend(float(x) for x in vals)
    t = torch.tensor(flat, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    out, i = {}, 0
    for k, n, is_list in shape:
        vals = t[i : i + n].tolist()
        out[k] = vals if is_list else vals[0]
        i += n
    return out


def full_model_state(module: torch.nn.Module, info: DistInfo) -> dict:
    """Full (unsharded) state dict on CPU; identical on every rank count."""
    if info.mode == "fsdp" and info.enabled:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


def full_optim_state(module, optimizer, info: DistInfo) -> dict:
    if info.mode == "fsdp" and info.enabled:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(module, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return optimizer.state_dict()


def load_full_optim_state(module, optimizer, state: dict, info: DistInfo) -> None:
    if info.mode == "fsdp" and info.enabled:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(module, optimizer, state,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))
        return
    optimizer.load_state_dict(state)


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def main_first(info: DistInfo):
    """Let rank 0 do something (e.g. train a tokenizer) before the others read its result."""
    if not info.is_main:
        barrier(info)
    yield
    if info.is_main:
        barrier(info)

"""Process groups, model wrapping (DDP / FSDP2) and full state dicts for any world size.

Started by ``torchrun``, the trainer reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and joins a
process group (NCCL on CUDA, gloo on CPU).  Without those variables everything is a no-op.
"""

from __future__ import annotations

import inspect
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
    mode: str = "none"  # none | ddp | fsdp | hsdp
    local_world_size: int = 1  # processes on this node (torchrun's LOCAL_WORLD_SIZE)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def sharded(self) -> bool:
        """FSDP2: every process holds a shard of the weights (``fsdp``, or ``hsdp`` within a node)."""
        return self.mode in ("fsdp", "hsdp")

    @property
    def shard_size(self) -> int:
        """Processes one copy of the weights is sharded over: all of them (``fsdp``), the node's
        (``hsdp``), else 1."""
        return {"fsdp": self.world_size, "hsdp": self.local_world_size}.get(self.mode, 1)


def init_distributed(mode: str, device_kind: str) -> DistInfo:
    """Join the process group when started by torchrun (``WORLD_SIZE`` > 1).

    ``mode``: ``auto`` (DDP when WORLD_SIZE > 1), ``ddp``, ``fsdp``, ``hsdp`` (FSDP2 sharding
    within a node and replicas across nodes: :func:`hybrid_mesh`) or ``none`` (refused under a
    multi-process launch: every process would train and write the same run alone).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if mode == "none":
        raise ValueError(f"train.distributed: 'none' under a launch of WORLD_SIZE={world} processes; "
                         "use auto, ddp or fsdp, or start a single process")
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if mode == "hsdp" and (world % local_world or local_world < 1):
        raise ValueError(f"train.distributed: hsdp needs the same number of processes on every node; "
                         f"LOCAL_WORLD_SIZE={local_world} does not divide WORLD_SIZE={world}")
    if not dist.is_initialized():
        backend = "nccl" if device_kind == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local)
        dist.init_process_group(backend=backend)
    return DistInfo(rank, world, local, "ddp" if mode == "auto" else mode, local_world)


def hybrid_mesh(info: DistInfo, device_type: str):
    """The 2-D device mesh of ``hsdp``: ``(nodes, processes per node)``, named ``("replicate",
    "shard")``: FSDP2 shards the weights over the processes of a node and keeps one replica per
    node, so the all-gathers stay within a node and only gradient all-reduces cross nodes."""
    from torch.distributed.device_mesh import init_device_mesh

    nodes = info.world_size // info.local_world_size
    return init_device_mesh(device_type, (nodes, info.local_world_size), mesh_dim_names=("replicate", "shard"))


def wrap(module: torch.nn.Module, info: DistInfo, *, layers=None, mixed_precision: bool = False):
    """Wrap ``module`` for data parallelism (returns it unchanged in a single process).

    DDP replicates (buffers are not re-broadcast at each forward: they are the same on every
    process); FSDP2 (``fully_shard``) shards each of ``layers`` and the root, over every process
    (``fsdp``) or over the processes of each node with a replica per node (``hsdp``,
    :func:`hybrid_mesh`), with a bf16 mixed-precision policy and fp32 gradient reduction when
    ``mixed_precision``.  Gradients are averaged over processes in all three.
    """
    if not info.enabled:
        return module
    if info.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        on_gpu = next(module.parameters()).is_cuda
        # newer torch renamed the switch; buffers are equal on every process after init anyway
        params = inspect.signature(DDP.__init__).parameters
        sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}
        return DDP(module, device_ids=[info.local_rank] if on_gpu else None, **sync)
    if info.sharded:
        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError:  # torch < 2.6
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
        kw = {}
        if info.mode == "hsdp":
            kw["mesh"] = hybrid_mesh(info, next(module.parameters()).device.type)
        if mixed_precision:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in layers or []:
            fully_shard(layer, **kw)
        fully_shard(module, **kw)
        return module
    raise ValueError(f"train.distributed: unknown mode {info.mode!r}")


def no_sync(module, info: DistInfo, sync: bool):
    """Context skipping the gradient all-reduce on non-final micro-batches."""
    if not info.enabled:
        return nullcontext()
    if info.sharded:
        module.set_requires_gradient_sync(sync)
        return nullcontext()
    return nullcontext() if sync else module.no_sync()


def all_reduce_sum(value: float | int, info: DistInfo, device):
    """The sum of ``value`` over processes: the value itself in one process, else a float64
    tensor on ``device`` (left on the device: no host synchronisation)."""
    if not info.enabled:
        return value
    t = torch.tensor(float(value), dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t


def reduce_sums(sums: dict, info: DistInfo, device) -> dict:
    """Metric sums (tensors, numbers, vectors) summed over processes, as Python numbers.

    Every process must call it with the same keys.  One device synchronisation.
    """
    keys = sorted(sums)
    parts, shape = [], []
    for k in keys:
        v = sums[k]
        t = v.detach().to(device=device, dtype=torch.float64).reshape(-1) if isinstance(v, torch.Tensor) \
            else torch.tensor([float(v)], dtype=torch.float64, device=device)
        parts.append(t)
        shape.append((k, t.numel(), isinstance(v, torch.Tensor) and v.dim() > 0))
    if not parts:
        return {}
    flat = torch.cat(parts)
    if info.enabled:
        dist.all_reduce(flat)
    values = flat.cpu().tolist()
    out, i = {}, 0
    for k, n, is_vec in shape:
        out[k] = values[i:i + n] if is_vec else values[i]
        i += n
    return out


def gather_objects(obj, info: DistInfo) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` on every process (``[obj]`` in one process)."""
    if not info.enabled:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def full_model_state(module: torch.nn.Module, info: DistInfo, *, trainable_only: bool = False) -> dict:
    """Full (unsharded) state dict on CPU; identical at every world size.  Under FSDP a
    collective (call it on every process); the result is complete on rank 0.
    ``trainable_only``: the parameters that require gradients, nothing else (under FSDP the
    frozen ones are then not gathered at all)."""
    if info.sharded and info.enabled:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(module, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only))
    state = module.state_dict()
    if trainable_only:
        state = {n: p for n, p in module.named_parameters() if p.requires_grad}
    return {k: v.detach().cpu() for k, v in state.items()}


def _param_names(module: torch.nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in module.named_parameters()}


def full_optim_state(module, optimizer, info: DistInfo) -> dict:
    """The optimiser's full state keyed by parameter name (the same layout at any world size
    and with DDP or FSDP2).  Under FSDP a collective: call it on every process; the result is
    complete on rank 0."""
    if info.sharded and info.enabled:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(module, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    names = _param_names(module)
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    sd = optimizer.state_dict()
    state = {order[i]: {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in st.items()}
             for i, st in sd["state"].items()}
    groups = [{**g, "params": [order[i] for i in g["params"]]} for g in sd["param_groups"]]
    return {"state": state, "param_groups": groups}


def load_full_optim_state(module, optimizer, state: dict, info: DistInfo) -> None:
    """Load :func:`full_optim_state` output (written at any world size) into ``optimizer``."""
    groups = state.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
        raise ValueError("the checkpoint's optimiser state does not match this model's parameter groups")
    if info.sharded and info.enabled:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(module, optimizer, state,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))
        return
    names = _param_names(module)
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    index = {name: i for i, name in enumerate(order)}
    missing = [n for g in groups for n in g["params"] if n not in index]
    if missing:
        raise ValueError(f"the checkpoint's optimiser state names parameters this model lacks: {missing[:3]}")
    sd = {"state": {index[name]: st for name, st in state["state"].items()},
          "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in groups]}
    optimizer.load_state_dict(sd)


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

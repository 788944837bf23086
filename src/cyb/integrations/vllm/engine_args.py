"""The engine arguments of a cyb model: what makes ``vllm serve RUN_FOLDER`` serve it.

vLLM's registries take new model classes, renderers and logits processors, but choosing them
for a model is left to the engine's arguments (``--hf-overrides``, ``--tokenizer-mode``,
``--logits-processors``...).  So that ``vllm serve RUN_FOLDER`` and ``vllm.LLM(RUN_FOLDER)``
need none of them, :func:`install` wraps vLLM's ``EngineArgs.create_model_config`` (the one step
every engine takes before it reads a model): when the model is a local cyb folder (a run folder,
its ``final/`` model or a checkpoint, as ``cyb serve`` takes them), :func:`prepare` sets

* ``model`` (and ``tokenizer``) to the folder that holds the model, ``served_model_name`` to what
  was given (so clients name the model as it was given);
* ``hf_overrides``: the pause layout (read by the readout, the renderer and the model class)
  and, for shared positions, the architecture ``CybShared<Arch>``
  (:mod:`cyb.integrations.vllm.model`) with ``max_position_embeddings`` ``M`` times the model's
  (real tokens keep their limit: vLLM counts pauses as tokens);
* ``tokenizer_mode`` ``cyb``: the Hugging Face tokenizer with the pause renderer
  (:mod:`cyb.integrations.vllm.renderer`);
* ``logits_processors``: the readout (:mod:`cyb.integrations.vllm.readout`);
* ``logprobs_mode`` ``processed_logits`` (unless set): a sampled token's logprob is its step
  code, so that fixed mode's steps can be read back;
* on vLLM's CPU build, ``gpu_memory_utilization`` (the share of the machine's memory each worker
  reserves) when it was left at vLLM's default: half the free memory for the cache plus the
  weights (:func:`_fit_memory_share`), said in the log.

A checkpoint's model is written into cyb's cache the first time it is served.  Anything else
(other folders, hub names) is left to vLLM as it is.  A cyb model that vLLM cannot run is refused
with one line that says why (:func:`cyb.integrations.vllm.pauses.refusal`; speculative decoding;
on the CPU build, a head dimension vLLM's CPU attention does not take).
"""

from __future__ import annotations

import functools
import math
import os
import sys
from pathlib import Path

from .pauses import CYB_SERVE, ServedPauses, Unservable, read_config, refusal, settings_of

#: the tokenizer mode whose renderer lays prompts out with their pauses (registered by the plugin)
TOKENIZER_MODE = "cyb"
#: rope types whose rotary embedding reads no max_position_embeddings (the limit only sizes its table)
_PLAIN_ROPE = (None, "default", "linear", "llama3")


def install() -> None:
    """Wrap ``EngineArgs.create_model_config`` once (see the module docstring)."""
    from vllm.engine.arg_utils import EngineArgs

    current = EngineArgs.create_model_config
    if getattr(current, "_cyb_pauses", False):
        return

    @functools.wraps(current)
    def create_model_config(self):
        prepare(self)
        return current(self)

    create_model_config._cyb_pauses = True
    EngineArgs.create_model_config = create_model_config


def model_folder(given) -> Path | None:
    """The model folder of a local cyb folder (run folder, model folder, checkpoint), else None.
    A checkpoint's model is written into cyb's cache the first time (as ``cyb serve`` does); a
    run folder whose training has not finished is refused."""
    if not isinstance(given, (str, os.PathLike)):
        return None
    path = Path(str(given)).expanduser()
    if not path.is_dir():
        return None
    from ...model.sources import resolve_model_source
    from ...run_models import prepare as build_checkpoint_model

    try:
        build_checkpoint_model(str(path))  # a training checkpoint: its model written into the cache once
        folder = Path(str(resolve_model_source(str(path))))
    except ValueError as e:
        raise Unservable(str(e).splitlines()[0]) from None
    return folder if settings_of(folder) is not None else None


def refuse(reason: str):
    """Stop with ``reason``: one line on standard error under the ``vllm`` command, else a
    :class:`~cyb.integrations.vllm.pauses.Unservable` error."""
    message = f"cyb: {reason}"
    if Path(sys.argv[0]).name == "vllm":
        raise SystemExit(message)
    raise Unservable(message)


def _check_tokenizer(folder: Path, pauses: ServedPauses) -> str | None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = sorted(pauses.special_ids)
    if ids and tok.decode(ids, skip_special_tokens=True).strip():
        return (f"{folder}: its tokenizer does not mark the pause and dk tokens as special, so vLLM would put "
                "them in the text; serve it with `cyb serve MODEL` instead")
    return None


def overrides(folder: Path, pauses: ServedPauses) -> dict:
    """The ``hf_overrides`` of a pause model (see the module docstring)."""
    from .model import shared_name
    from .readout import CONFIG_KEY, config_value

    out = {CONFIG_KEY: config_value(pauses)}
    if not pauses.shared_positions or pauses.num_steps == 1:
        return out
    cfg = read_config(folder)
    archs = cfg.get("architectures") or []
    if len(archs) != 1:
        refuse(f"{folder}: config.json must name one architecture, got {archs!r}")
    out["architectures"] = [shared_name(archs[0])]
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    limit = cfg.get("max_position_embeddings")
    if isinstance(limit, int) and rope_type in _PLAIN_ROPE:
        out["max_position_embeddings"] = limit * pauses.num_steps
    return out


def prepare(args) -> None:
    """Set ``args`` (vLLM's ``EngineArgs``) for the cyb model it names, refuse one vLLM cannot
    run, or leave ``args`` alone when it names no cyb model."""
    from .readout import readout_class

    given = args.model
    try:
        folder = model_folder(given)
    except Unservable as e:
        refuse(str(e))
    if folder is None:
        return
    settings = settings_of(folder)
    reason = refusal(folder, settings)
    if reason is None:
        pauses = ServedPauses.of(settings)
        reason = _check_tokenizer(folder, pauses)
    if reason is None:
        reason = _engine_refusal(folder, args)
    if reason is not None:
        refuse(reason)
    if args.tokenizer_mode not in ("auto", "hf", TOKENIZER_MODE):
        refuse(f"tokenizer_mode {args.tokenizer_mode!r}: a pause model needs its Hugging Face tokenizer "
               "(leave --tokenizer-mode out)")
    ours = overrides(folder, pauses)
    if callable(args.hf_overrides):
        theirs = args.hf_overrides

        def combined(config):
            config = theirs(config)
            config.update(ours)
            return config

        args.hf_overrides = combined
    else:
        args.hf_overrides = {**(args.hf_overrides or {}), **ours}
    if args.tokenizer in (None, given):
        args.tokenizer = str(folder)
    if args.served_model_name is None:
        args.served_model_name = str(given)
    args.model = str(folder)
    args.tokenizer_mode = TOKENIZER_MODE
    readout = readout_class(pauses)
    procs = [p for p in (args.logits_processors or []) if p != readout]
    args.logits_processors = [*procs, readout]
    if args.logprobs_mode == "raw_logprobs":
        args.logprobs_mode = "processed_logits"
    _say(f"cyb: {given}: the pause model in {folder} (M = {pauses.num_steps}, {pauses.position_scheme} positions, "
         f"default mode {pauses.default_mode}; pause ids {list(pauses.pause_ids)}, dk id {pauses.dk_id})")
    _fit_memory_share(args, folder)


def _on_cpu() -> bool:
    """Whether vLLM runs on its CPU build (False where vLLM is not installed)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return current_platform.is_cpu()


def head_dim(folder: Path) -> int | None:
    """The attention heads' dimension of the saved model in ``folder`` (``head_dim``, else
    ``hidden_size / num_attention_heads``), or None when its config names neither."""
    cfg = read_config(folder)
    cfg = cfg.get("text_config", cfg) if "num_attention_heads" not in cfg else cfg
    if isinstance(cfg.get("head_dim"), int):
        return cfg["head_dim"]
    hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 else None


def _engine_refusal(folder: Path, args) -> str | None:
    """Why vLLM's engine, as ``args`` set it, cannot run the pause model in ``folder``, or None:
    speculative decoding, or on the CPU build a head dimension its attention does not take."""
    if getattr(args, "speculative_config", None):
        return (f"{folder}: speculative decoding is not offered for a pause model (its readout decides one token "
                "per request per step): leave --speculative-config out")
    if not _on_cpu():
        return None
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes = CPUAttentionBackend.get_supported_head_sizes()
    dim = head_dim(folder)
    if dim is not None and dim not in sizes:
        return (f"{folder}: its attention heads have dimension {dim}, which vLLM's CPU attention does not run "
                f"(it takes {', '.join(map(str, sizes))}); {CYB_SERVE}")
    return None


def _fit_memory_share(args, folder: Path) -> None:
    """On the CPU build, when ``--gpu-memory-utilization`` was left at vLLM's default and no KV
    cache size was given, set a share that fits, and say so.

    vLLM-CPU reserves that share of the machine's memory for each worker, the model's weights
    and the rest KV cache: at its default, 0.92, it stops at start where less is free, and where
    that much is free it fills it (on a 24 GiB machine with 22 GiB free, a worker was killed for
    memory while it allocated 21 GiB of cache for a tiny model).  The share given here is half the
    free memory for the cache plus twice the weights' files (a float32 load of 16-bit weights), per
    worker of this machine (tensor x pipeline parallel size), and never more than 90% of what is
    free nor more than vLLM's default.
    """
    if not _on_cpu() or getattr(args, "kv_cache_memory_bytes", None) is not None or os.environ.get(
            "VLLM_CPU_KVCACHE_SPACE"):
        return
    from vllm.engine.arg_utils import EngineArgs

    default = EngineArgs.gpu_memory_utilization
    if getattr(args, "gpu_memory_utilization", default) != default:
        return
    total, free = _memory()
    if total <= 0 or free <= 0:
        return
    workers = int(getattr(args, "tensor_parallel_size", 1) or 1) * int(getattr(args, "pipeline_parallel_size", 1) or 1)
    workers = max(1, workers)
    weights = 2 * sum(f.stat().st_size for f in folder.glob("*.safetensors")) / workers
    budget = min(0.9 * free / workers, 0.5 * free / workers + weights)
    share = min(default, math.floor(100 * budget / total) / 100)
    if share <= 0:
        return
    args.gpu_memory_utilization = share
    gib = 1 << 30
    _say(f"cyb: --gpu-memory-utilization not given: using {share} ({share * total / gib:.1f} GiB per worker: half the "
         f"{free / gib:.1f} GiB free for the KV cache, plus the weights) in place of vLLM-CPU's {default} "
         f"({default * total / gib:.1f} GiB of {total / gib:.1f}); pass --gpu-memory-utilization or --kv-cache-memory-bytes to "
         "choose")


def _memory() -> tuple[int, int]:
    """``(total, available)`` bytes of the memory vLLM-CPU's first worker reserves from (its NUMA
    node's, read as vLLM reads it)."""
    try:
        from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

        info = get_memory_node_info(get_allowed_cpu_list()[0].numa_node)
        return int(info.total_memory), int(info.available_memory)
    except Exception:  # noqa: BLE001 - vLLM's helpers moved: the machine's numbers
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.total), int(vm.available)


def _say(line: str) -> None:
    """One line through vLLM's logger (its handlers print the lines of loggers named vllm.*)."""
    import logging

    logging.getLogger("vllm.cyb").info(line)


__all__ = ["TOKENIZER_MODE", "head_dim", "install", "model_folder", "overrides", "prepare", "refuse"]

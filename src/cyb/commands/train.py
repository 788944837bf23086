"""``cyb train CONFIG [--set key=value ...]``."""

from __future__ import annotations

import argparse
import os
import sys

HELP = "train a model (baseline, TBYS, CYB and variants) from a YAML config"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="YAML run configuration (see configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, e.g. --set train.steps=100 --set method.name=tbys")
    p.add_argument("--help-config", action="store_true",
                   help="list every configuration field with its default and meaning, then exit")
    p.add_argument("--check", action="store_true",
                   help="validate the configuration, check that the data sources and the model and tokenizer "
                        "folders it names exist, and exit")
    p.add_argument("--estimate-memory", action="store_true",
                   help="print the estimated peak GPU memory per process of this run (weights, "
                        "gradients, AdamW state, activations, readout; see cyb.memory_estimate) and exit")
    p.add_argument("--world-size", type=int, default=1, metavar="N",
                   help="processes to assume with --estimate-memory (FSDP divides by it)")


def run(args) -> int:
    from ..config import ConfigError, RunConfig, field_docs

    if args.help_config:
        defaults = RunConfig().to_dict()
        for key, doc in field_docs().items():
            section, name = key.split(".")
            print(f"{key} = {defaults[section][name]!r}\n    {doc}")
        return 0
    if not args.config:
        print("cyb train: error: a CONFIG file is required (see configs/, or --help-config)", file=sys.stderr)
        return 2
    if args.world_size != 1 and not args.estimate_memory:
        print("cyb train: error: --world-size goes with --estimate-memory; to train on N processes: torchrun "
              "--nproc_per_node=N -m cyb train CONFIG", file=sys.stderr)
        return 2
    try:
        cfg = RunConfig.load(args.config, args.overrides)
    except ConfigError as e:
        print(f"cyb train: error: invalid configuration: {e}", file=sys.stderr)
        return 2
    if args.check:
        from ..build import check_paths
        from ..extras import MissingPackage

        try:
            notes = check_paths(cfg)
        except (FileNotFoundError, ValueError, MissingPackage) as e:
            print(f"cyb train: error: invalid configuration: {e}", file=sys.stderr)
            return 2
        for note in notes:
            print(f"note: {note}")
        print(f"{args.config}: configuration is valid; "
              + ("the local paths it names exist" if notes else "the data and model it names exist"))
        return 0
    if args.estimate_memory:
        return _estimate_memory(cfg, args.world_size)
    from ..train import train

    metrics = train(cfg)
    if os.environ.get("RANK", "0") == "0":
        if metrics:
            print("final held-out: " + " ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in metrics.items() if not isinstance(v, list)))
        print(f"run folder: {cfg.train.out_dir} (model in final/, metrics in metrics.jsonl)")
    return 0


def _vocab_size(cfg) -> int:
    """The tokenizer size of a from-scratch run, without training a tokenizer."""
    if cfg.data.tokenizer:  # a task's rows too are written with it
        from ..data.tokenizer import load_tokenizer

        return len(load_tokenizer(cfg.data.tokenizer))
    if cfg.data.task:
        from ..build import own_task_bpe
        from ..data.synthetic import CharTokenizer

        if own_task_bpe(cfg):  # a reasoning-gym task from scratch: a BPE of its questions
            return cfg.data.bpe_vocab_size

        return len(CharTokenizer().to_hf())
    return cfg.data.bpe_vocab_size


def _estimate_memory(cfg, world_size: int) -> int:
    from .. import memory_estimate

    if world_size < 1:
        print("cyb train: error: --world-size must be >= 1", file=sys.stderr)
        return 2
    try:
        shape = memory_estimate.run_shape(cfg, None if cfg.model.name_or_path else _vocab_size(cfg))
    except (OSError, ValueError) as e:
        print(f"cyb train: error: cannot read the tokenizer for the estimate: {e}", file=sys.stderr)
        return 2
    if shape is None:
        print(f"cyb train: error: no estimate: the config.json of {cfg.model.name_or_path} is not available "
              "locally", file=sys.stderr)
        return 2
    est = memory_estimate.estimate(cfg, shape, world_size=world_size, device_type="cuda")
    print(est.describe())
    if cfg.data.task:
        print(f"note: the task's rows are counted at data.block_len ({cfg.data.block_len}) real tokens, the "
              "most; cyb train checks the plan again at its longest example once the data are built")
    return 0

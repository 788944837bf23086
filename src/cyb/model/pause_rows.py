"""Pause rows frozen at their initial values (``method.pause_rows: frozen``), an ablation.

A pause token's embedding row is a learned input like any other token's; frozen, the pauses are
fixed inputs that add no trainable parameters, and what a pause model gains over the baseline
cannot come from those rows.  The rows of every pause id (steps ``2..M``) in the input
embedding, and in the output embedding where it is a separate tensor, are put back to their
values at the start after every optimiser step (:class:`FrozenRows`), so that neither the
gradient, Adam's moments nor weight decay moves them.  The dk row is not a pause row: it trains.
"""

from __future__ import annotations

import torch

from . import hf

#: The choices of ``method.pause_rows``.
ROWS = ("train", "frozen")


def check_settings(method, lora, train) -> None:
    """ValueError naming the field when ``method.pause_rows`` cannot apply to this run."""
    if method.pause_rows not in ROWS:
        raise ValueError(f"method.pause_rows must be one of {', '.join(ROWS)}, got {method.pause_rows!r}")
    if method.pause_rows == "train":
        return
    if not method.uses_pauses:
        raise ValueError(f"method.pause_rows = frozen needs a method with pauses, not {method.name}")
    if method.num_steps < 2:
        raise ValueError(f"method.pause_rows = frozen needs pauses: method.num_steps >= 2, got {method.num_steps}")
    if lora.rank:
        raise ValueError("method.pause_rows = frozen applies to full fine-tuning (LoRA trains the pause rows "
                         "through its own copies): set lora.rank = 0")
    if train.distributed in ("fsdp", "hsdp"):
        raise ValueError("method.pause_rows = frozen keeps whole embedding rows, which FSDP shards: use "
                         "train.distributed ddp or none")


class FrozenRows:
    """The pause rows of a model's embeddings, kept at the values they had when captured."""

    def __init__(self, weights: list[torch.Tensor], ids: list[int]) -> None:
        self.ids = torch.tensor(ids, dtype=torch.long, device=weights[0].device)
        self.weights = weights
        self.values = [w.detach()[self.ids].clone() for w in weights]

    @classmethod
    def capture(cls, model) -> "FrozenRows":
        """The pause rows of ``model`` (a :class:`cyb.PauseModel`) as they are now."""
        ids = sorted(set(int(i) for i in model.settings.pause_ids))
        if not ids:
            raise ValueError("the model has no pause ids: nothing to freeze")
        return cls(hf.embedding_weights(model.hf_model), ids)

    @torch.no_grad()
    def restore(self) -> None:
        """Put the rows back (after an optimiser step)."""
        for w, v in zip(self.weights, self.values):
            w.index_copy_(0, self.ids.to(w.device), v.to(device=w.device, dtype=w.dtype))


__all__ = ["ROWS", "FrozenRows", "check_settings"]

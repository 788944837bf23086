"""Per-real-token readout of held-out data, collected batch by batch.

Only ``[B, L, M]`` per-step terms leave the device (never logits): for ``N`` evaluated tokens
the records hold ``3 * N * M`` float32 numbers and ``2 * N`` ids.

Attribution: the block of real token ``k`` (the token and its ``M-1`` pauses) predicts token
``k+1``.  A record keeps both ids: ``input_ids`` (token ``k``, after which the pauses come) and
``target_ids`` (token ``k+1``, the token being predicted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..losses import expected_stop_step


@dataclass
class Passage:
    """A held-out passage for shaded text.

    Attributes:
        token_ids: the real token ids of the passage, in order.
        pauses: for each token, the expected number of pauses (``E[S] - 1``, in ``[0, M-1]``)
            of the block that *predicts* it (the block of the token before), as in the paper's
            Fig. 1b; ``nan`` where no block predicts it (the first token, tokens outside the
            loss mask, models without dk).
    """

    token_ids: list[int]
    pauses: list[float]


@dataclass
class TokenRecords:
    """Per-token readout of ``N`` evaluated real tokens (CPU tensors).

    Attributes:
        input_ids: ``[N]`` long, the real token fed at the first step of each block.
        target_ids: ``[N]`` long, the token the block predicts (the next real token).
        log_t, log_d, log_not_d: ``[N, M]`` float32 per-step readout (``log_d = -inf``,
            ``log_not_d = 0`` without dk; ``d_M`` as the network gives it).
        passages: a few passages for shaded text.
        sequences: rows of data the tokens came from.
    """

    input_ids: torch.Tensor
    target_ids: torch.Tensor
    log_t: torch.Tensor
    log_d: torch.Tensor
    log_not_d: torch.Tensor
    passages: list[Passage] = field(default_factory=list)
    sequences: int = 0

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_steps(self) -> int:
        return int(self.log_t.shape[-1])


class RecordCollector:
    """Accumulates :class:`TokenRecords` from batches.

    Args:
        num_steps: ``M`` of the per-step terms.
        has_dk: whether the model has a dk output (passages then carry expected pauses).
        num_passages: passages to keep for shaded text (the first rows seen).
        passage_tokens: longest passage kept, in real tokens.
    """

    def __init__(self, num_steps: int, *, has_dk: bool, num_passages: int = 3, passage_tokens: int = 256):
        if num_passages < 0:
            raise ValueError(f"num_passages must be >= 0, got {num_passages}")
        if passage_tokens < 1:
            raise ValueError(f"passage_tokens must be >= 1, got {passage_tokens}")
        self.num_steps = num_steps
        self.has_dk = has_dk
        self.num_passages = num_passages
        self.passage_tokens = passage_tokens
        self._parts: list[tuple[torch.Tensor, ...]] = []
        self.passages: list[Passage] = []
        self.sequences = 0
        self.tokens = 0

    def add_blocks(
        self,
        ids: torch.Tensor,
        valid: torch.Tensor,
        block_labels: torch.Tensor,
        log_t: torch.Tensor,
        log_d: torch.Tensor,
        log_not_d: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
    ) -> int:
        """Add a batch laid out in blocks; returns the number of tokens added.

        Args:
            ids: ``[B, L]`` real token ids.
            valid: ``[B, L]`` bool, blocks with a target.
            block_labels: ``[B, L]`` the target of each block.
            log_t, log_d, log_not_d: ``[B, L, M]`` per-step readout (any device, detached).
            attention_mask: ``[B, L]`` 1 on real tokens (None: all real).
        """
        m = self.num_steps
        if log_t.shape[-1] != m or log_t.shape[:2] != ids.shape:
            raise ValueError(f"per-step terms must be [B, L, M={m}] for ids {tuple(ids.shape)}, "
                             f"got {tuple(log_t.shape)}")
        valid = valid.bool()
        terms = [x.detach().float()[valid].cpu() for x in (log_t, log_d, log_not_d)]
        self._parts.append((ids[valid].cpu().long(), block_labels[valid].cpu().long(), *terms))
        self._keep_passages(ids, valid, log_d, log_not_d, attention_mask)
        self.sequences += int(ids.shape[0])
        n = int(valid.sum())
        self.tokens += n
        return n

    def add_flat(self, input_ids: torch.Tensor, labels: torch.Tensor, log_t: torch.Tensor, rows: int) -> int:
        """Add a batch without blocks (one readout per labelled position, ``M = 1``).

        ``input_ids``, ``labels``, ``log_t``: ``[B, T]``; positions with ``labels = -100`` are
        skipped.  Returns the number of tokens added.
        """
        if self.num_steps != 1:
            raise ValueError("flat batches carry one step per token; build the collector with num_steps=1")
        valid = labels != -100
        lt = log_t.detach().float()[valid].cpu().unsqueeze(-1)
        self._parts.append((input_ids[valid].cpu().long(), labels[valid].cpu().long(), lt,
                            torch.full_like(lt, -math.inf), torch.zeros_like(lt)))
        self.sequences += rows
        n = int(valid.sum())
        self.tokens += n
        return n

    def _keep_passages(self, ids, valid, log_d, log_not_d, attention_mask) -> None:
        need = self.num_passages - len(self.passages)
        if need <= 0:
            return
        rows = min(need, ids.shape[0])
        if self.has_dk:
            pauses = expected_stop_step(log_d[:rows].detach().float(), log_not_d[:rows].detach().float()) - 1
            pauses = torch.where(valid[:rows], pauses, torch.full_like(pauses, math.nan)).cpu()
        else:
            pauses = torch.full(ids[:rows].shape, math.nan)
        for r in range(rows):
            keep = attention_mask[r].bool().cpu() if attention_mask is not None else torch.ones(ids.shape[1], dtype=torch.bool)
            row_ids = ids[r].cpu()[keep][: self.passage_tokens].tolist()
            row_pauses = pauses[r][keep][: self.passage_tokens].tolist()
            # Token j is predicted by the block of token j - 1.
            shade = [math.nan] + row_pauses[:-1]
            self.passages.append(Passage(row_ids, shade[: len(row_ids)]))

    def finish(self) -> TokenRecords:
        """The records collected so far (raises if none)."""
        if not self._parts or self.tokens == 0:
            raise ValueError("no evaluated tokens: the held-out data holds no token with a target "
                             "(check --data, --tokens and the loss mask)")
        cols = list(zip(*self._parts))
        return TokenRecords(
            input_ids=torch.cat(cols[0]),
            target_ids=torch.cat(cols[1]),
            log_t=torch.cat(cols[2]),
            log_d=torch.cat(cols[3]),
            log_not_d=torch.cat(cols[4]),
            passages=list(self.passages),
            sequences=self.sequences,
        )

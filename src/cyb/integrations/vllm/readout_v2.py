"""The readout's state on vLLM's Model Runner V2 (vLLM's default wherever triton has a GPU
backend).

Model Runner V2 gives a logits processor a persistent *slot* per request (``add_request``; slots
are recycled) and, at every ``apply(logits, ctx)``, the step's rows in an order of its own:
``ctx.expanded_idx_mapping`` maps each logits row to its slot, ``ctx.pos`` gives the position
of the token each row fed and ``ctx.input_ids`` that token.  The tokens fed before live in the
runner's token table (``req_states.all_token_ids``, ``[slots, max_model_len]`` on the device,
the prompt laid out with its pauses followed by the output).

:class:`SlotReadout` keeps the request settings per slot (host arrays, copied to the device in
``apply_staged_writes``) and fixed mode's block memory per slot on the device, and reads
everything else from the runner's tables each step:

* the step of each row: ``1 +`` the pauses at the end of the tokens fed (the row's input and
  the ``M - 2`` before it);
* the index of the token it decides (sampling only): the real tokens of the output, from the
  prompt's end to the row's position;
* fixed mode's block: the position where the current block began, ``pos - (step - 1)``; a
  block memory written at another position is stale.

Nothing in :meth:`SlotReadout.apply` reads the device from the host: the greedy, top-k and
top-p flags it branches on are the host copies of the settings.
"""

from __future__ import annotations

import numpy as np
import torch

from .pauses import ServedPauses
from .decisions import RequestSettings, decide, feed, force, pause_table


class SlotReadout:
    """The readout's slots on Model Runner V2 (see the module docstring).

    Args:
        pauses: the model's pause layout.
        req_states: the runner's ``LogitsProcRequestState`` (``max_num_reqs``, ``device``,
            ``all_token_ids``, ``prompt_len``), read only.
    """

    def __init__(self, pauses: ServedPauses, req_states) -> None:
        self.pauses = pauses
        self.req_states = req_states
        n, m, dev = req_states.max_num_reqs, pauses.num_steps, req_states.device
        self.device = dev
        # settings per slot, written by add_request on the host
        self.fixed = np.zeros(n, dtype=bool)
        self.greedy = np.ones(n, dtype=bool)
        self.temperature = np.ones(n, dtype=np.float32)
        self.top_k = np.zeros(n, dtype=np.int64)
        self.top_p = np.ones(n, dtype=np.float32)
        self.key = np.zeros(n, dtype=np.int64)
        self._staged: list[int] = []  # slots (re)filled since the last apply_staged_writes
        # their device copies
        self.d_fixed = torch.zeros(n, dtype=torch.bool, device=dev)
        self.d_greedy = torch.ones(n, dtype=torch.bool, device=dev)
        self.d_temperature = torch.ones(n, dtype=torch.float32, device=dev)
        self.d_top_k = torch.zeros(n, dtype=torch.long, device=dev)
        self.d_top_p = torch.ones(n, dtype=torch.float32, device=dev)
        self.d_key = torch.zeros(n, dtype=torch.long, device=dev)
        # fixed mode's block memory: where the block began, and per step (answered, token)
        self.block_start = torch.full((n,), -1, dtype=torch.long, device=dev)
        self.block_answered = torch.zeros(n, m, dtype=torch.bool, device=dev)
        self.block_token = torch.zeros(n, m, dtype=torch.long, device=dev)
        self.pause_ids = torch.tensor(sorted(set(pauses.pause_ids)), dtype=torch.long, device=dev)
        self.pauses_after = pause_table(pauses, dev)

    def add_request(self, slot: int, params) -> None:
        s = RequestSettings(params, self.pauses.default_mode)
        self.fixed[slot] = s.mode == "fixed"
        self.greedy[slot] = s.greedy
        self.temperature[slot] = s.temperature
        self.top_k[slot] = s.top_k
        self.top_p[slot] = s.top_p
        self.key[slot] = s.key
        self._staged.append(slot)

    def apply_staged_writes(self) -> None:
        if not self._staged:
            return
        slots = torch.tensor(sorted(set(self._staged)), dtype=torch.long)
        self._staged.clear()
        on = slots.to(self.device)
        for host, dev in ((self.fixed, self.d_fixed), (self.greedy, self.d_greedy),
                          (self.temperature, self.d_temperature), (self.top_k, self.d_top_k),
                          (self.top_p, self.d_top_p), (self.key, self.d_key)):
            dev[on] = torch.from_numpy(host)[slots].to(self.device)
        self.block_start[on] = -1

    def steps(self, slot: torch.Tensor, pos: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """``[n]`` long: the step of each row's block that comes next, ``1 +`` the pauses at the
        end of the tokens fed up to ``pos`` (at most ``M - 1``)."""
        m = self.pauses.num_steps
        if m == 1:
            return torch.ones_like(pos)
        back = torch.arange(1, m - 1, dtype=torch.long, device=pos.device)  # the M - 2 tokens before the input
        at = pos.unsqueeze(1) - back
        earlier = self.req_states.all_token_ids.gpu[slot.unsqueeze(1), at.clamp(min=0)].long()
        earlier = torch.where(at >= 0, earlier, -1)
        fed = torch.cat([input_ids.long().unsqueeze(1), earlier], 1)  # newest first
        return torch.isin(fed, self.pause_ids).long().cumprod(1).sum(1) + 1

    def counters(self, slot: torch.Tensor, slots_np: np.ndarray, pos: torch.Tensor, input_ids: torch.Tensor,
                 width: int) -> torch.Tensor:
        """``[n]`` long: the real tokens of each row's output up to and including ``pos`` (the
        index of the token the row decides).  ``width``: a host bound on ``pos + 1``."""
        table = self.req_states.all_token_ids.gpu
        width = max(1, min(int(width), table.shape[1]))
        start = torch.from_numpy(self.req_states.prompt_len.np[slots_np].astype(np.int64)).to(pos.device)
        ids = table.index_select(0, slot)[:, :width].long()
        cols = torch.arange(width, dtype=torch.long, device=pos.device)
        before = (cols >= start.unsqueeze(1)) & (cols < pos.unsqueeze(1)) & ~torch.isin(ids, self.pause_ids)
        now = (pos >= start) & ~torch.isin(input_ids.long(), self.pause_ids)
        return before.sum(1) + now.long()

    def apply(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        slots_np = np.asarray(ctx.idx_mapping_np)
        if logits.shape[0] == 0:
            return logits
        if logits.shape[0] != slots_np.shape[0]:
            raise RuntimeError("a pause model decodes one logits row per request (speculative decoding is not "
                               "offered for pause models)")
        p, m = self.pauses, self.pauses.num_steps
        slot = ctx.expanded_idx_mapping.long()
        pos = ctx.pos.long()
        input_ids = ctx.input_ids
        step = self.steps(slot, pos, input_ids)
        greedy_np = self.greedy[slots_np]
        sample = not bool(greedy_np.all())
        if sample:
            width = int(np.max(ctx.seq_lens_upper_bound_np)) if len(ctx.seq_lens_upper_bound_np) else 1
            counter = self.counters(slot, slots_np, pos, input_ids, width)
        else:
            counter = torch.zeros_like(pos)
        k_np = self.top_k[slots_np]
        on_k = k_np[(k_np > 0) & (k_np < logits.shape[1])]
        p_np = self.top_p[slots_np]
        temperature = self.d_temperature[slot]
        answers, token = decide(
            p, logits, step, self.d_key[slot], counter, self.d_greedy[slot], temperature, self.d_top_k[slot],
            self.d_top_p[slot], sample=sample, max_k=int(on_k.max()) if on_k.size else 0,
            any_p=bool(((p_np > 0) & (p_np < 1)).any()))
        # fixed mode's block memory (kept for every row; read for fixed rows at step M)
        start = pos - (step - 1)
        col = (step - 1).unsqueeze(1)
        kept = self.block_answered[slot] & (self.block_start[slot] == start).unsqueeze(1)
        kept = kept.scatter(1, col, answers.unsqueeze(1))
        tokens = self.block_token[slot].scatter(1, col, token.unsqueeze(1))
        self.block_answered[slot] = kept
        self.block_token[slot] = tokens
        self.block_start[slot] = start
        lanes = torch.arange(m, dtype=torch.long, device=pos.device)
        first = torch.where(kept, lanes, m - 1).amin(1)  # step M always answers
        out, code = feed(p, self.d_fixed[slot], step, answers, token, first + 1,
                         tokens.gather(1, first.unsqueeze(1)).squeeze(1), self.pauses_after)
        return force(logits, None, out, code, temperature)


__all__ = ["SlotReadout"]

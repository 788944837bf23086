"""The readout of a pause model as a vLLM logits processor.

vLLM samples one token per request per step and feeds it back; a pause model's token is the
readout of a block of ``M`` steps (:mod:`cyb.decision`).  :class:`PauseReadout` makes vLLM's
sampled token the token cyb's engine feeds at that step: for every request of the batch it
reads, from the request's output so far, which step of its current block comes next (the
pauses at the end of the output: none, step 1) and which token it is deciding (the real tokens
of the output), decides as cyb's engine decides (:class:`cyb.engine` rows with one position per
step), and leaves one finite logit: the token to feed.

* The dk prior is added to the dk logit; dk is taken when it beats the best real token (greedy,
  ties to the smaller id) or, sampling, when the request's uniform of that step is below ``d``;
  the token is the best real token or a draw from the tempered, top-k/top-p cut distribution
  without dk and the pauses.  The uniforms come from the request's own stream
  (:func:`cyb.decision.stream_uniforms` of its key and the token's index): a request with
  ``seed`` s draws what ``cyb.generation.generate(prompt, seed=s)`` draws, whatever else runs.
* **Adaptive mode**: on dk the only token left is the next ``<pause_i>``, else the answer; at
  step ``M`` dk and the pauses are banned.
* **Fixed mode**: every step before ``M`` feeds the next pause whatever the readout says; the
  readout of each step is kept, and step ``M`` feeds the answer of the first step that answered.

The one finite logit is the token's *step code*: the step the token was read at for a real token
(its steps, ``1 .. M``), 0 for a pause.  Under vLLM's ``processed_logits`` logprobs mode (the
plugin's default for pause models) that is the logprob vLLM returns with each sampled token, so
:func:`cyb.integrations.vllm.pauses.steps_per_token` reads fixed mode's steps from an output.

vLLM's own sampling (temperature, top-k, top-p, seed) picks the only token left; its settings
are read here as the readout's.  Settings that would change the logits after the readout
(penalties, bias, banned or allowed words, structured output) are refused per request.
"""

from __future__ import annotations

import json
import math

import torch

from ...decision import KEY_LIMIT, inverse_cdf, row_keys, stream_uniforms
from .pauses import ServedPauses, mode_error

#: vLLM's bound below which a temperature means greedy decoding
GREEDY_BELOW = 1e-5
#: the attribute of vLLM's Hugging Face config that carries the pause layout (JSON)
CONFIG_KEY = "cyb_pauses"


def pauses_of(hf_config) -> ServedPauses | None:
    """The pause layout the plugin put into vLLM's model config, or None (not a pause model)."""
    data = getattr(hf_config, CONFIG_KEY, None)
    if not data:
        return None
    d = json.loads(data) if isinstance(data, str) else dict(data)
    return ServedPauses(int(d["num_steps"]), tuple(int(p) for p in d["pause_ids"]),
                        None if d["dk_id"] is None else int(d["dk_id"]), float(d["dk_bias"]),
                        str(d["position_scheme"]))


def config_value(pauses: ServedPauses) -> str:
    """What :func:`pauses_of` reads back (a JSON string: vLLM's config overrides keep it as is)."""
    return json.dumps({"num_steps": pauses.num_steps, "pause_ids": list(pauses.pause_ids),
                       "dk_id": pauses.dk_id, "dk_bias": pauses.dk_bias,
                       "position_scheme": pauses.position_scheme})


def _neutral(params) -> str | None:
    """The first sampling setting that would change the logits after the readout, or None."""
    checks = (
        ("presence_penalty", lambda v: v not in (None, 0, 0.0)),
        ("frequency_penalty", lambda v: v not in (None, 0, 0.0)),
        ("repetition_penalty", lambda v: v not in (None, 1, 1.0)),
        ("logit_bias", lambda v: bool(v)),
        ("min_tokens", lambda v: bool(v)),
        ("bad_words", lambda v: bool(v)),
        ("allowed_token_ids", lambda v: v is not None),
        ("structured_outputs", lambda v: v is not None),
    )
    for name, bad in checks:
        if bad(getattr(params, name, None)):
            return name
    return None


class _Row:
    """One request of the batch: its settings and what it read out of its current block."""

    __slots__ = ("mode", "greedy", "temperature", "top_k", "top_p", "key", "output", "seen", "reals",
                 "block", "block_of")

    def __init__(self, params, output: list[int], default_mode: str) -> None:
        extra = params.extra_args or {}
        self.mode = extra.get("mode", default_mode)
        t = float(params.temperature)
        self.greedy = t < GREEDY_BELOW
        self.temperature = 1.0 if self.greedy else t
        k = int(params.top_k or 0)
        self.top_k = k if k > 0 else 0
        self.top_p = float(params.top_p if params.top_p is not None else 1.0)
        seed = params.seed
        self.key = row_keys(1, seed=int(seed))[0] if seed is not None else int(
            torch.randint(0, KEY_LIMIT, (1,)).item())
        self.output = output  # vLLM's live list of the request's output ids
        self.seen = 0  # output ids counted so far
        self.reals = 0  # real tokens among them
        self.block: dict[int, tuple[bool, int]] = {}  # step -> (answered, token) of the current block
        self.block_of = -1  # the token index the block belongs to

    def position(self, pauses: frozenset, m: int) -> tuple[int, int]:
        """``(step, counter)``: the step of the current block that comes next (1-based) and the
        index of the token it decides."""
        out = self.output
        if len(out) < self.seen:  # vLLM dropped output tokens: count again
            self.seen, self.reals = 0, 0
        for t in out[self.seen:]:
            if t not in pauses:
                self.reals += 1
        self.seen = len(out)
        trailing = 0
        for t in reversed(out):
            if t not in pauses or trailing >= m - 1:
                break
            trailing += 1
        return trailing + 1, self.reals


def _filter(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-k (``[n]`` long, 0: off) then nucleus top-p (``[n]`` float, 1: off) per row of ``z``
    (``[n, V]``), as :func:`cyb.decision.filter_logits` does for one setting."""
    v = z.shape[-1]
    on = (top_k > 0) & (top_k < v)
    if bool(on.any()):
        kk = int(top_k[on].max())
        values = z.topk(kk, dim=-1).values
        kth = values.gather(1, (top_k.clamp(1, kk) - 1).unsqueeze(1))
        z = torch.where(on.unsqueeze(1) & (z < kth), -math.inf, z)
    on = (top_p > 0) & (top_p < 1)
    if bool(on.any()):
        sorted_z, order = z.sort(dim=-1, descending=True)
        probs = sorted_z.softmax(-1)
        drop_sorted = ((probs.cumsum(-1) - probs) >= top_p.unsqueeze(1)) & on.unsqueeze(1)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        z = z.masked_fill(drop, -math.inf)
    return z


def decide(pauses: ServedPauses, logits: torch.Tensor, step: torch.Tensor, key: torch.Tensor,
           counter: torch.Tensor, greedy: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(answers, token)``, each ``[n]``: whether each row answers at its ``step`` (1-based) and
    the token it answers (meaningful where it does), from ``logits [n, V]``.

    The rule of cyb's engine for one step: dk (with the prior) against the best real token, or
    the request's uniform of the step against ``d``; at step ``M`` an answer; the token the best
    real one or a draw with the request's token uniform.
    """
    m, dk = pauses.num_steps, pauses.dk_id
    z = logits.float()
    if dk is not None:
        zdk = z[:, dk] + pauses.dk_bias
    z = z.clone()
    masked = torch.tensor(sorted(pauses.special_ids), dtype=torch.long, device=z.device)
    if masked.numel():
        z.index_fill_(-1, masked, -math.inf)
    best, token = z.max(-1)
    sample = not bool(greedy.all())
    uniforms = stream_uniforms(key, counter, m + 1) if sample else None
    if dk is None:
        wants_dk = torch.ones_like(greedy)
    else:
        wants_dk = (zdk > best) | ((zdk == best) & (token > dk))
        if sample:
            total = torch.logaddexp(torch.logsumexp(z, -1), zdk)
            lane = (step - 1).clamp(max=m - 1)
            sampled_dk = uniforms.gather(1, lane.unsqueeze(1)).squeeze(1) < (zdk - total).exp()
            wants_dk = torch.where(greedy, wants_dk, sampled_dk)
    answers = ~wants_dk | (step >= m)
    if sample:
        tempered = _filter(z / torch.where(greedy, 1.0, temperature).unsqueeze(1), top_k, top_p)
        drawn = inverse_cdf(tempered.softmax(-1), uniforms[:, m])
        token = torch.where(greedy, token, drawn)
    return answers, token


class PauseReadout:
    """The readout (see the module docstring); the plugin hands vLLM a subclass that knows the
    model's position scheme (:func:`readout_class`), so that a request's mode is checked when it
    arrives."""

    #: whether the model's pauses share their token's position (adaptive mode refused)
    shared_positions = True
    default_mode = "fixed"

    @classmethod
    def validate_params(cls, params) -> None:
        extra = params.extra_args or {}
        error = mode_error(extra.get("mode", cls.default_mode), cls.shared_positions)
        if error is not None:
            raise ValueError(error)
        if params.skip_special_tokens is False:
            raise ValueError("skip_special_tokens: must stay true for a pause model (the text would hold its "
                             "pause tokens)")
        bad = _neutral(params)
        if bad is not None:
            raise ValueError(f"{bad}: not offered for a pause model (the readout decides every token from the "
                             "model's logits); leave it at its default")

    def __init__(self, vllm_config, device, is_pin_memory: bool) -> None:
        self.pauses = pauses_of(vllm_config.model_config.hf_config)
        self.rows: dict[int, _Row] = {}
        if self.pauses is not None:
            self._pause_set = frozenset(self.pauses.pause_ids)
            self._pause_list = list(self.pauses.pause_ids)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        if batch_update is None or self.pauses is None:
            return
        from vllm.v1.sample.logits_processor.interface import MoveDirectionality

        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            self.rows[index] = _Row(params, output, self.pauses.default_mode)
        for a, b, direction in batch_update.moved:
            ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
            if ra is not None:
                self.rows[b] = ra
            if direction == MoveDirectionality.SWAP and rb is not None:
                self.rows[a] = rb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        p = self.pauses
        if p is None or not self.rows:
            return logits
        n, m = logits.shape[0], p.num_steps
        rows = [self.rows.get(i) for i in range(n)]
        live = [i for i, r in enumerate(rows) if r is not None]
        if not live:
            return logits
        where = [rows[i].position(self._pause_set, m) for i in live]
        idx = torch.tensor(live, dtype=torch.long, device=logits.device)

        def column(values, dtype):
            return torch.tensor(values, dtype=dtype, device=logits.device)

        rs = [rows[i] for i in live]
        step = column([s for s, _ in where], torch.long)
        answers, token = decide(
            p, logits.index_select(0, idx), step, column([r.key for r in rs], torch.long),
            column([c for _, c in where], torch.long), column([r.greedy for r in rs], torch.bool),
            column([r.temperature for r in rs], torch.float32), column([r.top_k for r in rs], torch.long),
            column([r.top_p for r in rs], torch.float32))
        answers, token = answers.tolist(), token.tolist()
        forced, codes = [], []
        for j, r in enumerate(rs):
            s, c = where[j]
            if r.mode == "fixed":
                if r.block_of != c:
                    r.block, r.block_of = {}, c
                r.block[s] = (answers[j], token[j])  # a later computation of this step replaces it
                if s < m:
                    forced.append(self._pause_list[s - 1])
                    codes.append(0.0)
                    continue
                at = next(k for k in range(1, m + 1) if k in r.block and r.block[k][0])
                forced.append(r.block[at][1])
                codes.append(float(at))
            elif answers[j]:
                forced.append(token[j])
                codes.append(float(s))
            else:
                forced.append(self._pause_list[s - 1])
                codes.append(0.0)
        # vLLM divides a sampled row's logits by its temperature before it reports them
        scale = column([r.temperature for r in rs], torch.float32)
        logits.index_fill_(0, idx, -math.inf)
        logits[idx, column(forced, torch.long)] = column(codes, logits.dtype) * scale.to(logits.dtype)
        return logits


def readout_class(pauses: ServedPauses) -> str:
    """The qualified name of the readout class for ``pauses`` (what vLLM's
    ``logits_processors`` takes)."""
    name = "SharedPositionsReadout" if pauses.shared_positions and pauses.num_steps > 1 else (
        "AdaptiveReadout" if pauses.default_mode == "adaptive" else "AdvancePositionsReadout")
    return f"{__name__}:{name}"


def _subclass(name: str, shared: bool, mode: str):
    from vllm.v1.sample.logits_processor import LogitsProcessor

    return type(name, (PauseReadout, LogitsProcessor), {"shared_positions": shared, "default_mode": mode,
                                                         "__module__": __name__})


def __getattr__(name: str):
    # built on first use, so that importing this module needs no vLLM
    kinds = {"SharedPositionsReadout": (True, "fixed"), "AdvancePositionsReadout": (False, "fixed"),
             "AdaptiveReadout": (False, "adaptive")}
    if name in kinds:
        cls = _subclass(name, *kinds[name])
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CONFIG_KEY", "PauseReadout", "config_value", "decide", "pauses_of", "readout_class"]

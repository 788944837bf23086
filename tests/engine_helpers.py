"""The engine tests' shared pieces: the mixed-decision test models of every pause layout, the
no-cache reference (every step recomputed from scratch over the whole row, with the layout's
own mask, and the sequential decision written out here, not taken from the library), and
running prompts through an engine."""

from __future__ import annotations

import dataclasses
import math

import torch

from cyb.decision import stream_uniforms
from cyb.engine import Engine, Request
from cyb.model import PauseModel, gates
from cyb.visibility import BlockSteps
from generation_helpers import build

M = 3


def layout_model(visibility: str, kind: str = "cyb", scheme: str = "shared") -> PauseModel:
    """The mixed-decision test model as ``visibility``; gated ones get random gates."""
    pm = build("llama", kind, init=0.3, dk_scale=0.3, psi_dk=0.5 if kind == "cyb" else None,
               num_steps=M, scheme=scheme)
    if visibility == "shared":
        return pm
    settings = dataclasses.replace(pm.settings, pause_visibility=visibility)
    pm = PauseModel(pm.hf_model, settings, pm.tokenizer).eval()
    if visibility == "gated":
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for a in gates.attention_modules(pm.hf_model):
                a.pause_gate.copy_(torch.randn(a.pause_gate.shape, generator=g) * 2 - 1)
    return pm


# ----------------------------------------------------------------------------- the reference


@dataclasses.dataclass
class Sampling:
    sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0


def _decide(pm: PauseModel, z: torch.Tensor, step: int, u: torch.Tensor | None, s: Sampling):
    """(dk?, token, d) at 1-based ``step`` from float64 logits ``z [V]`` (pauses banned here)."""
    m, dk = pm.num_steps, pm.settings.dk_id
    z = z.double().cpu()
    z[list(pm.vocab.pause_ids)] = -math.inf
    d = 1.0
    wants_dk = dk is None and step < m
    if dk is not None:
        zb = z.clone()
        zb[dk] += pm.dk_bias
        p = torch.softmax(zb, -1)
        d = float(p[dk])
        if step < m:
            wants_dk = (u[step - 1] < d) if s.sample else int(zb.argmax()) == dk
        z[dk] = -math.inf
    if s.sample:
        t = z / s.temperature
        if 0 < s.top_k < t.numel():
            t[t < t.topk(s.top_k).values[-1]] = -math.inf
        if s.top_p < 1:
            sz, order = t.sort(descending=True)
            p = sz.softmax(-1)
            drop = (p.cumsum(-1) - p) >= s.top_p
            t[order[drop]] = -math.inf
        cdf = t.softmax(-1).cumsum(-1)
        token = int((cdf <= float(u[m]) * float(cdf[-1])).sum().clamp(max=cdf.numel() - 1))
    else:
        token = int(z.argmax())
    return bool(wants_dk), token, (0.0 if step == m else d)


@torch.no_grad()
def reference(pm: PauseModel, prompt: list[int], n: int, mode: str, s: Sampling, key: int):
    """``n`` tokens by recomputing the whole fed row at every step (no cache): ``(tokens, steps,
    d)``.  Shared and gated rows are the fed sequence (the prompt in Recipe 1 layout, then what
    decoding fed); private rows are each real token over the real tokens before it and its own
    block.  Positions as the model's scheme gives them."""
    m, advance, vis = pm.num_steps, pm.vocab.position_scheme == "advance", pm.pause_visibility
    pause = list(pm.vocab.pause_ids)
    pm.pause_kernel = "dense"  # the reference mask on every device
    ids, pos, tok, stp = [], [], [], []  # the fed row: id, position, block, step
    for k, t in enumerate(prompt[:-1]):
        for j in range(m):
            ids.append(t if j == 0 else pause[j - 1])
            pos.append(k * m + j if advance else k)
            tok.append(k)
            stp.append(j)
    real, real_pos = prompt[-1], (len(prompt) - 1) * (m if advance else 1)
    block = len(prompt) - 1
    tokens, steps, ds = [], [], []
    while len(tokens) < n:
        u = stream_uniforms(torch.tensor(key), torch.tensor(len(tokens)), m + 1) if s.sample else None
        answer, stop, d_row = None, None, [math.nan] * m
        for step in range(1, m + 1):  # feed the block one step at a time
            ids.append(real if step == 1 else pause[step - 2])
            pos.append(real_pos + (step - 1 if advance else 0))
            tok.append(block)
            stp.append(step - 1)
            dev = pm.device
            steps_ = BlockSteps(torch.tensor([tok], device=dev), torch.tensor([stp], device=dev),
                                torch.ones(1, len(ids), dtype=torch.bool, device=dev))
            h, _ = pm.hidden_states(torch.tensor([ids], device=dev), torch.tensor([pos], device=dev), steps=steps_)
            wants_dk, token, d = _decide(pm, pm.logits(h[0, -1]), step, u, s)
            d_row[step - 1] = d
            if answer is None and (not wants_dk or step == m):
                answer, stop = token, step
            if answer is not None and (mode == "adaptive" or step == m):
                break
        d_row[-1] = 0.0
        tokens.append(answer)
        steps.append(stop)
        ds.append(d_row)
        block += 1
        real = answer
        if vis == "private":
            real_pos += m if advance else 1
        else:
            real_pos = pos[-1] + 1 if advance else real_pos + 1
    return tokens, steps, ds


def engine_run(pm, prompts, mode, s: Sampling, *, max_new=None, keys=None, options=None, eos=()):
    """Every prompt through one engine: ``{prompt index: (tokens, steps, d, positions, reason)}``."""
    max_new = max_new or [8] * len(prompts)
    keys = keys or [0] * len(prompts)
    reqs = [Request(tuple(p), n, mode=mode, sample=s.sample, temperature=s.temperature, top_k=s.top_k,
                    top_p=s.top_p, key=k, eos=frozenset(eos)) for p, n, k in zip(prompts, max_new, keys)]
    engine = Engine.sized_for(pm, reqs, options=options)
    index = {engine.submit(r): i for i, r in enumerate(reqs)}
    out = {i: ([], [], [], 0, None) for i in index.values()}
    for e in engine.run():
        t, st, d, _, _ = out[index[e.request]]
        t.append(e.token), st.append(e.steps), d.append(list(e.d))
        out[index[e.request]] = (t, st, d, e.positions, e.finished)
    assert engine.slots_in_use == 0 and not engine.busy
    return out, engine


def assert_same(got, want):
    tokens, steps, d = want
    assert got[0] == tokens and got[1] == steps
    torch.testing.assert_close(torch.tensor(got[2]), torch.tensor(d, dtype=torch.float32),
                               equal_nan=True, atol=1e-5, rtol=1e-4)


def sliding_model(family: str, visibility: str, attn: str = "eager") -> PauseModel:
    """A model with sliding-window layers, prompts longer than its windows: ``gemma2``
    (softcapped, every other layer sliding, windows of 6) or ``gemma3`` (windows of 4, every
    other layer full), ``attn`` attention, with a dk row that makes both dk and answers occur."""
    import transformers

    from cyb.data.synthetic import CharTokenizer
    from generation_helpers import TOK

    common = dict(vocab_size=len(TOK), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, head_dim=8,
                  initializer_range=0.3, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2)
    if family == "gemma2":
        cfg = transformers.Gemma2Config(**common, sliding_window=6, final_logit_softcapping=3.0)
    else:
        cfg = transformers.Gemma3TextConfig(**common, sliding_window=4,
                                            layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    pm = PauseModel.from_config(cfg, CharTokenizer().to_hf(), num_steps=M, psi_dk=0.5,
                                pause_visibility=visibility, attn_implementation=attn).eval()
    with torch.no_grad():
        w = pm.hf_model.get_output_embeddings().weight
        w[pm.settings.dk_id] = torch.randn(w.shape[1]) * 0.3
    return pm


SAMPLED = Sampling(True, 0.9, 20, 0.9)
LAYOUTS = [("shared", "shared"), ("shared", "advance"), ("private", "shared"), ("private", "advance"),
           ("gated", "shared"), ("gated", "advance")]

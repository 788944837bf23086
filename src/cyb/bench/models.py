"""Benchmark models: a Llama of a given shape built from a config, wrapped per method.

One Hugging Face model serves every method of a benchmark: the pause and dk ids are the top ids
of its vocabulary (``<pause_1>`` .. ``<pause_{M-1}>`` at ``V-M`` .. ``V-2``, dk at ``V-1``), so
the baseline, TBYS and CYB wrappers (:class:`cyb.PauseModel`) share the same weights and the
same vocabulary size; the data use real ids below ``V - M``.  :func:`spread_weights` makes a
random model's greedy decisions non-trivial, and :func:`adaptive_fixture` sets a CYB wrapper's dk
prior so that a known share of its first steps say dk (the decode benchmark's adaptive rows).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass

import torch

METHODS = ("baseline", "tbys", "cyb")


@dataclass(frozen=True)
class ModelShape:
    """Width and depth of a Llama decoder (the vocabulary is chosen per benchmark case)."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    tie_embeddings: bool = False
    kv_heads: int | None = None  # None: as many as the query heads

    def to_dict(self) -> dict:
        return asdict(self)


#: The "134 M" Llama of the benchmarks: hidden 768, 12 layers, MLP 2048, untied embeddings
#: (134.1 M parameters at vocabulary 32000, 135.3 M at 32768).
SHAPE_134M = ModelShape(hidden=768, layers=12, heads=12, intermediate=2048)
#: SmolLM2-135M's decoder: hidden 576, 30 layers, 9 query heads sharing 3 key/value heads, MLP
#: 1536, tied embeddings (vocabulary 49152).
SHAPE_SMOLLM2 = ModelShape(hidden=576, layers=30, heads=9, intermediate=1536, tie_embeddings=True, kv_heads=3)
#: The shapes ``cyb bench train --shape`` names.
TRAIN_SHAPES = {"134m": SHAPE_134M, "smollm2": SHAPE_SMOLLM2}
#: A tiny shape for CPU smoke runs.
SHAPE_TINY = ModelShape(hidden=32, layers=2, heads=2, intermediate=64, tie_embeddings=True)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_hf_model(shape: ModelShape, vocab_size: int, *, dtype: torch.dtype, device: torch.device,
                   max_positions: int = 8192, seed: int = 0, attn_implementation: str = "sdpa"):
    """A randomly initialised ``LlamaForCausalLM`` of ``shape`` on ``device``."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from ..model import hf

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads or shape.heads, max_position_embeddings=max_positions,
        tie_word_embeddings=shape.tie_embeddings, use_cache=False,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation,
                                             **hf.dtype_kwargs(dtype))
    return model.to(device)


def pause_settings(method: str, vocab_size: int, num_steps: int):
    """:class:`cyb.model.PauseSettings` of ``method`` with ids at the top of the vocabulary.

    ``"baseline"``: ``M = 1``, no pauses; ``"tbys"``: ``M - 1`` pauses, no dk; ``"cyb"``: pauses
    and dk (prior 0.9).
    """
    from ..methods import spec
    from ..model import PauseSettings

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    s = spec(method)
    if not s.uses_pauses:
        return PauseSettings(num_steps=1, pause_ids=(), vocab_size=vocab_size, method=method)
    if num_steps < 2:
        raise ValueError(f"num_steps (M) must be >= 2 for {method}, got {num_steps}")
    pause_ids = tuple(range(vocab_size - num_steps, vocab_size - 1))
    dk = dict(dk_id=vocab_size - 1, psi_dk=0.9) if s.has_dk else {}
    return PauseSettings(num_steps=num_steps, pause_ids=pause_ids, vocab_size=vocab_size, method=method, **dk)


def wrap(hf_model, method: str, num_steps: int, visibility: str = "shared"):
    """``hf_model`` as a :class:`cyb.PauseModel` for ``method`` (weights shared, nothing copied)
    with pauses of ``visibility``."""
    import dataclasses

    from ..model import PauseModel

    vocab = int(hf_model.get_output_embeddings().weight.shape[0])
    settings = pause_settings(method, vocab, num_steps)
    if visibility != "shared" and settings.num_steps > 1:
        settings = dataclasses.replace(settings, pause_visibility=visibility)
    return PauseModel(hf_model, settings)


def real_ids_limit(vocab_size: int, num_steps: int) -> int:
    """Real token ids are drawn from ``[0, limit)``, below every pause and dk id."""
    return vocab_size - max(num_steps, 1)


def random_ids(batch: int, length: int, limit: int, *, seed: int = 0) -> torch.Tensor:
    """``[batch, length]`` long ids uniform in ``[0, limit)`` (CPU, reproducible)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, limit, (batch, length), generator=g)


def num_params(hf_model) -> int:
    """Parameters of the model, tied matrices counted once."""
    return sum(p.numel() for p in {id(p): p for p in hf_model.parameters()}.values())


@torch.no_grad()
def spread_weights(hf_model, seed: int = 0) -> None:
    """Redraw every matrix with std ``2 / sqrt(fan_in)``: a freshly initialised model repeats
    its input token, which would make greedy comparisons trivially equal."""
    g = torch.Generator().manual_seed(seed)
    for p in hf_model.parameters():
        if p.dim() == 2:
            p.copy_(torch.randn(p.shape, generator=g) * (2.0 / p.shape[1] ** 0.5))


@torch.inference_mode()
def adaptive_fixture(hf_model, num_steps: int, ids: torch.Tensor, pause_fraction: float,
                     visibility: str = "shared"):
    """A CYB wrapper of ``hf_model`` (pauses of ``visibility``) whose dk prior makes
    ``pause_fraction`` of the step-1 decisions on ``ids`` (the prompts, laid out in fixed mode)
    say dk under the greedy readout.

    Returns ``(model, info)``; ``info`` has the prior and the fraction it gives on ``ids``.
    """
    from ..layout import expand
    from ..model import PauseModel
    from ..readout import dk_logit_bias

    base = wrap(hf_model, "cyb", num_steps, visibility)
    v = base.vocab.vocab_size
    lay = expand(ids, base.vocab, check_ids=False)
    hidden, _ = base.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask, steps=lay.steps)
    z = base.logits(hidden[:, ::num_steps]).float()  # step 1 of every block
    z[..., list(base.vocab.pause_ids)] = -math.inf
    dk = base.vocab.dk_id
    rest = z.index_fill(-1, torch.tensor([dk], device=z.device), -math.inf).amax(-1)
    margin = (z[..., dk] - rest).flatten().double().cpu()  # dk wins where margin + bias > 0
    if pause_fraction <= 0:
        bias = -float(margin.max()) - 1.0
    elif pause_fraction >= 1:
        bias = -float(margin.min()) + 1.0
    else:
        bias = -float(torch.quantile(margin, 1.0 - pause_fraction))
    # the prior psi_dk whose logit bias is `bias`, inside (0, 1)
    logit = bias - math.log(v - 1)
    psi = min(max(1.0 / (1.0 + math.exp(-logit)), 1e-12), 1 - 1e-12)
    settings = dataclasses.replace(base.settings, psi_dk=psi)
    model = PauseModel(hf_model, settings)
    got = float(((margin + dk_logit_bias(v, psi)) > 0).double().mean())
    return model, {"psi_dk": psi, "dk_bias": dk_logit_bias(v, psi), "target_fraction": pause_fraction,
                   "step1_dk_fraction_on_prompts": got}


# --------------------------------------------------------------------------- named models

#: The models the serving record measures at their real shapes (random weights: nothing is
#: downloaded): each a Hugging Face config as a dict, ``model_type`` first.  The values are those
#: of the published ``config.json`` of the model named in the comment.
NAMED_CONFIGS: dict[str, dict] = {
    # the benchmark Llama of docs/benchmarks.md (SHAPE_134M at vocabulary 32768)
    "llama-134m": dict(model_type="llama", vocab_size=32768, hidden_size=768, intermediate_size=2048,
                       num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12,
                       max_position_embeddings=8192, tie_word_embeddings=False),
    # HuggingFaceTB/SmolLM2-360M
    "smollm2-360m": dict(model_type="llama", vocab_size=49152, hidden_size=960, intermediate_size=2560,
                         num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5, head_dim=64,
                         max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True),
    # HuggingFaceTB/SmolLM2-1.7B
    "smollm2-1.7b": dict(model_type="llama", vocab_size=49152, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=32, head_dim=64,
                         max_position_embeddings=8192, rope_theta=130000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True),
    # google/gemma-3-1b-pt: five sliding-window layers (512 positions) to one global layer
    "gemma3-1b": dict(model_type="gemma3_text", vocab_size=262144, hidden_size=1152, intermediate_size=6912,
                      num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                      max_position_embeddings=32768, query_pre_attn_scalar=256, sliding_window=512,
                      layer_types=[("full_attention" if (i + 1) % 6 == 0 else "sliding_attention")
                                   for i in range(26)],
                      rope_theta=1_000_000.0, rope_local_base_freq=10_000.0, rms_norm_eps=1e-6,
                      hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
    # tiny shapes of the same two families, for CPU smoke runs
    "tiny": dict(model_type="llama", vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                 tie_word_embeddings=True),
    "tiny-gemma3": dict(model_type="gemma3_text", vocab_size=256, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                        max_position_embeddings=1024, query_pre_attn_scalar=16, sliding_window=8,
                        layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True),
}


def named_config(name: str):
    """The transformers config of :data:`NAMED_CONFIGS` ``name`` (``use_cache`` off: the engine
    brings its own cache)."""
    from transformers import AutoConfig

    if name not in NAMED_CONFIGS:
        raise ValueError(f"model must be one of {', '.join(NAMED_CONFIGS)}, got {name!r}")
    fields = dict(NAMED_CONFIGS[name])
    return AutoConfig.for_model(fields.pop("model_type"), use_cache=False, **fields)


def build_named_model(name: str, *, dtype: torch.dtype, device, seed: int = 0, attn_implementation: str = "sdpa",
                      spread: bool = True):
    """A randomly initialised causal LM of :data:`NAMED_CONFIGS` ``name``, made on ``device``
    directly (a 1.7 B model is not drawn on the CPU first); with ``spread``, its matrices are
    redrawn as :func:`spread_weights` does, from a generator on ``device``."""
    from transformers import AutoModelForCausalLM

    from ..model import hf

    device = torch.device(device)
    torch.manual_seed(seed)
    with device:
        model = AutoModelForCausalLM.from_config(named_config(name), attn_implementation=attn_implementation,
                                                 **hf.dtype_kwargs(dtype))
    model = model.to(device).eval()
    if spread:
        g = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for p in {id(p): p for p in model.parameters()}.values():
                if p.dim() == 2:
                    p.copy_(torch.randn(p.shape, generator=g, device=device, dtype=torch.float32)
                            * (2.0 / p.shape[1] ** 0.5))
    return model

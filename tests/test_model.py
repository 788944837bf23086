"""PauseModel: masks and positions, cache, token set-up, persistence, head, errors.

Tiny models are built from ``transformers`` config classes (no downloads); tiny tokenizers
are word-level ``tokenizers`` models wrapped in ``PreTrainedTokenizerFast``.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers

from cyb import families
from cyb.layout import expand
from cyb.model import SETTINGS_FILE, PauseForward, PauseModel, PauseSettings
from cyb.model.tokens import reserve_tokens
from cyb.readout import dk_logit_bias, readout_reference

V = 96  # vocabulary of the tiny models without a tokenizer
T_MAX = 128
FAMILIES = families.NAMES  # every family a run builds (tiny_config has a case for each)


# ----------------------------------------------------------------------------- builders


def tiny_config(family: str, vocab_size: int = V, *, window: int = 64, tie: bool | None = None,
                softcap: float | None = None):
    """A 2-layer config of ``family``: hidden 32, 4 heads (2 kv), head_dim 8."""
    common = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T_MAX,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if tie is not None:
        common["tie_word_embeddings"] = tie
    if family == "llama":
        return transformers.LlamaConfig(**common)
    if family == "mistral":
        return transformers.MistralConfig(**common, sliding_window=window)
    if family == "qwen2":
        return transformers.Qwen2Config(**common)
    if family == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=8)
    if family == "gemma":
        return transformers.GemmaConfig(**common, head_dim=8)
    if family == "gemma2":
        return transformers.Gemma2Config(**common, head_dim=8, sliding_window=window,
                                         final_logit_softcapping=softcap or 30.0)
    if family == "gemma3":
        return transformers.Gemma3TextConfig(**common, head_dim=8, sliding_window=window,
                                             layer_types=["sliding_attention", "full_attention"],
                                             final_logit_softcapping=softcap)
    raise ValueError(family)


def hf_model(family: str, impl: str = "eager", seed: int = 0, **kw):
    """A random tiny model; skips when this transformers does not offer ``impl`` for it."""
    cfg = tiny_config(family, **kw)
    torch.manual_seed(seed)
    try:
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)
    except ValueError as e:
        pytest.skip(f"{family} has no {impl} attention in transformers {transformers.__version__}")
    return model.eval()


def word_tokenizer(extra=(), n_words: int = 40, pad: str = "<pad>"):
    """Word-level tokenizer: specials, then ``extra`` tokens, then ``w0`` .. ``w{n-1}``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<bos>", "<eos>", "<unk>", *extra] + [f"w{i}" for i in range(n_words)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=pad, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def real_ids(b: int, length: int, vocab_size: int, seed: int = 1, low: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, vocab_size, (b, length), generator=g)


def pause_model(family: str, impl: str = "eager", num_steps: int = 3, **kw) -> PauseModel:
    """A tiny model with pause/dk ids appended after the vocabulary (no tokenizer)."""
    return PauseModel.from_hf(hf_model(family, impl, **kw), num_steps=num_steps)


def padding_mask(kind: str, b: int, length: int) -> torch.Tensor:
    mask = torch.ones(b, length, dtype=torch.long)
    if kind == "right":
        mask[1, -2:] = 0
    elif kind == "left":
        mask[1, :2] = 0
    elif kind == "both":  # left padding on one row, a hole between valid tokens on another
        mask[0, :1] = 0
        mask[1, 2:4] = 0
    return mask


def additive_mask(mask2d: torch.Tensor, dtype: torch.dtype, window: int | None = None) -> torch.Tensor:
    """Hand-built ``[B, 1, T, T]`` additive mask: causal (optionally windowed) + key padding."""
    b, t = mask2d.shape
    i = torch.arange(t)
    allowed = i[None, :] <= i[:, None]
    if window is not None:
        allowed &= i[None, :] > i[:, None] - window
    allowed = allowed[None, None] & mask2d.bool()[:, None, None, :]
    return torch.zeros(b, 1, t, t, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


@torch.no_grad()
def reference_logits(model, ids, pos, mask2d, attention_mask=None):
    mask = additive_mask(mask2d, model.dtype) if attention_mask is None else attention_mask
    return model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False).logits


@torch.no_grad()
def pause_logits(pm: PauseModel, ids, pos, mask2d):
    hidden, cache = pm.hidden_states(ids, pos, mask2d)
    assert cache is None
    return pm.logits(hidden)


# ------------------------------------------------------------------ masks and positions


@pytest.mark.parametrize("padding", ["none", "right", "left", "both"])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_hand_built_causal_mask(family, impl, padding):
    pm = pause_model(family, impl)
    b, length = 2, 6
    mask = padding_mask(padding, b, length)
    lay = expand(real_ids(b, length, V), pm.vocab, attention_mask=mask)
    blocks = lay.position_ids.view(b, length, 3)
    assert bool((blocks == blocks[..., :1]).all()) and blocks.max() > 0  # positions repeat
    ours = pause_logits(pm, lay.input_ids, lay.position_ids, lay.attention_mask)
    ref = reference_logits(pm.hf_model, lay.input_ids, lay.position_ids, lay.attention_mask)
    valid = lay.attention_mask.bool()
    torch.testing.assert_close(ours[valid], ref[valid], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(ours).all()  # padded steps are meaningless but finite
    if padding == "none":
        # The pitfall: without a mask, repeated positions are read as packed documents.
        with torch.no_grad():
            naive = pm.hf_model(input_ids=lay.input_ids, position_ids=lay.position_ids,
                                use_cache=False).logits
        assert (naive - ref).abs().max() > 1e-3


def test_no_query_step_has_an_empty_softmax():
    """Left, right and all-padding rows reach the decoder with padding last and unmasked."""
    pm = pause_model("llama", "sdpa")
    seen = []
    pm.decoder.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(kwargs["attention_mask"].clone()), with_kwargs=True)
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]])
    ids = real_ids(3, 5, V)
    with torch.no_grad():
        out = pm(ids, attention_mask=mask)
        alone = pm(ids[:2], attention_mask=mask[:2])
    assert bool((seen[0] == 1).all())  # padding was moved last and unmasked
    assert torch.isfinite(out.hidden).all() and torch.isfinite(out.log_d).all()
    torch.testing.assert_close(out.log_t[:2], alone.log_t)  # the empty row changes nothing
    lay = out.layout
    ref = reference_logits(pm.hf_model, lay.input_ids[:2], lay.position_ids[:2], lay.attention_mask[:2])
    valid = lay.attention_mask[:2].bool()
    torch.testing.assert_close(pm.logits(out.hidden[:2].flatten(1, 2))[valid], ref[valid],
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family,impl", [("gemma2", "eager"), ("gemma2", "sdpa"), ("gemma3", "sdpa")])
def test_sliding_window_layers_keep_their_window(family, impl):
    """A 2-D mask lets each layer build its own mask; one 4-D mask would drop the window."""
    window = 5
    pm = pause_model(family, impl, window=window)
    mask = padding_mask("left", 2, 6)
    lay = expand(real_ids(2, 6, V), pm.vocab, attention_mask=mask)
    m2 = lay.attention_mask
    per_layer = {"full_attention": additive_mask(m2, torch.float32),
                 "sliding_attention": additive_mask(m2, torch.float32, window)}
    ours = pause_logits(pm, lay.input_ids, lay.position_ids, m2)
    ref = reference_logits(pm.hf_model, lay.input_ids, lay.position_ids, m2, attention_mask=per_layer)
    valid = m2.bool()
    torch.testing.assert_close(ours[valid], ref[valid], atol=1e-5, rtol=1e-5)
    single = reference_logits(pm.hf_model, lay.input_ids, lay.position_ids, m2)
    assert (single[valid] - ref[valid]).abs().max() > 1e-3


@pytest.mark.parametrize("family", ["llama", "gemma2", "gemma3"])
@pytest.mark.parametrize("padding", ["none", "left"])
def test_cache_blockwise_equals_one_pass(family, padding):
    pm = pause_model(family, "sdpa" if family != "gemma2" else "eager", window=7)
    m = pm.num_steps
    mask = padding_mask(padding, 2, 6)
    lay = expand(real_ids(2, 6, V), pm.vocab, attention_mask=mask)
    with torch.no_grad():
        full, _ = pm.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask)
        cache, parts = pm.new_cache(), []
        for s in range(0, lay.input_ids.shape[1], m):
            h, cache = pm.hidden_states(lay.input_ids[:, s:s + m], lay.position_ids[:, s:s + m],
                                        lay.attention_mask[:, : s + m], past_key_values=cache,
                                        use_cache=True)
            parts.append(h)
    blockwise = torch.cat(parts, dim=1)
    valid = lay.attention_mask.bool()
    torch.testing.assert_close(blockwise[valid], full[valid], atol=1e-5, rtol=1e-5)


def test_use_cache_without_a_cache_returns_one():
    pm = pause_model("llama")
    lay = expand(real_ids(1, 4, V), pm.vocab)
    with torch.no_grad():
        full, _ = pm.hidden_states(lay.input_ids, lay.position_ids)
        h1, cache = pm.hidden_states(lay.input_ids[:, :6], lay.position_ids[:, :6], use_cache=True)
        assert cache is not None and cache.get_seq_length() == 6
        h2, cache = pm.hidden_states(lay.input_ids[:, 6:], lay.position_ids[:, 6:], past_key_values=cache)
    torch.testing.assert_close(torch.cat([h1, h2], 1), full, atol=1e-5, rtol=1e-5)


# -------------------------------------------------------------------------- token set-up


def test_repurposes_unused_tokens():
    tok = word_tokenizer(extra=[f"<unused{i}>" for i in range(6)])
    n = len(tok)
    model = hf_model("gemma", vocab_size=n)
    before = model.get_input_embeddings().weight.detach().clone()
    pm = PauseModel.from_hf(model, tok, num_steps=3)
    vocab = tok.get_vocab()
    assert pm.settings.pause_tokens == ("<unused0>", "<unused1>")
    assert pm.settings.dk_token == "<unused2>"
    assert pm.settings.pause_ids == (vocab["<unused0>"], vocab["<unused1>"])
    assert pm.settings.dk_id == vocab["<unused2>"]
    assert len(tok) == n and pm.settings.vocab_size == n  # nothing added, nothing resized
    torch.testing.assert_close(model.get_input_embeddings().weight, before)  # rows kept


def test_reserved_special_tokens_skip_those_with_a_role():
    names = [f"<|reserved_special_token_{i}|>" for i in range(4)]
    tok = word_tokenizer(extra=names, pad=names[0])  # pad borrows reserved token 0
    pm = PauseModel.from_hf(hf_model("llama", vocab_size=len(tok)), tok, num_steps=2)
    assert pm.settings.pause_tokens == (names[1],)
    assert pm.settings.dk_token == names[2]


def test_unused_tokens_number_order_and_opt_out():
    tok = word_tokenizer(extra=["<unused10>", "<unused2>", "<unused1>"])
    pm = PauseModel.from_hf(hf_model("gemma", vocab_size=len(tok)), tok, num_steps=2)
    assert (pm.settings.pause_tokens, pm.settings.dk_token) == (("<unused1>",), "<unused2>")
    tok2 = word_tokenizer(extra=["<unused0>", "<unused1>"])
    pm2 = PauseModel.from_hf(hf_model("gemma", vocab_size=len(tok2)), tok2, num_steps=2,
                             reuse_unused=False)
    assert pm2.settings.pause_tokens == ("<pause_1>",) and pm2.settings.dk_token == "<dont_know>"


@pytest.mark.parametrize("tie", [True, False])
def test_added_tokens_grow_embeddings_with_mean_rows(tie):
    tok = word_tokenizer()
    n = len(tok)
    model = hf_model("llama", vocab_size=n, tie=tie)
    emb_mean = model.get_input_embeddings().weight.detach().mean(0)
    out_mean = model.get_output_embeddings().weight.detach().mean(0)
    pm = PauseModel.from_hf(model, tok, num_steps=4)
    s = pm.settings
    assert s.pause_tokens == ("<pause_1>", "<pause_2>", "<pause_3>") and s.dk_token == "<dont_know>"
    new = list(s.pause_ids) + [s.dk_id]
    assert sorted(new) == list(range(n, n + 4))  # distinct, dk among them, after the old ids
    assert len(tok) == n + 4 and s.vocab_size == n + 4
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings().weight
    assert emb.shape[0] == out.shape[0] == n + 4
    assert (emb.data_ptr() == out.data_ptr()) == tie
    for i in new:
        torch.testing.assert_close(emb[i], emb_mean)
        torch.testing.assert_close(out[i], emb_mean if tie else out_mean)
    assert tok.convert_ids_to_tokens(s.dk_id) == "<dont_know>"
    assert "<dont_know>" not in tok.decode(new + [5], skip_special_tokens=True)


@pytest.mark.parametrize("tie", [True, False])
def test_from_config_random_pause_rows_are_distinct(tie):
    tok = word_tokenizer()
    n = len(tok)
    torch.manual_seed(0)
    mean = PauseModel.from_config(tiny_config("llama", vocab_size=n, tie=tie), word_tokenizer(),
                                  num_steps=4)
    emb = mean.hf_model.get_input_embeddings().weight.detach()
    torch.testing.assert_close(emb[mean.settings.pause_ids[0]], emb[:n].mean(0))  # the default
    pm = PauseModel.from_config(tiny_config("llama", vocab_size=n, tie=tie), tok,
                                num_steps=4, new_rows="random")
    new = list(pm.settings.pause_ids) + [pm.settings.dk_id]
    for weight in (pm.hf_model.get_input_embeddings().weight, pm.hf_model.get_output_embeddings().weight):
        rows = weight.detach()[new]
        assert torch.cdist(rows, rows).masked_fill(torch.eye(4, dtype=torch.bool), 1.0).min() > 0
        ratio = float(rows.std() / weight.detach()[:n].std())
        assert 0.5 < ratio < 2.0  # the spread of the model's own rows
    with pytest.raises(ValueError, match="new_rows"):
        PauseModel.from_hf(hf_model("llama", vocab_size=n), word_tokenizer(), num_steps=2,
                           new_rows="zeros")


def test_added_tokens_use_padded_rows_without_resizing():
    tok = word_tokenizer()
    n = len(tok)
    model = hf_model("qwen2", vocab_size=n + 8)  # the matrix has spare rows
    pm = PauseModel.from_hf(model, tok, num_steps=2)
    assert pm.settings.vocab_size == n + 8
    assert sorted([*pm.settings.pause_ids, pm.settings.dk_id]) == [n, n + 1]
    mean = model.get_input_embeddings().weight[:n].mean(0)
    torch.testing.assert_close(model.get_input_embeddings().weight[n], mean)


def test_advance_scheme_shares_one_pause_id():
    tok = word_tokenizer()
    pm = PauseModel.from_hf(hf_model("llama", vocab_size=len(tok)), tok, num_steps=4,
                            position_scheme="advance", use_dk=False)
    s = pm.settings
    assert len(set(s.pause_ids)) == 1 and len(s.pause_ids) == 3 and s.dk_id is None
    assert s.pause_tokens == ("<pause>",) * 3 and s.method == "tbys" and s.psi_dk is None
    assert len(tok) == 44 + 1
    lay = expand(real_ids(1, 3, 44), pm.vocab)
    assert lay.position_ids[0].tolist() == list(range(12))


def test_existing_names_are_used_as_they_are():
    tok = word_tokenizer(extra=["<dont_know>", "<pause_1>"])
    n = len(tok)
    pm = PauseModel.from_hf(hf_model("llama", vocab_size=n), tok, num_steps=2)
    assert pm.settings.pause_ids == (tok.get_vocab()["<pause_1>"],)
    assert pm.settings.dk_id == tok.get_vocab()["<dont_know>"] and len(tok) == n


def test_no_tokenizer_appends_ids():
    pm = pause_model("llama", num_steps=3)
    assert pm.settings.pause_ids == (V, V + 1) and pm.settings.dk_id == V + 2
    assert pm.settings.vocab_size == V + 3 and pm.settings.pause_tokens == ()


def test_char_tokenizer_gets_named_tokens():
    from cyb.data.synthetic.char_tokenizer import CharTokenizer

    tok = CharTokenizer()
    n = len(tok)
    pm = PauseModel.from_hf(hf_model("llama", vocab_size=n), tok, num_steps=2)
    assert tok.token_to_id("<pause_1>") == pm.settings.pause_ids[0] == n
    assert tok.token_to_id("<dont_know>") == pm.settings.dk_id == n + 1


def test_reserve_tokens_baseline_needs_nothing():
    tok = word_tokenizer()
    plan = reserve_tokens(tok, num_steps=1, use_dk=False, position_scheme="shared", num_rows=len(tok))
    assert plan.pause_ids == () and plan.dk_id is None and plan.new_ids == ()


# ---------------------------------------------------------------------------- persistence


def test_save_and_load_round_trip(tmp_path):
    tok = word_tokenizer()
    pm = PauseModel.from_hf(hf_model("gemma2", vocab_size=len(tok)), tok, num_steps=3, psi_dk=0.95)
    pm.save_pretrained(tmp_path)
    assert (tmp_path / SETTINGS_FILE).is_file() and (tmp_path / "model.safetensors").is_file()
    assert json.loads((tmp_path / SETTINGS_FILE).read_text())["dk_token"] == "<dont_know>"

    back = PauseModel.from_pretrained(tmp_path, attn_implementation="eager")
    assert back.settings == pm.settings
    assert len(back.tokenizer) == len(tok)
    sd, sd2 = pm.hf_model.state_dict(), back.hf_model.state_dict()
    assert sd.keys() == sd2.keys()
    for k in sd:
        torch.testing.assert_close(sd[k], sd2[k])
    ids = real_ids(2, 5, 44)
    torch.testing.assert_close(back(ids).log_t, pm(ids).log_t)

    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    torch.testing.assert_close(plain.lm_head.weight, pm.hf_model.lm_head.weight)

    # Arguments must agree with the saved settings or be left out.
    PauseModel.from_pretrained(tmp_path, num_steps=3, use_dk=True, psi_dk=0.95, method="cyb",
                               attn_implementation="eager")
    with pytest.raises(ValueError, match="num_steps=4 disagrees"):
        PauseModel.from_pretrained(tmp_path, num_steps=4)
    with pytest.raises(ValueError, match="psi_dk=None disagrees"):
        PauseModel.from_pretrained(tmp_path, psi_dk=None)


def test_from_pretrained_sets_up_a_plain_folder(tmp_path):
    tok = word_tokenizer()
    model = hf_model("llama", vocab_size=len(tok))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="num_steps .* is required"):
        PauseModel.from_pretrained(tmp_path)
    pm = PauseModel.from_pretrained(tmp_path, num_steps=3, torch_dtype="float32")
    assert pm.settings.pause_tokens == ("<pause_1>", "<pause_2>")
    assert pm.settings.vocab_size == len(tok) + 3 == len(pm.tokenizer)
    assert pm.hf_model.config._attn_implementation == "sdpa"


def test_from_config_and_char_tokenizer_round_trip(tmp_path):
    from cyb.data.synthetic.char_tokenizer import CharTokenizer

    tok = CharTokenizer()
    pm = PauseModel.from_config(tiny_config("qwen3", vocab_size=len(tok)), tok, num_steps=2)
    pm.save_pretrained(tmp_path)
    back = PauseModel.from_pretrained(tmp_path)
    assert isinstance(back.tokenizer, CharTokenizer) and back.tokenizer == tok
    assert back.settings == pm.settings


def test_load_hf_state_dict_and_prefix():
    pm = pause_model("llama")
    other = pause_model("llama")
    keys = [k for k in pm.state_dict() if k.startswith(PauseModel.hf_prefix)]
    assert keys and len(keys) == len(pm.state_dict())
    pm.load_hf_state_dict(other.hf_model.state_dict())
    torch.testing.assert_close(pm.hf_model.lm_head.weight, other.hf_model.lm_head.weight)


# ------------------------------------------------------------------------ head and readout


@pytest.mark.parametrize("family", [*FAMILIES, "cohere", "granite"])
def test_logits_are_what_the_hf_forward_gives(family):
    if family == "cohere":
        cfg = transformers.CohereConfig(vocab_size=V, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, logit_scale=0.5)
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    elif family == "granite":
        cfg = transformers.GraniteConfig(vocab_size=V, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, logits_scaling=4.0)
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    else:
        model = hf_model(family, softcap=2.0)
    pm = PauseModel.from_hf(model, num_steps=2)
    lay = expand(real_ids(2, 4, V), pm.vocab)
    with torch.no_grad():
        hidden, _ = pm.hidden_states(lay.input_ids, lay.position_ids, lay.attention_mask)
        ours = pm.logits(hidden)
        ref = model(input_ids=lay.input_ids, position_ids=lay.position_ids,
                    attention_mask=lay.attention_mask, use_cache=False).logits
        weight, bias = pm.output_projection()
        z = hidden @ weight.T + (0 if bias is None else bias)
        cap = pm.final_logit_softcap
        from_projection = z if cap is None else torch.tanh(z / cap) * cap
    assert torch.equal(ours, ref)
    torch.testing.assert_close(from_projection, ref, atol=1e-5, rtol=1e-5)


def test_gemma2_softcap_is_applied():
    pm = pause_model("gemma2", softcap=0.5)
    assert pm.final_logit_softcap == 0.5
    assert pause_model("llama").final_logit_softcap is None
    h = torch.randn(3, 32) * 10
    z = pm.logits(h)
    raw = pm.hf_model.lm_head(h)
    assert z.abs().max() <= 0.5 and raw.abs().max() > 0.5
    torch.testing.assert_close(z, 0.5 * torch.tanh(raw / 0.5))


def test_forward_shapes_and_dk_prior():
    pm = pause_model("llama", num_steps=3)
    b, length, m = 2, 5, 3
    mask = padding_mask("right", b, length)
    out = pm(real_ids(b, length, V), attention_mask=mask, return_logits=True)
    assert isinstance(out, PauseForward)
    assert out.hidden.shape == (b, length, m, 32)
    assert out.log_t.shape == out.log_d.shape == out.log_not_d.shape == (b, length, m)
    assert out.logits.shape == (b, length, m, V + 3)
    assert out.target_mask.tolist() == [[True] * 4 + [False], [True] * 2 + [False] * 3]
    bias = dk_logit_bias(V + 3, 0.9)
    assert pm.dk_bias == pytest.approx(bias)
    labels = out.layout.labels.view(b, length, m)
    lt, ld, lnd = readout_reference(out.logits, labels, dk_id=pm.settings.dk_id, dk_bias=bias)
    torch.testing.assert_close(out.log_d, ld)
    torch.testing.assert_close(out.log_not_d, lnd)
    torch.testing.assert_close(out.log_t, lt)
    # The prior matters: without it d is much smaller.
    _, ld0, _ = readout_reference(out.logits, labels, dk_id=pm.settings.dk_id, dk_bias=0.0)
    assert (ld - ld0).min() > 1.0
    assert out.log_d.exp().mean() > 0.5  # an untrained model with the 0.9 prior mostly says dk


def test_forward_without_dk_is_plain_log_softmax():
    pm = PauseModel.from_hf(hf_model("qwen2"), num_steps=2, use_dk=False)
    assert pm.settings.method == "tbys" and pm.dk_bias == 0.0
    ids = real_ids(1, 4, V)
    out = pm(ids, return_logits=True)
    ref = torch.log_softmax(out.logits.float(), -1)
    tgt = ids[0, 1:]
    expect = ref[0, :3].gather(-1, tgt.view(3, 1, 1).expand(3, 2, 1)).squeeze(-1)
    torch.testing.assert_close(out.log_t[0, :3], expect)
    assert torch.isinf(out.log_d).all() and (out.log_not_d == 0).all()
    baseline = PauseModel.from_hf(hf_model("qwen2"), num_steps=1)
    assert baseline.settings.method == "baseline" and baseline.settings.pause_ids == ()
    assert baseline(ids).log_t.shape == (1, 4, 1)


def test_gradients_flow_with_gradient_checkpointing():
    pm = pause_model("llama")
    pm.gradient_checkpointing_enable()
    pm.train()
    out = pm(real_ids(2, 4, V))
    loss = -(out.log_t[out.target_mask].sum() + out.log_not_d.sum())
    loss.backward()
    grads = [p.grad for p in pm.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert pm.is_gradient_checkpointing
    pm.gradient_checkpointing_disable()
    assert not pm.is_gradient_checkpointing


def test_properties():
    pm = pause_model("gemma3")
    assert pm.device.type == "cpu" and pm.dtype == torch.float32
    assert pm.config is pm.hf_model.config and pm.vocab.num_steps == 3
    assert len(pm.decoder_layers()) == 2
    n = pm.num_parameters()
    assert n == sum(p.numel() for p in {id(p): p for p in pm.parameters()}.values())
    assert "num_steps=3" in repr(pm)


# --------------------------------------------------------------------------------- errors


def test_flash_attention_is_refused():
    cfg = tiny_config("llama")
    with pytest.raises(ValueError, match="use 'sdpa' or 'eager'"):
        PauseModel.from_config(cfg, num_steps=2, attn_implementation="flash_attention_2")
    model = hf_model("llama")
    model.config._attn_implementation = "flash_attention_2"
    if model.config._attn_implementation != "flash_attention_2":
        pytest.skip("this transformers does not allow setting the attention implementation")
    with pytest.raises(ValueError, match="flash-attention"):
        PauseModel.from_hf(model, num_steps=2)


@pytest.mark.parametrize("m", [0, -1, 1.5, True])
def test_bad_num_steps(m):
    with pytest.raises(ValueError, match="num_steps"):
        PauseModel.from_hf(hf_model("llama"), num_steps=m)


@pytest.mark.parametrize("kwargs,match", [(dict(psi_dk=1.5), "psi_dk"),
                                          (dict(position_scheme="both"), "position_scheme")])
def test_bad_arguments_change_nothing(kwargs, match):
    tok = word_tokenizer()
    n = len(tok)
    model = hf_model("llama", vocab_size=n)
    with pytest.raises(ValueError, match=match):
        PauseModel.from_hf(model, tok, num_steps=3, **kwargs)
    assert len(tok) == n and model.get_input_embeddings().weight.shape[0] == n


def test_model_without_position_ids_is_refused():
    cfg = transformers.BloomConfig(vocab_size=V, hidden_size=32, n_layer=2, n_head=4)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    with pytest.raises(TypeError, match="position_ids"):
        PauseModel.from_hf(model, num_steps=2)


def test_bad_inputs_get_clear_errors():
    pm = pause_model("llama")
    ids = torch.full((1, 2), 5)
    with pytest.raises(ValueError, match="position_ids are required"):
        pm.hidden_states(ids, None)
    with pytest.raises(ValueError, match=r"attention_mask must have shape \[B, cached \+ new\]"):
        pm.hidden_states(ids, torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 3))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        pm.hidden_states(ids, torch.full((1, 2), T_MAX))
    with pytest.raises(ValueError, match="reserved as a pause/dk id"):
        pm(torch.tensor([[5, pm.settings.dk_id]]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        pm(torch.tensor([[5, 10_000]]))


def test_settings_must_fit_model_and_tokenizer():
    tok = word_tokenizer()
    pm = PauseModel.from_hf(hf_model("llama", vocab_size=len(tok)), tok, num_steps=2)
    s = pm.settings
    with pytest.raises(ValueError, match="output projection has"):
        PauseModel(pm.hf_model, PauseSettings(num_steps=2, pause_ids=s.pause_ids, vocab_size=500,
                                              dk_id=s.dk_id))
    with pytest.raises(ValueError, match="tokenizer maps"):
        PauseModel(pm.hf_model, s, word_tokenizer(extra=["<dont_know>", "<pause_1>"]))


# ------------------------------------------------------------------------------- settings


def test_settings_json_round_trip(tmp_path):
    s = PauseSettings(num_steps=3, pause_ids=(7, 8), vocab_size=10, dk_id=9, psi_dk=0.95,
                      method="cyb_va", pause_tokens=("<a>", "<b>"), dk_token="<dk>")
    assert PauseSettings.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert PauseSettings.load(s.save(tmp_path)) == s
    assert s.vocab().special_ids == {7, 8, 9}
    assert s.dk_bias() == pytest.approx(math.log(0.95 / 0.05 * 9))
    assert PauseSettings(num_steps=1, pause_ids=(), vocab_size=10).dk_bias() == 0.0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(psi_dk=1.0), "psi_dk"),
        (dict(pause_ids=(7, 7)), "distinct"),
        (dict(dk_id=8), "collides"),
        (dict(dk_id=10), "outside the vocabulary"),
        (dict(position_scheme="mixed"), "position_scheme"),
        (dict(pause_tokens=("<a>",)), "pause_tokens"),
        (dict(format_version=2), "format_version"),
    ],
)
def test_settings_validation(kwargs, match):
    base = dict(num_steps=3, pause_ids=(7, 8), vocab_size=10, dk_id=9)
    with pytest.raises(ValueError, match=match):
        PauseSettings(**{**base, **kwargs})


def test_settings_file_errors(tmp_path):
    (tmp_path / SETTINGS_FILE).write_text(json.dumps({"format": "cyb.PauseSettings", "num_steps": 1,
                                                      "pause_ids": [], "vocab_size": 4, "extra": 1}))
    with pytest.raises(ValueError, match="unknown fields"):
        PauseSettings.load(tmp_path)
    with pytest.raises(FileNotFoundError):
        PauseSettings.load(tmp_path / "missing")

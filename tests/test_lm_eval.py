"""lm-evaluation-harness model ``cyb`` and the offline task definitions.

Tiny random Llama models with a small byte-level BPE tokenizer.  The log-likelihood references
lay the pauses out by hand, run the Hugging Face model with a hand-built causal mask, read out
with an explicit softmax and apply the paper's equations (``reference.py``); the greedy
references implement the sequential decision directly.
"""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("lm_eval")

import reference as ref  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from lm_eval import simple_evaluate  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from cyb.data.tokenizer import train_bpe_tokenizer  # noqa: E402
from cyb.generation import generate  # noqa: E402
from cyb.integrations.lm_eval import CybLM, tasks_dir  # noqa: E402
from cyb.integrations.tasks import DATA_ENV, load_local, read_records  # noqa: E402
from cyb.losses import cyb_loss  # noqa: E402
from cyb.model import PauseModel  # noqa: E402

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Question: what is 2 + 3? Answer: 5",
    "Water freezes at zero degrees Celsius.\nA. one\nB. two\nC. three\nD. four\nAnswer: B",
    "Q: There are 15 trees in the grove. How many trees? A: The answer is 6.",
] * 4
PAIRS = [("Water freezes at zero degrees", " Celsius"), ("The opposite of hot is", " cold"),
         ("", "A week has seven days"), ("Question: 2 + 3 = ", "5"), ("Cats", " chase mice")]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_bpe_tokenizer(CORPUS, 320, tmp_path_factory.mktemp("tok"))


_MODELS: dict = {}


def pause_model(tokenizer, kind: str = "cyb", num_steps: int = 3) -> PauseModel:
    """A 2-layer Llama: ``cyb`` (dk), ``tbys`` (pauses, no dk) or ``baseline`` (M = 1)."""
    key = (kind, num_steps)
    if key not in _MODELS:
        import copy

        tok = copy.deepcopy(tokenizer)
        cfg = transformers.LlamaConfig(
            vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
            initializer_range=0.3, tie_word_embeddings=False, pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
        torch.manual_seed(0)
        m = 1 if kind == "baseline" else num_steps
        pm = PauseModel.from_config(cfg, tok, num_steps=m, use_dk=kind == "cyb",
                                    psi_dk=0.5 if kind == "cyb" else None).eval()
        if pm.settings.dk_id is not None:  # a dk row that makes both dk and answers occur
            with torch.no_grad():
                w = pm.hf_model.get_output_embeddings().weight
                w[pm.settings.dk_id] = torch.randn(w.shape[1]) * 0.3
        _MODELS[key] = pm
    return _MODELS[key]


def requests(kind: str, args_list) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=args, idx=0) for args in args_list]


# ------------------------------------------------------------------ references


@torch.no_grad()
def reference_blocks(pm: PauseModel, ids: list[int]) -> torch.Tensor:
    """``[L, M, V]`` float64 logits of real tokens ``ids`` laid out by hand (Recipe 1: the
    token, then ``<pause_1>`` .. ``<pause_{M-1}>`` at the token's position), run through the
    Hugging Face model with a hand-built causal mask."""
    s = pm.settings
    m = s.num_steps
    inp = [x for tok in ids for x in (tok, *s.pause_ids)]
    pos = [k for k in range(len(ids)) for _ in range(m)]
    t = len(inp)
    allowed = torch.tril(torch.ones(t, t, dtype=torch.bool))
    mask = torch.zeros(1, 1, t, t).masked_fill(~allowed, torch.finfo(torch.float32).min)
    logits = pm.hf_model(input_ids=torch.tensor([inp]), position_ids=torch.tensor([pos]),
                         attention_mask=mask, use_cache=False).logits
    return logits[0].double().view(len(ids), m, -1)


def reference_score(pm: PauseModel, ctx: list[int], cont: list[int]) -> tuple[float, bool]:
    """Continuation log-likelihood from the paper's equations, and the greedy sequential check."""
    s = pm.settings
    blocks = reference_blocks(pm, ctx + cont)
    prior = None if s.dk_id is None else ref.dk_log_prior_ratio(s.vocab_size, s.dk_id, s.psi_dk)
    total, greedy = 0.0, True
    for j, target in enumerate(cont):
        block = blocks[len(ctx) - 1 + j]  # the block of the token before the target
        steps = [ref.readout_explicit(z.tolist(), target, s.dk_id, prior) for z in block]
        log_t = [x[0] for x in steps]
        if s.dk_id is None:
            total += log_t[-1]  # TBYS: read out at the last step; baseline: M = 1
        else:
            d = [math.exp(x[1]) for x in steps]
            total -= ref.cyb_loss([math.exp(x) for x in log_t], d)
        greedy &= reference_greedy(block, s.dk_id, prior) == target
    return total, greedy


def reference_greedy(block: torch.Tensor, dk_id, prior) -> int:
    """At step i the argmax over the whole vocabulary (dk prior included); dk -> next step; at
    the last step the argmax without dk."""
    m = block.shape[0]
    for i in range(m):
        z = block[i].clone()
        if dk_id is not None:
            z += torch.tensor(prior, dtype=z.dtype)
            if i < m - 1 and int(z.argmax()) == dk_id:
                continue
            z[dk_id] = -math.inf
        return int(z.argmax())
    raise AssertionError("unreachable")


# ------------------------------------------------------------------ loglikelihood


@pytest.mark.parametrize("kind", ["cyb", "tbys", "baseline"])
def test_loglikelihood_matches_reference(tokenizer, kind):
    pm = pause_model(tokenizer, kind)
    lm = CybLM(pm, device="cpu", batch_size=2)
    got = lm.loglikelihood(requests("loglikelihood", PAIRS), disable_tqdm=True)
    for (context, continuation), (ll, greedy) in zip(PAIRS, got):
        ctx, cont = lm._codec.pair(context, continuation)
        want_ll, want_greedy = reference_score(pm, ctx, cont)
        assert ll == pytest.approx(want_ll, rel=1e-4, abs=1e-4)
        assert greedy == want_greedy
    assert all(math.isfinite(ll) for ll, _ in got)


def test_loglikelihood_is_minus_summed_cyb_loss(tokenizer):
    """The CYB readout is ``-sum_k cyb_loss`` (omega one-hot on M, gamma = 1) over the
    continuation tokens, with the per-step readout taken from the hand-laid sequence."""
    pm = pause_model(tokenizer, "cyb")
    lm = CybLM(pm, device="cpu")
    s = pm.settings
    ctx, cont = lm._codec.pair("The quick brown fox", " jumps over")
    [(ll, _)] = lm._loglikelihood_tokens([(ctx, cont)], "test", True)
    blocks = reference_blocks(pm, ctx + cont)[len(ctx) - 1:-1]  # [C, M, V]
    z = blocks.clone()
    z[..., s.dk_id] += pm.dk_bias
    others = z.clone()
    others[..., s.dk_id] = -math.inf
    norm, rest = torch.logsumexp(z, -1), torch.logsumexp(others, -1)
    target = torch.tensor(cont).view(-1, 1).expand(-1, s.num_steps)
    log_t = others.gather(-1, target.unsqueeze(-1)).squeeze(-1) - rest
    log_d, log_not_d = z[..., s.dk_id] - norm, rest - norm
    assert ll == pytest.approx(-float(cyb_loss(log_t, log_d, log_not_d).sum()), rel=1e-5, abs=1e-5)


def test_is_greedy_agrees_with_greedy_generation(tokenizer):
    pm = pause_model(tokenizer, "cyb")
    lm = CybLM(pm, device="cpu")
    ctx = lm._codec.context("Question: what is 2 + 3? Answer:")
    [res] = generate(pm, [ctx], max_new_tokens=6, eos_token_ids=())
    assert len(set(res.steps)) > 1  # answers at different steps: dk was chosen and not
    gen = res.token_ids
    [(_, greedy)] = lm._loglikelihood_tokens([(ctx, gen)], "test", True)
    assert greedy
    other = gen[:-1] + [(gen[-1] + 1) % 256 + 3]
    [(_, greedy)] = lm._loglikelihood_tokens([(ctx, other)], "test", True)
    assert not greedy


def test_batching_padding_and_truncation(tokenizer):
    pm = pause_model(tokenizer, "cyb")
    one = CybLM(pm, device="cpu", batch_size=1)
    many = CybLM(pm, device="cpu", batch_size=5)
    reqs = requests("loglikelihood", PAIRS)
    for (a, ga), (b, gb) in zip(one.loglikelihood(reqs, True), many.loglikelihood(reqs, True)):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-4)
        assert ga == gb
    short = CybLM(pm, device="cpu", max_length=6)
    ctx, cont = short._codec.pair("The quick brown fox jumps over the lazy", " dog")
    assert len(ctx) + len(cont) > 7
    [cut] = short._loglikelihood_tokens([(ctx, cont)], "test", True)
    kept = (ctx + cont)[-7:]
    [full] = many._loglikelihood_tokens([(kept[:len(kept) - len(cont)], cont)], "test", True)
    assert cut[0] == pytest.approx(full[0], rel=1e-5, abs=1e-5)


def test_batch_scoring_in_small_chunks(tokenizer):
    """Chunks of continuation blocks that cross rows give the one-chunk scores; an empty
    continuation scores (0, True)."""
    from cyb.integrations.scoring import score_batch

    pm = pause_model(tokenizer, "cyb")
    codec = CybLM(pm, device="cpu")._codec
    pairs = [codec.pair(c, x) for c, x in PAIRS] + [(codec.context("abc"), [])]
    whole = score_batch(pm, pairs, max_length=64)
    small = score_batch(pm, pairs, max_length=64, logits_per_chunk=1)  # one block per chunk
    assert whole[-1] == (0.0, True)
    for (a, ga), (b, gb) in zip(whole, small):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-5) and ga == gb


def test_context_encoding(tokenizer):
    lm = CybLM(pause_model(tokenizer, "cyb"), device="cpu")
    codec = lm._codec
    assert not codec.add_bos  # the BPE tokenizer adds no BOS by itself
    ctx, cont = codec.pair("Question: x ", "y")
    assert ctx == codec.encode("Question: x")
    assert ctx + cont == codec.encode("Question: x y")
    assert codec.pair("", "abc") == ([lm.prefix_token_id], codec.encode("abc"))
    bos = CybLM(pause_model(tokenizer, "cyb"), device="cpu", add_bos_token=True)._codec
    assert bos.pair("ab", "c")[0][0] == tokenizer.bos_token_id


def test_loglikelihood_rolling(tokenizer):
    pm = pause_model(tokenizer, "cyb")
    text = "The quick brown fox jumps over the lazy dog."
    lm = CybLM(pm, device="cpu")
    tokens = lm._codec.encode(text)
    [whole] = lm.loglikelihood_rolling(requests("loglikelihood_rolling", [(text,)]), True)
    [(direct, _)] = lm._loglikelihood_tokens([([lm.prefix_token_id], tokens)], "test", True)
    assert whole == pytest.approx(direct, rel=1e-5, abs=1e-5)

    small = CybLM(pm, device="cpu", max_length=5)
    seen = []
    score = small._loglikelihood_tokens
    small._loglikelihood_tokens = lambda pairs, *a: seen.extend(pairs) or score(pairs, *a)
    [windowed] = small.loglikelihood_rolling(requests("loglikelihood_rolling", [(text,)]), True)
    assert math.isfinite(windowed) and windowed != pytest.approx(whole)
    assert sum(len(cont) for _, cont in seen) == len(tokens)  # every token predicted once
    assert all(len(c) + len(t) - 1 <= 5 for c, t in seen)


# ------------------------------------------------------------------ generation


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_generate_until_matches_generate(tokenizer, mode, caplog):
    pm = pause_model(tokenizer, "cyb")
    lm = CybLM(pm, device="cpu", batch_size=2, mode=mode, max_gen_toks=7)
    contexts = ["Question: what is 2 + 3?", "The quick", "Q: There are 15 trees"]
    gen_kwargs = [{"until": ["e"], "do_sample": False},
                  {"until": "\n\n", "max_gen_toks": 4, "num_beams": 1},
                  {"until": [], "do_sample": False}]
    got = lm.generate_until(requests("generate_until", list(zip(contexts, gen_kwargs))), True)
    for context, kw, text in zip(contexts, gen_kwargs, got):
        until = [kw["until"]] if isinstance(kw["until"], str) else kw["until"]
        [want] = generate(pm, [lm._codec.context(context)], mode=mode, stop=tuple(until),
                          max_new_tokens=kw.get("max_gen_toks", 7))
        assert text == want.text
        assert not any(u in text for u in until)
    assert "num_beams" in caplog.text  # unsupported options are named, not silently dropped
    # the eager decoder (a left-padded batch on a DynamicCache) gives the engine's texts
    eager = CybLM(pm, device="cpu", batch_size=2, mode=mode, max_gen_toks=7, decoder="eager")
    assert eager.generate_until(requests("generate_until", list(zip(contexts, gen_kwargs))), True) == got
    assert eager.get_model_info()["cyb"]["decoder"] == "eager"
    assert lm.get_model_info()["cyb"]["decoder"] == "static"  # auto on a CPU: the engine without graphs


# ------------------------------------------------------------------ arguments


def test_bad_model_arguments(tokenizer):
    pm = pause_model(tokenizer, "cyb")
    with pytest.raises(ValueError, match="mode must be one of"):
        CybLM(pm, device="cpu", mode="sometimes")
    with pytest.raises(ValueError, match="batch_size='auto'"):
        CybLM(pm, device="cpu", batch_size="auto")
    with pytest.raises(ValueError, match="max_length=4096"):
        CybLM(pm, device="cpu", max_length=4096)
    with pytest.raises(TypeError, match="pretrained must be"):
        CybLM(3)
    with pytest.raises(ValueError, match="dtype apply when loading"):
        CybLM(pm, device="cpu", dtype="bfloat16")
    with pytest.raises(ValueError, match="decoder must be one of"):
        CybLM(pm, device="cpu", decoder="fast")
    with pytest.raises(ValueError, match="needs the model on a CUDA device"):
        CybLM(pm, device="cpu", decoder="graph")


# ------------------------------------------------------------------ through the harness


@pytest.fixture(scope="module")
def saved_cyb(tokenizer, tmp_path_factory):
    return pause_model(tokenizer, "cyb").save_pretrained(tmp_path_factory.mktemp("cyb_model"))


def test_model_args_win_over_harness_defaults(saved_cyb):
    """The command line always sends batch_size and device; model_args take precedence."""
    harness = {"batch_size": 1, "max_batch_size": None, "device": "cuda:0"}
    lm = CybLM.create_from_arg_string(f"pretrained={saved_cyb},device=cpu,batch_size=3,mode=adaptive",
                                      harness)
    assert (lm.batch_size, str(lm.device), lm.mode) == (3, "cpu", "adaptive")
    assert lm.model.settings == PauseModel.from_pretrained(saved_cyb).settings
    lm = CybLM.create_from_arg_obj({"pretrained": str(saved_cyb)}, {"batch_size": 2, "device": "cpu"})
    assert (lm.batch_size, lm.mode) == (2, "fixed")


def test_simple_evaluate_tiny_tasks(tokenizer, saved_cyb):
    pm = pause_model(tokenizer, "cyb")
    folder = saved_cyb
    manager = TaskManager(include_path=str(tasks_dir()), include_defaults=False)
    out = simple_evaluate(
        model="cyb", model_args=f"pretrained={folder},device=cpu,batch_size=4,mode=fixed",
        tasks=["cyb_tiny_mc", "cyb_tiny_gen", "cyb_tiny_ppl"], task_manager=manager,
        bootstrap_iters=0, log_samples=True)
    res = out["results"]
    assert 0.0 <= res["cyb_tiny_mc"]["acc,none"] <= 1.0
    assert "acc_norm,none" in res["cyb_tiny_mc"]
    assert 0.0 <= res["cyb_tiny_gen"]["exact_match,first-number"] <= 1.0
    assert res["cyb_tiny_ppl"]["word_perplexity,none"] > 1.0
    assert out["n-shot"]["cyb_tiny_mc"] == 1
    info = out["config"]["cyb"]
    assert (info["method"], info["num_steps"], info["generation_mode"]) == ("cyb", 3, "fixed")
    # what the harness scored is what the model class returns for the same requests
    sample = out["samples"]["cyb_tiny_mc"][0]
    lm = CybLM(pm, device="cpu")
    again = lm.loglikelihood(requests("loglikelihood", [tuple(a) for a in sample["arguments"]]), True)
    assert [r[0] for r in again] == pytest.approx([float(r[0][0]) for r in sample["resps"]], abs=1e-4)
    assert "1 + 6 =" in out["samples"]["cyb_tiny_gen"][3]["arguments"][0][0]


def _write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def fake_benchmarks(root):
    """A few records per split with the hub datasets' fields (enough for the few-shot counts)."""
    swag = [{"ind": i, "activity_label": "Cooking", "ctx_a": f"A man cuts {i} onions.",
             "ctx_b": "then he", "ctx": "", "endings": ["cooks them.", "sings.", "runs [title] away.",
                                                      "sleeps."], "label": str(i % 4),
             "source_id": "x", "split": "train", "split_type": "indomain"} for i in range(13)]
    _write_jsonl(root / "hellaswag" / "train.jsonl", swag[:11])  # the sampler draws 10 + 1
    _write_jsonl(root / "hellaswag" / "validation.jsonl", swag[11:])
    mmlu = [{"question": f"What is {i} + 1?", "subject": subject, "choices": ["1", "2", "3", "4"],
             "answer": i % 4} for subject in ("anatomy", "virology") for i in range(7)]
    _write_jsonl(root / "mmlu" / "dev.jsonl", mmlu[:5] + mmlu[7:12])
    (root / "mmlu" / "test.json").write_text(json.dumps(mmlu[5:7] + mmlu[12:]), encoding="utf-8")
    _write_jsonl(root / "gsm8k" / "test.jsonl",
                 [{"question": "Tom has 2 apples and buys 3. How many?", "answer": "2 + 3 = 5\n#### 5"}])


def test_local_benchmarks_run_offline(tokenizer, tmp_path, monkeypatch):
    fake_benchmarks(tmp_path / "data")
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "data"))
    pm = pause_model(tokenizer, "cyb")
    manager = TaskManager(include_path=str(tasks_dir()), include_defaults=False)
    names = set(manager.all_tasks)
    assert {"hellaswag_local", "gsm8k_cot_local", "mmlu_local", "mmlu_local_stem"} <= names
    subjects = {n for n in names if n.startswith("mmlu_local_") and not n.endswith("_tasks")}
    assert len(subjects) == 57 + 4  # subjects and category groups
    out = simple_evaluate(
        model=CybLM(pm, device="cpu", batch_size=8),
        tasks=["hellaswag_local", "mmlu_local_anatomy", "gsm8k_cot_local"], task_manager=manager,
        limit=1, bootstrap_iters=0, gen_kwargs={"max_gen_toks": 2}, log_samples=True)
    assert out["n-shot"] == {"hellaswag_local": 10, "mmlu_local_anatomy": 5, "gsm8k_cot_local": 8}
    res = out["results"]
    assert "acc_norm,none" in res["hellaswag_local"]
    assert "acc,none" in res["mmlu_local_anatomy"]
    assert "exact_match,strict-match" in res["gsm8k_cot_local"]
    mmlu_prompt = out["samples"]["mmlu_local_anatomy"][0]["arguments"][0][0]
    assert mmlu_prompt.startswith("The following are multiple choice questions (with answers) about anatomy.")
    assert mmlu_prompt.count("Answer:") == 6 and "What is 5 + 1?" in mmlu_prompt  # 5 shots + query
    gsm_prompt = out["samples"]["gsm8k_cot_local"][0]["arguments"][0][0]
    assert gsm_prompt.count("Q: ") == 9 and gsm_prompt.endswith("How many?\nA:")


def test_local_data_errors(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ENV, raising=False)
    with pytest.raises(ValueError, match=DATA_ENV):
        load_local("gsm8k")
    with pytest.raises(FileNotFoundError, match="test.jsonl"):
        load_local("gsm8k", data_dir=str(tmp_path))
    fake_benchmarks(tmp_path)
    ds = load_local("mmlu", subject="virology", data_dir=str(tmp_path))
    assert set(ds) == {"dev", "test"} and ds["test"].num_rows == 2
    assert set(ds["test"]["subject"]) == {"virology"}
    with pytest.raises(ValueError, match="no record with subject 'law'"):
        load_local("mmlu", subject="law", data_dir=str(tmp_path))
    assert read_records(tmp_path / "mmlu" / "test.json")[0]["question"] == "What is 5 + 1?"


@pytest.mark.slow
def test_mmlu_group_over_all_subjects(tokenizer, tmp_path):
    """The whole ``mmlu_local`` group (57 subjects, 4 categories) with two questions each."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mmlu_generate", tasks_dir() / "mmlu" / "_generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    rows = [{"question": f"Q{i} about {s}?", "subject": s, "choices": ["a", "b", "c", "d"],
             "answer": i % 4} for s in gen.SUBJECTS for i in range(7)]
    _write_jsonl(tmp_path / "mmlu" / "dev.jsonl", [r for r in rows if int(r["question"][1]) < 5])
    _write_jsonl(tmp_path / "mmlu" / "test.jsonl", [r for r in rows if int(r["question"][1]) >= 5])
    manager = TaskManager(include_path=str(tasks_dir()), include_defaults=False,
                          metadata={"data_dir": str(tmp_path)})
    out = simple_evaluate(model=CybLM(pause_model(tokenizer, "cyb"), device="cpu", batch_size=16),
                          tasks=["mmlu_local"], task_manager=manager, bootstrap_iters=0)
    res = out["results"]
    subjects = [f"mmlu_local_{s}" for s in gen.SUBJECTS]
    assert all(out["n-shot"][name] == 5 for name in subjects)
    assert res["mmlu_local"]["acc,none"] == pytest.approx(sum(res[n]["acc,none"] for n in subjects) / 57)


def test_the_module_as_a_program_scores_with_the_cyb_model(tokenizer, tmp_path):
    """``python -m cyb.integrations.lm_eval --model cyb``: the model is registered and scores a
    shipped task end to end."""
    import subprocess
    import sys

    folder = pause_model(tokenizer, "cyb").save_pretrained(tmp_path / "model")
    done = subprocess.run([sys.executable, "-m", "cyb.integrations.lm_eval", "--model", "cyb",
                           "--model_args", f"pretrained={folder},device=cpu", "--tasks", "cyb_tiny_ppl",
                           "--include_path", str(tasks_dir()), "--limit", "2"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cyb_tiny_ppl" in done.stdout

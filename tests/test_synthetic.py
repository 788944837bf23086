"""Synthetic tasks, CharTokenizer, SyntheticDataset and scoring."""

from __future__ import annotations

import itertools
import random
import re

import pytest
import torch

from cyb.data.synthetic import (
    TASKS,
    CharTokenizer,
    SyntheticDataset,
    ThreeSum,
    answer_token_accuracy,
    find_zero_triple,
    in_test_split,
    make_task,
    score,
    shift_predictions,
)

# A few sizes per task, small enough to sample quickly.
SIZES = {
    "addition": [dict(digits=1), dict(digits=4), dict(digits=5, lsb_first=True)],
    "multiplication": [dict(digits=1), dict(digits=3), dict(digits=2, digits_b=4, lsb_first=True)],
    "3sum": [dict(n=3, d=1), dict(n=5, d=2), dict(n=8, d=3)],
    "parity": [dict(length=1), dict(length=7), dict(length=32)],
    "lookup": [dict(hops=1, distractor_chains=0), dict(hops=4, distractor_chains=3),
               dict(hops=6, distractor_chains=10, name_len=2)],
}
ALL_TASKS = [(name, kw) for name, sizes in SIZES.items() for kw in sizes]


def samples(task, count=200, seed=0):
    rng = random.Random(seed)
    return [task.sample(rng) for _ in range(count)]


def test_registry_covers_every_task():
    assert set(TASKS) == set(SIZES) == {"addition", "multiplication", "3sum", "parity", "lookup"}


# ---------------------------------------------------------------- tokenizer

def test_tokenizer_layout_and_round_trip():
    tok = CharTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.vocab_size == len(tok) == 3 + len(tok.alphabet)
    text = tok.alphabet + "<bos><eos><pad>"
    ids = tok.encode(text)
    assert len(ids) == len(tok.alphabet) + 3 and len(set(ids)) == len(ids)
    assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(ids)) == text
    assert tok.decode(ids, skip_special_tokens=True) == tok.alphabet
    assert tok.encode("a>b") == [tok.token_to_id(c) for c in "a>b"]


def test_tokenizer_special_tokens_append():
    tok = CharTokenizer()
    base = tok.vocab_size
    ids = tok.add_special_tokens(["<pause_1>", "<pause_2>", "<dont_know>"])
    assert ids == [base, base + 1, base + 2] and tok.vocab_size == base + 3
    assert tok.add_special_tokens(["<pause_2>", "<new>"]) == [base + 1, base + 3]  # idempotent
    assert tok.encode("1<pause_1><dont_know>") == [tok.token_to_id("1"), base, base + 2]
    assert tok.decode([base + 2]) == "<dont_know>"
    assert tok.special_tokens[:3] == ["<pad>", "<bos>", "<eos>"]


def test_tokenizer_errors():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match="'A'"):
        tok.encode("A")
    with pytest.raises(ValueError, match="unknown special token"):
        tok.encode("<nope>")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="<name>"):
        tok.add_special_tokens(["pause"])
    with pytest.raises(TypeError):
        tok.add_special_tokens("<pause>")
    with pytest.raises(ValueError, match="repeated"):
        CharTokenizer("aa")


def test_tokenizer_save_load(tmp_path):
    tok = CharTokenizer()
    tok.add_special_tokens(["<pause_1>", "<dont_know>"])
    path = tok.save(tmp_path / "tok")
    loaded = CharTokenizer.load(tmp_path / "tok")
    assert loaded == tok and CharTokenizer.load(path) == tok
    assert loaded.encode("12+3=<dont_know>") == tok.encode("12+3=<dont_know>")
    assert loaded.token_to_id("<dont_know>") == tok.token_to_id("<dont_know>")
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="not a saved CharTokenizer"):
        CharTokenizer.load(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError):
        CharTokenizer.load(tmp_path / "missing")


def test_tokenizer_to_hf_matches(tmp_path):
    pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    tok = CharTokenizer()
    tok.add_special_tokens(["<pause_1>", "<dont_know>"])
    hf = tok.to_hf()
    assert len(hf) == tok.vocab_size
    assert hf.pad_token_id == tok.pad_id and hf.eos_token_id == tok.eos_id
    assert hf.bos_token_id == tok.bos_id
    texts = [p + a for name, kw in ALL_TASKS for p, a in samples(make_task(name, **kw), 3)]
    texts += ["<bos>1 2<pause_1><dont_know>=3<eos><pad>", tok.alphabet]
    for text in texts:
        ids = hf(text, add_special_tokens=False)["input_ids"]
        assert ids == tok.encode(text), text
        assert hf.decode(ids) == tok.decode(ids)
        assert hf.decode(ids, skip_special_tokens=True) == tok.decode(ids, skip_special_tokens=True)
    hf.save_pretrained(tmp_path / "hf")
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert again(texts[0], add_special_tokens=False)["input_ids"] == tok.encode(texts[0])


# ---------------------------------------------------------------- tasks: answers recomputed

def reference_answer(name, task, prompt):
    """Recompute the answer from the prompt text alone."""
    if name in ("addition", "multiplication"):
        a, op, b = re.fullmatch(r"(\d+)([+*])(\d+)=", prompt).groups()
        value = int(a) + int(b) if op == "+" else int(a) * int(b)
        width = len(a) + 1 if op == "+" else len(a) + len(b)
        text = str(value).zfill(width)
        return text[::-1] if task.lsb_first else text
    if name == "parity":
        bits = re.fullmatch(r"([01]+)=", prompt).group(1)
        assert len(bits) == task.length
        return str(bits.count("1") % 2)
    if name == "3sum":
        vecs = prompt[:-1].split(" ")
        assert len(vecs) == task.n and all(len(v) == task.d for v in vecs)
        found = any(
            all((int(x) + int(y) + int(z)) % 10 == 0 for x, y, z in zip(*triple))
            for triple in itertools.combinations(vecs, 3)
        )
        return "t" if found else "f"
    if name == "lookup":
        body, query = re.fullmatch(r"(.*)\?([a-z]+)=", prompt).groups()
        assign = dict(s.split("=") for s in body.split(","))
        assert len(assign) == len(body.split(",")) == task.hops * (task.distractor_chains + 1)
        value, hops = query, 0
        while not value.isdigit():
            value, hops = assign[value], hops + 1
        assert hops == task.hops
        return value
    raise AssertionError(name)


@pytest.mark.parametrize("name,kw", ALL_TASKS)
def test_task_answers_are_correct(name, kw):
    task = make_task(name, **kw)
    tok = CharTokenizer()
    for prompt, answer in samples(task):
        assert answer == reference_answer(name, task, prompt), prompt
        assert len(prompt) <= task.max_prompt_len and len(answer) <= task.max_answer_len
        tok.encode(prompt + answer)  # every character is in the shared alphabet
        assert set(prompt + answer) <= set(task.characters), prompt + answer  # and among the task's own


@pytest.mark.parametrize("name,kw", ALL_TASKS)
def test_a_tasks_characters_are_those_its_examples_use(name, kw):
    task = make_task(name, **kw)
    used = set("".join(p + a for p, a in samples(task, 2000)))
    assert set(task.characters) <= set(CharTokenizer().alphabet)
    if name != "lookup":  # lookup names draw from 26 letters, not all in every sample
        assert used == set(task.characters)


@pytest.mark.parametrize("name,kw", ALL_TASKS)
def test_task_determinism_and_params(name, kw):
    task = make_task(name, **kw)
    assert samples(task, 20, seed=3) == samples(task, 20, seed=3)
    assert samples(task, 20, seed=3) != samples(task, 20, seed=4)
    assert make_task(task.name, **task.params()) == task
    text = task.describe()
    assert task.name in text and "hard" in text.lower()


def test_fixed_width_tasks_fill_max_len():
    for name in ("addition", "multiplication", "3sum", "parity", "lookup"):
        for kw in SIZES[name]:
            task = make_task(name, **kw)
            prompt, answer = task.example()
            assert len(prompt) + len(answer) + 2 == task.max_len


def test_three_sum_brute_force_agrees_with_fast_check():
    rng = random.Random(0)
    for _ in range(300):
        n, d = rng.randint(3, 7), rng.randint(1, 2)
        vecs = [tuple(rng.randrange(10) for _ in range(d)) for _ in range(n)]
        brute = any(
            all(sum(col) % 10 == 0 for col in zip(*triple))
            for triple in itertools.combinations(vecs, 3)
        )
        triple = find_zero_triple(vecs)
        assert (triple is not None) == brute
        if triple:
            assert len(set(triple)) == 3


@pytest.mark.parametrize("name,kw", [("3sum", dict(n=6, d=1)), ("3sum", dict(n=10, d=3)),
                                     ("parity", dict(length=9))])
def test_labels_are_balanced(name, kw):
    labels = [a for _, a in samples(make_task(name, **kw), 1000, seed=1)]
    counts = {label: labels.count(label) for label in set(labels)}
    assert len(counts) == 2
    assert all(400 <= c <= 600 for c in counts.values()), counts


def test_lookup_statements_are_shuffled():
    task = make_task("lookup", hops=4, distractor_chains=0)
    firsts = {prompt.split(",")[0] for prompt, _ in samples(task, 50)}
    assert any(s.split("=")[1].isdigit() for s in firsts)
    assert any(not s.split("=")[1].isdigit() for s in firsts)


@pytest.mark.parametrize(
    "name,kw,match",
    [
        ("addition", dict(digits=0), "digits must be >= 1"),
        ("addition", dict(digits=1.5), "digits must be an int"),
        ("addition", dict(digits=True), "digits must be an int"),
        ("addition", dict(lsb_first="yes"), "lsb_first"),
        ("multiplication", dict(digits=2, digits_b=0), "digits_b must be >= 1"),
        ("3sum", dict(n=2), "n must be >= 3"),
        ("3sum", dict(d=0), "d must be >= 1"),
        ("parity", dict(length=0), "length must be >= 1"),
        ("lookup", dict(hops=0), "hops must be >= 1"),
        ("lookup", dict(distractor_chains=-1), "distractor_chains must be >= 0"),
        ("lookup", dict(hops=9, distractor_chains=2), "27 distinct variable names"),
        ("lookup", dict(name_len=5), r"name_len must be in \[1, 4\]"),
        ("addition", dict(width=3), "unknown"),
        ("sorting", dict(), "unknown synthetic task"),
    ],
)
def test_bad_sizes_raise(name, kw, match):
    with pytest.raises(ValueError, match=match):
        make_task(name, **kw)


def test_three_sum_gives_up_clearly_when_negatives_are_unreachable(monkeypatch):
    monkeypatch.setattr(ThreeSum, "max_corruptions", 5)
    task = make_task("3sum", n=40, d=1)
    with pytest.raises(RuntimeError, match="no negative example"):
        samples(task, 50)


# ---------------------------------------------------------------- dataset

@pytest.mark.parametrize("name,kw", [(n, s[1]) for n, s in SIZES.items()])
def test_dataset_masks_line_up(name, kw):
    tok = CharTokenizer()
    ds = SyntheticDataset(make_task(name, **kw), tok, 64, seed=0, split="train")
    n, length = ds.ids.shape
    assert (n, length) == (64, ds.task.max_len)
    assert ds.ids.dtype == torch.long and ds.attention_mask.dtype == torch.long
    assert ds.loss_mask.dtype == torch.bool and ds.answer_start.shape == (64,)
    for i in range(n):
        row, start, end = ds.ids[i], int(ds.answer_start[i]), int(ds.lengths[i])
        assert tok.decode(row[:start]) == "<bos>" + ds.prompts[i]
        assert tok.decode(row[ds.loss_mask[i]]) == ds.answers[i] + "<eos>"
        assert ds.loss_mask[i].nonzero().flatten().tolist() == list(range(start, end))
        assert ds.attention_mask[i].tolist() == [1] * end + [0] * (length - end)
        assert (row[end:] == tok.pad_id).all()


def test_dataset_is_deterministic_and_splits_are_disjoint():
    tok = CharTokenizer()
    task = make_task("addition", digits=2)
    a = SyntheticDataset(task, tok, 300, seed=5)
    b = SyntheticDataset(task, tok, 300, seed=5)
    assert torch.equal(a.ids, b.ids) and a.prompts == b.prompts
    assert SyntheticDataset(task, tok, 300, seed=6).prompts != a.prompts
    train = set()
    for seed in range(3):
        train |= set(SyntheticDataset(task, tok, 1000, seed=seed, split="train").prompts)
    test = SyntheticDataset(task, tok, 200, seed=0, split="test")
    assert not train & set(test.prompts)
    assert all(in_test_split(p, 0.1) for p in test.prompts)
    assert not any(in_test_split(p, 0.1) for p in train)


def test_dataset_options_and_errors():
    tok = CharTokenizer()
    task = make_task("parity", length=6)
    ds = SyntheticDataset("parity", tok, 10, seq_len=40)
    assert ds.ids.shape == (10, 40)
    uniq = SyntheticDataset(task, tok, 40, unique=True)
    assert len(set(uniq.prompts)) == 40
    with pytest.raises(ValueError, match="too small"):
        SyntheticDataset(task, tok, 20, split="test", unique=True)  # ~6 of 64 prompts are test
    with pytest.raises(ValueError, match="num_examples must be >= 1"):
        SyntheticDataset(task, tok, 0)
    with pytest.raises(ValueError, match="split must be one of"):
        SyntheticDataset(task, tok, 5, split="valid")
    with pytest.raises(ValueError, match="test_fraction"):
        SyntheticDataset(task, tok, 5, test_fraction=1.0)
    with pytest.raises(ValueError, match="seq_len must be an int >= the task's max_len = 10"):
        SyntheticDataset(task, tok, 5, seq_len=8)


def test_batches():
    ds = SyntheticDataset(make_task("addition", digits=2), CharTokenizer(), 10)
    batches = list(ds.batches(4))
    assert [len(b["index"]) for b in batches] == [4, 4, 2]
    assert torch.cat([b["index"] for b in batches]).tolist() == list(range(10))
    assert torch.equal(batches[1]["ids"], ds.ids[4:8])
    assert set(batches[0]) == {"ids", "attention_mask", "loss_mask", "answer_start", "index"}
    shuffled = [b["index"].tolist() for b in ds.batches(4, shuffle=True, seed=1, drop_last=True)]
    again = ds.batches(4, shuffle=True, seed=1, drop_last=True)
    assert shuffled == [b["index"].tolist() for b in again]
    assert len(shuffled) == 2 and sorted(sum(shuffled, [])) != list(range(8))
    first = next(iter(torch.utils.data.DataLoader(ds, batch_size=3)))
    assert torch.equal(first["ids"], ds.ids[:3])


# ---------------------------------------------------------------- scoring

def test_score_by_hand():
    result = score(["123", "129", "12", "1234"], ["123", "123", "123", "123"])
    assert result["exact_match"] == 0.25
    assert result["per_position"] == [1.0, 1.0, 0.5]
    assert result["char_accuracy"] == 10 / 12
    assert result["num_examples"] == 4
    mixed = score(["t", "x7"], ["t", "17"])  # answers of different lengths
    assert mixed["per_position"] == [0.5, 1.0] and mixed["exact_match"] == 0.5
    with pytest.raises(ValueError, match="entries"):
        score(["1"], ["1", "2"])
    with pytest.raises(ValueError, match="at least one"):
        score([], [])


def test_answer_token_accuracy_by_hand():
    target = torch.tensor([[1, 5, 6, 7, 2, 0], [1, 5, 8, 9, 2, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 0]], dtype=torch.bool)
    pred = torch.tensor([[9, 9, 6, 7, 2, 9], [9, 9, 9, 3, 2, 9]])
    r = answer_token_accuracy(pred, target, mask)
    assert r["token_accuracy"] == 4 / 5 and r["exact_match"] == 0.5
    assert r["per_position"] == [0.5, 1.0, 1.0]
    counts = [r[k] for k in ("correct_tokens", "num_tokens", "correct_examples", "num_examples")]
    assert counts == [4, 5, 1, 2]
    with pytest.raises(ValueError, match=r"\[N, L\]"):
        answer_token_accuracy(pred[:, :3], target, mask)


def test_teacher_forced_perfect_predictions_score_one():
    ds = SyntheticDataset(make_task("lookup", hops=2), CharTokenizer(), 16)
    next_ids = torch.roll(ds.ids, -1, dims=1)  # a perfect model's argmax at each position
    pred = shift_predictions(next_ids)
    assert (pred[:, 0] == -1).all() and torch.equal(pred[:, 1:], ds.ids[:, 1:])
    r = answer_token_accuracy(pred, ds.ids, ds.loss_mask)
    assert r["token_accuracy"] == r["exact_match"] == 1.0 and r["per_position"] == [1.0, 1.0]

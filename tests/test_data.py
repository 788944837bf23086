"""Text sources, tokenisers and packing (cyb.data.sources / tokenizer / packing)."""

from __future__ import annotations

import gzip
import itertools
import json
import random
import sys
import types
from pathlib import Path

import pytest
import torch

from cyb.data.packing import PackedBlocks, batches, resolved_shuffle, split_texts, train_valid_sources
from cyb.data.sources import iter_texts, list_files, text_source
from cyb.data.tokenizer import (
    count_tokens,
    encode_texts,
    load_tokenizer,
    text_encoder,
    train_bpe_tokenizer,
)

TECHDOCS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "techdocs"
WORDS = "the a model pause token breath step loss data train block of to and is in we".split()


def make_docs(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60))) + f" #{i}" for i in range(n)
    ]


DOCS = make_docs(300)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    return train_bpe_tokenizer(DOCS * 3, 320, out, special_tokens=["<pause_1>", "<dont_know>"])


def write_jsonl(path: Path, texts, field="text") -> Path:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({field: t, "source": "test"}) + "\n")
    return path


# ---------------------------------------------------------------------------- sources


@pytest.mark.parametrize("name", ["d.jsonl", "d.jsonl.gz", "c4-train.00000-of-00002.json.gz"])
def test_jsonl(tmp_path, name):
    p = write_jsonl(tmp_path / name, ["one", "", "two\nlines"])
    assert list(iter_texts(p)) == ["one", "two\nlines"]  # empty documents are skipped


def test_jsonl_text_field_and_missing_field(tmp_path):
    p = write_jsonl(tmp_path / "d.jsonl", ["x", "y"], field="content")
    assert list(iter_texts(p, text_field="content")) == ["x", "y"]
    with pytest.raises(KeyError, match="text_field='text'"):
        list(iter_texts(p))


def test_txt_file_and_paragraphs(tmp_path):
    (tmp_path / "a.txt").write_text("first para\nline 2\n\n\nsecond\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("gz doc")
    assert list(iter_texts(tmp_path / "a.txt")) == ["first para\nline 2\n\n\nsecond\n"]
    assert list(iter_texts(tmp_path / "a.txt", paragraphs=True)) == ["first para\nline 2", "second"]
    assert list(iter_texts(tmp_path)) == ["first para\nline 2\n\n\nsecond\n", "gz doc"]


def test_folder_glob_and_split(tmp_path):
    write_jsonl(tmp_path / "train.jsonl.gz", ["t1", "t2"])
    write_jsonl(tmp_path / "valid.jsonl.gz", ["v1"])
    (tmp_path / "notes.md").write_text("ignored: not a data format")
    (tmp_path / "config.json").write_text('{"ignored": "metadata json in a folder"}')
    assert list(iter_texts(tmp_path)) == ["t1", "t2", "v1"]
    assert list(iter_texts(tmp_path, split="valid")) == ["v1"]
    assert list(iter_texts(str(tmp_path / "*.jsonl.gz"))) == ["t1", "t2", "v1"]
    assert [p.name for p in list_files(tmp_path, "train")] == ["train.jsonl.gz"]
    with pytest.raises(FileNotFoundError, match="split='test'"):
        list(iter_texts(tmp_path, split="test"))


def test_source_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list(iter_texts(tmp_path / "missing.jsonl"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        text_source(tmp_path / "missing.jsonl")  # fails when the source is declared
    with pytest.raises(FileNotFoundError, match="no readable files"):
        list(iter_texts(str(tmp_path / "*.jsonl")))
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(ValueError, match="unknown format"):
        list(iter_texts(tmp_path / "x.csv"))
    write_jsonl(tmp_path / "empty.jsonl", ["", ""])
    with pytest.raises(ValueError, match="no non-empty document"):
        list(iter_texts(tmp_path / "empty.jsonl"))
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        list(iter_texts(tmp_path / "bad.jsonl"))


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["p1", None, "p2"], "n": [1, 2, 3]}), tmp_path / "d.parquet")
    assert list(iter_texts(tmp_path / "d.parquet")) == ["p1", "p2"]
    with pytest.raises(KeyError, match="content"):
        list(iter_texts(tmp_path / "d.parquet", text_field="content"))


def test_parquet_without_pyarrow_says_what_to_install(tmp_path, monkeypatch):
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match="pip install pyarrow"):
        list(iter_texts(tmp_path / "d.parquet"))


def test_saved_hf_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": ["h1", "h2", "h3"]})
    ds.save_to_disk(str(tmp_path / "one"))
    assert list(iter_texts(tmp_path / "one")) == ["h1", "h2", "h3"]
    assert list(iter_texts(tmp_path / "one", split="train")) == ["h1", "h2", "h3"]  # no split set
    dsd = datasets.DatasetDict({"train": ds, "validation": ds.select([0])})
    dsd.save_to_disk(str(tmp_path / "dict"))
    assert list(iter_texts(tmp_path / "dict")) == ["h1", "h2", "h3"]
    assert list(iter_texts(tmp_path / "dict", split="validation")) == ["h1"]
    with pytest.raises(ValueError, match="split='test' not found"):
        list(iter_texts(tmp_path / "dict", split="test"))


def test_hub_spec_streams_through_load_dataset(monkeypatch):
    calls = []

    def load_dataset(name, config, split, streaming):
        calls.append((name, config, split, streaming))
        return iter([{"text": "hub1"}, {"text": "hub2"}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert list(iter_texts("hf:allenai/c4:en", split="validation")) == ["hub1", "hub2"]
    assert calls == [("allenai/c4", "en", "validation", True)]
    list(iter_texts("hf:some/corpus"))
    assert calls[-1] == ("some/corpus", None, "train", True)


def test_techdocs_reads_a_few_documents():
    path = TECHDOCS / "train.jsonl.gz"
    if not path.is_file():
        pytest.skip("shared/data/techdocs is not beside the repository")
    docs = list(itertools.islice(iter_texts(path), 5))
    assert len(docs) == 5 and all(isinstance(d, str) and d for d in docs)
    assert list(itertools.islice(iter_texts(TECHDOCS, split="valid"), 2))


# ---------------------------------------------------------------------------- tokenizer


def test_bpe_train_and_reload(tok, tmp_path):
    assert len(tok) == 320
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.convert_tokens_to_ids(["<pause_1>", "<dont_know>"]) == [3, 4]
    out = tmp_path / "again"
    tok.save_pretrained(str(out))
    again = load_tokenizer(out)
    text = "the model pauses, then answers: ünïcode ✓\n\n  spaces"
    ids = encode_texts(again, [text])[0]
    assert ids == encode_texts(tok, [text])[0]
    assert again.decode(ids) == text  # byte-level: every text round-trips
    assert len(again) == 320 and again.eos_token_id == 2


def test_special_token_strings_in_text_are_plain_text(tok):
    ids = encode_texts(tok, ["a <eos> b <pause_1>"])[0]
    assert 2 not in ids and 3 not in ids
    assert tok.decode(ids) == "a <eos> b <pause_1>"
    assert 2 in encode_texts(tok, ["a <eos>"], split_special_tokens=False)[0]


def test_bpe_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="vocab_size must be >= 260"):
        train_bpe_tokenizer(["x"], 100, tmp_path, special_tokens=["<p>"])
    with pytest.raises(ValueError, match="distinct"):
        train_bpe_tokenizer(["x"], 512, tmp_path, special_tokens=["<eos>"])
    with pytest.raises(ValueError, match="no texts"):
        train_bpe_tokenizer([], 512, tmp_path)


def test_load_tokenizer_missing_folder_or_uncached_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(OSError, match="not in the local cache"):
        load_tokenizer("nobody-here/not-a-cached-tokenizer")


# ---------------------------------------------------------------------------- packing


def flat_stream(tok, docs) -> list[int]:
    return [t for ids in encode_texts(tok, docs) for t in ids + [tok.eos_token_id]]


def test_blocks_are_the_concatenation_split(tok):
    blocks = list(PackedBlocks(DOCS, tok, 37, chunk_docs=7))
    flat = flat_stream(tok, DOCS)
    assert len(blocks) == len(flat) // 37 == count_tokens(DOCS, tok) // 37
    assert all(b.dtype == torch.long and b.shape == (37,) for b in blocks)
    assert torch.cat(blocks).tolist() == flat[: len(blocks) * 37]


def test_python_tokenizer_fallback():
    class CharTok:
        eos_token_id = 0

        def __call__(self, texts, add_special_tokens=False, split_special_tokens=False):
            return {"input_ids": [[ord(c) % 50 + 1 for c in t] for t in texts]}

    blocks = list(PackedBlocks(["abc", "de"], CharTok(), 2))
    assert torch.stack(blocks).tolist() == [[48, 49], [50, 0], [1, 2]]  # "abc" EOS "de" EOS


def test_shuffle_is_a_deterministic_permutation(tok):
    plain = [tuple(b.tolist()) for b in PackedBlocks(DOCS, tok, 16)]
    a = [tuple(b.tolist()) for b in PackedBlocks(DOCS, tok, 16, shuffle_buffer=10, seed=3)]
    b = [tuple(b.tolist()) for b in PackedBlocks(DOCS, tok, 16, shuffle_buffer=10, seed=3)]
    c = [tuple(b.tolist()) for b in PackedBlocks(DOCS, tok, 16, shuffle_buffer=10, seed=4)]
    assert a == b and a != plain and a != c
    assert sorted(a) == sorted(plain)
    assert sorted(a[:10]) == sorted(plain[:10])  # shuffled within windows only


MARKERS = [f"m{i:03d}" for i in range(200)]


def marker_docs() -> list[str]:
    """200 documents, each one marker word repeated: a block's words name its documents."""
    return [" ".join([m] * 40) for m in MARKERS]


@pytest.fixture(scope="module")
def marker_tok(tmp_path_factory):
    return train_bpe_tokenizer(marker_docs(), 400, tmp_path_factory.mktemp("mtok"))


def documents_in(tokenizer, blocks) -> set[str]:
    text = " ".join(tokenizer.decode(b.tolist()) for b in blocks)
    return {w for w in text.split() if w in set(MARKERS)}


def test_corpus_shuffle_mixes_documents_in_the_first_batch(marker_tok):
    """Corpus order puts a few neighbouring documents in a batch; the shuffle does not."""
    first = lambda **kw: list(itertools.islice(PackedBlocks(marker_docs(), marker_tok, 16, **kw), 32))  # noqa: E731
    in_order = documents_in(marker_tok, first(shuffle="none"))
    shuffled = documents_in(marker_tok, first(shuffle="corpus", seed=0))
    assert len(in_order) < 15
    assert len(shuffled) >= 25
    assert max(int(m[1:]) for m in shuffled) > 150  # from all over the corpus, not its start


def test_corpus_shuffle_is_a_new_permutation_each_epoch(tok):
    plain = [tuple(b.tolist()) for b in PackedBlocks(DOCS, tok, 16)]
    two = [tuple(b.tolist()) for b in PackedBlocks(DOCS, tok, 16, shuffle="corpus", seed=5, epochs=2)]
    n = len(plain)
    assert len(two) == 2 * n
    assert sorted(two[:n]) == sorted(plain) == sorted(two[n:])
    assert two[:n] != plain and two[:n] != two[n:]


def test_epochs_done_counts_passes(tok):
    n = len(list(PackedBlocks(DOCS, tok, 16)))
    pb = PackedBlocks(DOCS, tok, 16, shuffle="corpus", epochs=None)
    assert pb.epochs_done() is None and pb.epoch_blocks is None
    it = iter(pb)
    next(it)
    assert pb.epoch_blocks == n and pb.epochs_done() == pytest.approx(1 / n)
    for _ in range(n + n // 2 - 1):
        next(it)
    assert pb.epochs_done() == pytest.approx(1 + (n // 2) / n)
    streamed = PackedBlocks(DOCS, tok, 16, shuffle_buffer=4, epochs=None)  # known after one pass
    it = iter(streamed)
    next(it)
    assert streamed.epochs_done() is None
    for _ in range(n):
        next(it)
    assert streamed.epochs_done() == pytest.approx(1 + 1 / n)
    resumed = PackedBlocks(DOCS, tok, 16, shuffle_buffer=4, epochs=None)
    resumed.load_state_dict(json.loads(json.dumps(streamed.state_dict())))
    assert resumed.epochs_done() == pytest.approx(1 + 1 / n)


def test_shuffle_arguments_are_checked(tok):
    with pytest.raises(ValueError, match="shuffle must be one of"):
        PackedBlocks(DOCS, tok, 16, shuffle="random")
    with pytest.raises(ValueError, match="shuffle_buffer >= 2"):
        PackedBlocks(DOCS, tok, 16, shuffle="buffer", shuffle_buffer=1)
    state = PackedBlocks(DOCS, tok, 16, shuffle="corpus").state_dict()
    with pytest.raises(ValueError, match="shuffle='corpus'"):
        PackedBlocks(DOCS, tok, 16).load_state_dict(state)


def test_shuffle_auto_resolves_by_source():
    from cyb.config import DataConfig

    d = DataConfig()
    assert resolved_shuffle(d.shuffle, d.source) == "corpus"
    assert resolved_shuffle("auto", "hf:allenai/c4:en") == "buffer"
    assert resolved_shuffle("none", "hf:allenai/c4:en") == "none"


def collect(pb, batch_size, k=None):
    return [x.clone() for x in itertools.islice(batches(pb, batch_size), k)]


@pytest.mark.parametrize(
    "n_docs, kwargs",
    [
        (300, dict()),
        (300, dict(shuffle_buffer=7, seed=1)),
        (60, dict(shuffle_buffer=5, epochs=3, world_size=2, rank=1)),  # resumes across epochs
        (60, dict(shuffle="corpus", seed=2, epochs=3)),
        (60, dict(shuffle="corpus", epochs=None, world_size=2, rank=0)),
        (60, dict(shard="document", world_size=3, rank=2, epochs=None)),
    ],
)
def test_exact_resume(tok, n_docs, kwargs):
    make = lambda: PackedBlocks(DOCS[:n_docs], tok, 23, chunk_docs=5, **kwargs)  # noqa: E731
    full = collect(make(), 3, 60)
    assert len(full) > 20
    for k in (0, 1, 4, 11, 19, len(full) - 1):
        pb = make()
        first = collect(pb, 3, k)
        state = json.loads(json.dumps(pb.state_dict()))  # survives a JSON checkpoint
        resumed = make()
        resumed.load_state_dict(state)
        rest = collect(resumed, 3, len(full) - k)
        assert torch.equal(torch.stack(first + rest), torch.stack(full)), k


def test_epochs_repeat_and_reset(tok):
    one = [b.tolist() for b in PackedBlocks(DOCS, tok, 50)]
    pb = PackedBlocks(DOCS, tok, 50, epochs=2)
    two = [b.tolist() for b in pb]
    assert two == one + one
    assert list(pb) == []  # consumed
    pb.reset()
    assert len(list(pb)) == len(two)


@pytest.mark.parametrize("shuffle", [dict(shuffle_buffer=0), dict(shuffle_buffer=6), dict(shuffle="corpus")])
def test_rank_shards_are_disjoint_complete_and_equal(tok, shuffle):
    everything = [tuple(b.tolist()) for b in PackedBlocks(DOCS, tok, 19, **shuffle)]
    shards = [
        [tuple(b.tolist()) for b in PackedBlocks(DOCS, tok, 19, **shuffle, rank=r, world_size=3)]
        for r in range(3)
    ]
    assert len({len(s) for s in shards}) == 1
    merged = [x for s in shards for x in s]
    # the state is the same on every rank at the same step: rank 0's state resumes rank 2
    pb0 = PackedBlocks(DOCS, tok, 19, **shuffle, rank=0, world_size=3)
    list(itertools.islice(pb0, 5))
    pb2 = PackedBlocks(DOCS, tok, 19, **shuffle, rank=2, world_size=3)
    pb2.load_state_dict(pb0.state_dict())
    assert [tuple(b.tolist()) for b in pb2] == shards[2][5:]
    assert len(set(merged)) == len(merged)  # disjoint (blocks here are all distinct)
    assert set(merged) <= set(everything) and len(everything) - len(merged) < 3


def test_document_sharding_is_disjoint(tok):
    shards = [list(PackedBlocks(DOCS, tok, 8, rank=r, world_size=2, shard="document")) for r in range(2)]
    flat0 = torch.cat(shards[0]).tolist()
    assert flat0 == flat_stream(tok, DOCS[0::2])[: len(flat0)]


def test_batches_shape_and_drop_last(tok):
    pb = PackedBlocks(DOCS[:40], tok, 10)
    n = len(list(pb))
    pb.reset()
    got = list(batches(pb, 4, drop_last=False))
    assert all(b.shape == (4, 10) and b.dtype == torch.long for b in got[:-1])
    assert sum(len(b) for b in got) == n
    pb.reset()
    assert len(list(batches(pb, 4))) == n // 4


def test_train_valid_split(tmp_path):
    train = [t for t in split_texts(DOCS, 0.2, "train", seed=5)]
    valid = [t for t in split_texts(DOCS, 0.2, "valid", seed=5)]
    assert sorted(train + valid) == sorted(DOCS) and not set(train) & set(valid)
    assert 30 < len(valid) < 90
    assert valid == list(split_texts(reversed(DOCS), 0.2, "valid", seed=5))[::-1]  # order-free
    tr, va = train_valid_sources(DOCS, valid_fraction=0.2, seed=5)
    assert list(tr()) == train and list(va()) == valid
    p = write_jsonl(tmp_path / "valid.jsonl", ["held out"])
    tr, va = train_valid_sources(DOCS, p)
    assert list(tr()) == DOCS and list(va()) == ["held out"]
    assert train_valid_sources(DOCS)[1] is None
    with pytest.raises(ValueError, match="valid_fraction"):
        split_texts(DOCS, 1.5, "valid")
    with pytest.raises(ValueError, match="valid_fraction"):
        train_valid_sources(DOCS, valid_fraction=1.0)


def test_packing_errors(tok, tmp_path):
    with pytest.raises(ValueError, match="block_len"):
        PackedBlocks(DOCS, tok, 0)
    with pytest.raises(ValueError, match="rank"):
        PackedBlocks(DOCS, tok, 8, rank=2, world_size=2)
    with pytest.raises(ValueError, match="at least 1"):
        list(PackedBlocks(["tiny"], tok, 1000))
    with pytest.raises(FileNotFoundError):
        PackedBlocks(tmp_path / "missing.jsonl.gz", tok, 8)
    pb = PackedBlocks(DOCS, tok, 8)
    state = pb.state_dict()
    with pytest.raises(ValueError, match="block_len=8"):
        PackedBlocks(DOCS, tok, 9).load_state_dict(state)
    with pytest.raises(ValueError, match="world_size"):
        PackedBlocks(DOCS, tok, 8, world_size=2).load_state_dict(state)
    pb_far = PackedBlocks(DOCS, tok, 8)
    pb_far.load_state_dict({**state, "window_doc": 10_000, "window_offset": 3})
    with pytest.raises(ValueError, match="data changed"):
        list(pb_far)


def test_techdocs_packs(tok):
    path = TECHDOCS / "valid.jsonl.gz"
    if not path.is_file():
        pytest.skip("shared/data/techdocs is not beside the repository")
    docs = lambda: itertools.islice(iter_texts(path), 3)  # noqa: E731
    blocks = list(PackedBlocks(docs, tok, 128))
    assert torch.cat(blocks).tolist() == flat_stream(tok, list(docs()))[: 128 * len(blocks)]
    assert len(text_encoder(tok)(["x", "y"])) == 2


# --------------------------------------------------------------------------- built-in corpus


def test_builtin_python_docs_is_many_documents_in_a_fixed_order():
    from cyb.data import sources

    docs = list(iter_texts("builtin:python-docs"))
    assert len(docs) > 3000 and all(d.strip() for d in docs)
    assert len(set(docs)) == len(docs)  # each docstring once
    assert sum(map(len, docs)) > 500_000
    titles = [d.split("\n", 1)[0] for d in docs]
    assert "json.dumps" in titles and "collections.OrderedDict" in titles
    assert any(t.startswith("topic ") for t in titles)  # the reference topics of pydoc_data
    heads = {t.split(".")[0] for t in titles}
    assert not heads & {"torch", "numpy", "transformers", "cyb", "antigravity", "this", "tkinter", "idlelib"}
    sources._python_docs.cache_clear()  # read again in a fresh interpreter: the same documents
    assert list(iter_texts("builtin:python-docs")) == docs


def test_builtin_python_docs_split_is_disjoint_and_complete():
    docs = list(iter_texts("builtin:python-docs"))
    train = list(iter_texts("builtin:python-docs@train"))
    valid = list(iter_texts("builtin:python-docs", split="valid"))
    assert set(train).isdisjoint(valid) and sorted(train + valid) == sorted(docs)
    assert 0.02 < len(valid) / len(docs) < 0.1
    kept = set(train)
    assert train == [d for d in docs if d in kept]  # the corpus order, kept
    factory = text_source("builtin:python-docs@valid")
    assert list(factory()) == valid


def test_builtin_errors():
    with pytest.raises(ValueError, match="unknown built-in corpus 'builtin:nope'.*builtin:python-docs"):
        text_source("builtin:nope")
    with pytest.raises(ValueError, match="split must be one of"):
        text_source("builtin:python-docs@test")


def test_builtin_python_docs_packs(tok):
    texts, valid = train_valid_sources("builtin:python-docs@train", "builtin:python-docs@valid")
    blocks = list(itertools.islice(PackedBlocks(texts, tok, 64, epochs=1), 50))
    assert len(blocks) == 50 and all(b.shape == (64,) for b in blocks)
    assert next(iter(PackedBlocks(valid, tok, 64, epochs=1))).shape == (64,)


def test_a_damaged_tokenizer_folder_is_named(tmp_path, tok):
    tok.save_pretrained(tmp_path / "tok")
    path = tmp_path / "tok" / "tokenizer.json"
    path.write_text(path.read_text()[: len(path.read_text()) // 2])
    with pytest.raises(ValueError, match=r"tokenizer in .*tok cannot be read"):
        load_tokenizer(tmp_path / "tok")

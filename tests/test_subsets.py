"""data.fraction: a seeded share of the training documents (cyb.data.subsets) and its fields."""

from __future__ import annotations

import random

import pytest

from cyb.config import RunConfig
from cyb.config_parsing import ConfigError
from cyb.data.subsets import FractionOfTexts, choose_documents, fraction_rank


def _docs(n=400, seed=0):
    rng = random.Random(seed)
    return [f"doc{i} " + "x" * rng.choice((5, 40, 300, 2000)) for i in range(n)]


def test_a_share_holds_its_part_of_the_characters_within_half_a_document():
    docs = _docs()
    total = sum(map(len, docs))
    for fraction in (0.05, 1 / 3, 0.5, 2 / 3, 0.99):
        choice = choose_documents(docs, fraction, seed=1)
        assert choice.documents == len(docs) and choice.total_characters == total
        assert choice.characters == sum(len(docs[i]) for i in choice.kept)
        assert abs(choice.characters - fraction * total) <= max(map(len, docs)) / 2
        assert choice.share == pytest.approx(choice.characters / total)
    assert len(choose_documents(docs, 1.0, seed=1).kept) == len(docs)
    assert "documents" in choose_documents(docs, 0.5, seed=1).describe()


def test_smaller_shares_are_inside_larger_ones_at_one_seed_and_seeds_differ():
    docs = _docs()
    third, two_thirds, whole = (choose_documents(docs, f, seed=3).kept for f in (1 / 3, 2 / 3, 1.0))
    assert third < two_thirds < whole
    assert choose_documents(docs, 1 / 3, seed=3).kept == third  # deterministic
    assert choose_documents(docs, 1 / 3, seed=4).kept != third


def test_the_choice_follows_the_text_not_its_place():
    docs = _docs(200)
    rank = {d: fraction_rank(d, 0) for d in docs}
    shuffled = list(reversed(docs))
    kept = {docs[i] for i in choose_documents(docs, 0.4, 0).kept}
    assert {shuffled[i] for i in choose_documents(shuffled, 0.4, 0).kept} == kept
    assert max(rank[d] for d in kept) < min(rank[d] for d in docs if d not in kept)


def test_a_tiny_share_keeps_one_document_and_a_bad_share_is_refused():
    docs = ["a" * 100, "b" * 100]
    assert len(choose_documents(docs, 1e-6, 0).kept) == 1
    assert choose_documents([], 0.5, 0).kept == frozenset()
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"fraction must lie in \(0, 1\]"):
            choose_documents(docs, bad, 0)
        with pytest.raises(ValueError, match=r"fraction must lie in \(0, 1\]"):
            FractionOfTexts(lambda: docs, bad, 0)


def test_the_factory_restarts_the_kept_documents_in_their_order_reading_the_choice_once():
    docs = _docs(100)
    calls = []

    def factory():
        calls.append(1)
        return iter(docs)

    texts = FractionOfTexts(factory, 0.5, seed=2)
    first = list(texts())
    assert first == [d for i, d in enumerate(docs) if i in texts.choice.kept]
    assert list(texts()) == first
    assert len(calls) == 3  # the choice once, then one reading per call


def _cfg(**data):
    return RunConfig.from_dict({"data": {"source": "train.jsonl", **data}})


@pytest.mark.parametrize("value", [0.0, -0.5, 1.01, float("nan")])
def test_data_fraction_outside_its_range_names_the_field(value):
    with pytest.raises(ConfigError, match=r"data\.fraction: must lie in \(0, 1\]"):
        _cfg(fraction=value).validate()


def test_data_fraction_is_for_text_and_train_epochs_must_not_be_negative():
    with pytest.raises(ConfigError, match=r"data\.fraction: selects documents of training text"):
        _cfg(task="addition", fraction=0.5).validate()
    with pytest.raises(ConfigError, match=r"train\.epochs: must be >= 0"):
        RunConfig.from_dict({"train": {"epochs": -1}}).validate()
    cfg = _cfg(fraction=0.25, fraction_seed=7).validate()
    assert cfg.data.fraction == 0.25 and cfg.data.fraction_seed == 7


def test_help_config_documents_the_share_and_the_passes():
    from cyb.config import field_docs

    docs = field_docs()
    assert "seeded random order" in docs["data.fraction"] and "held-out" in docs["data.fraction"]
    assert "train.seed" in docs["data.fraction_seed"]
    assert "Passes over the training data" in docs["train.epochs"]


def test_a_checkpoint_of_another_share_is_not_resumed(tmp_path):
    from cyb.resume import CannotResume, check_resumable

    saved = _cfg(fraction=0.5).to_dict()
    check_resumable(saved, _cfg(fraction=0.5), tmp_path)
    with pytest.raises(CannotResume, match=r"data\.fraction was 0\.5, now 1\.0"):
        check_resumable(saved, _cfg(), tmp_path)
    with pytest.raises(CannotResume, match=r"data\.fraction_seed"):
        check_resumable(saved, _cfg(fraction=0.5, fraction_seed=1), tmp_path)

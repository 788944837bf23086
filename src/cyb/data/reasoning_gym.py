"""reasoning-gym's procedural tasks as training data and as a scorer (the ``reasoning`` extra).

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ (PyPI ``reasoning-gym``,
Apache-2.0) ships over a hundred generators of reasoning questions, each with a verifier of its
own (``dataset.score_answer(answer, entry)``).  A run names one as its task,
``data.task: reasoning-gym:NAME``, with the generator's own settings in ``data.task_kwargs``
(``{min_terms: 2, max_terms: 4}`` for ``chain_sum``); ``cyb eval`` then scores the answers the
model generates with that verifier (:mod:`cyb.eval.reasoning_scores`).

**Examples as text.** Every entry of the generator (``{"question", "answer", "metadata"}``)
becomes a prompt and a completion for the run's tokenizer (a pretrained model's, or
``data.tokenizer``; a character vocabulary cannot write the questions)::

    prompt      "{question}\\nAnswer:"        (encoded as a generation prompt: BOS where the tokenizer adds one)
    completion  " {answer}" + end-of-sequence

and the loss covers the completion only, as for the synthetic tasks written as text
(:class:`~cyb.data.synthetic.text_task.TextTaskDataset`, whose encoding this reuses).

**Splits.** reasoning-gym draws entry ``i`` of a generator seeded ``s`` from
``random.Random(s + i)``, so two seeds a few apart share most of their entries.  The train and
held-out sets of a run therefore come from generators seeded by a hash of (task, run seed,
split), and each keeps only the questions of its own part of the question space (a stable
hash of the question, :func:`cyb.data.synthetic.in_test_split`, 10% held out): no held-out
question can be a training question, whatever the seeds.  The same arguments always give the
same rows, and the first rows of a larger set are the rows of a smaller one.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
from functools import lru_cache
from .. import extras
from .synthetic.base import check_int
from .synthetic.dataset import SPLITS, in_test_split
from .synthetic.text_task import TextTaskDataset

#: ``data.task`` names a reasoning-gym generator with this prefix (``reasoning-gym:chain_sum``).
PREFIX = "reasoning-gym:"
#: The Python module and the extra of pyproject.toml that brings it.
MODULE = "reasoning_gym"
EXTRA = "reasoning"
PROMPT_TEMPLATE = "{question}\nAnswer:"
COMPLETION_TEMPLATE = " {answer}"
#: Share of the question space held out (as the synthetic tasks).
TEST_FRACTION = 0.1
#: The ``size`` every generator is built with: the most entries a split may look at.  A few
#: generators (list_functions, acre) plan their entries by size; with a fixed size their rows
#: do not depend on how many a run asks for.
GENERATOR_SIZE = 2**20
#: Settings cyb sets itself (from the run's seed and the split), refused in data.task_kwargs.
RESERVED = ("seed", "size")


def is_reasoning_gym(task: str | None) -> bool:
    """Whether ``task`` (``data.task``) names a reasoning-gym generator."""
    return isinstance(task, str) and task.startswith(PREFIX)


def task_name(task: str) -> str:
    """``chain_sum`` of ``reasoning-gym:chain_sum``."""
    return task[len(PREFIX):].strip() if is_reasoning_gym(task) else task


def require(what: str = "a reasoning-gym task (data.task: reasoning-gym:NAME)"):
    """The ``reasoning_gym`` module; :class:`~cyb.extras.MissingPackage` (one line, with the
    command that installs the ``reasoning`` extra) when it is not installed."""
    return extras.require(MODULE, what)


def available_tasks() -> list[str]:
    """The names of every registered generator, sorted."""
    from reasoning_gym.factory import DATASETS

    require()
    return sorted(DATASETS)


def _settings_class(name: str):
    from reasoning_gym.factory import DATASETS

    return DATASETS[name][1]


def check_task(task: str, settings: dict | None = None) -> str:
    """Check a ``reasoning-gym:NAME`` task and its settings; returns ``NAME``.

    Raises :class:`~cyb.extras.MissingPackage` without the package, ValueError in one line for
    an unknown name (with the closest names), a setting the generator does not take (with the
    ones it does), ``seed``/``size`` (cyb sets them), or a value the generator refuses.
    """
    require()
    name = task_name(task)
    known = available_tasks()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(PREFIX + c for c in close)}?" if close else \
            f"; it has {len(known)} ({', '.join(known[:6])}, ...)"
        raise ValueError(f"unknown reasoning-gym task {name!r}{hint}")
    settings = dict(settings or {})
    reserved = sorted(set(settings) & set(RESERVED))
    if reserved:
        raise ValueError(f"reasoning-gym task {name!r}: {', '.join(reserved)} cannot be set in data.task_kwargs "
                         "(the seed comes from train.seed and the split, the number of examples from "
                         "data.num_train_examples / data.num_valid_examples)")
    fields = [f.name for f in dataclasses.fields(_settings_class(name)) if f.name not in RESERVED]
    unknown = sorted(set(settings) - set(fields))
    if unknown:
        raise ValueError(f"reasoning-gym task {name!r} takes settings {', '.join(fields)}; got unknown "
                         f"{', '.join(unknown)}")
    _generator(name, _frozen(settings), 0, 1)  # the generator's own checks of the values
    return name


def _frozen(settings: dict) -> tuple:
    """A hashable form of the settings (lists as tuples) for the generator cache."""
    def freeze(v):
        if isinstance(v, (list, tuple)):
            return tuple(freeze(x) for x in v)
        if isinstance(v, dict):
            return tuple(sorted((k, freeze(x)) for k, x in v.items()))
        return v
    return tuple(sorted((k, freeze(v)) for k, v in settings.items()))


def _thawed(frozen: tuple) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in frozen}


@lru_cache(maxsize=16)
def _generator(name: str, frozen: tuple, seed: int, size: int = GENERATOR_SIZE):
    """The generator of ``name`` with the settings ``frozen`` (size 1 to check settings or to
    score: cheap also for the generators that plan their entries by size)."""
    rg = require()
    try:
        return rg.create_dataset(name, size=size, seed=seed, **_thawed(frozen))
    except (AssertionError, ValueError, TypeError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"reasoning-gym task {name!r} refuses the settings {_thawed(frozen)} "
                         f"(data.task_kwargs): {reason}") from None


def generator_seed(name: str, seed: int, split: str) -> int:
    """The seed of the generator a split is drawn from: a hash of (task, run seed, split), below
    2**31, so that the splits of neighbouring run seeds do not share entries."""
    digest = hashlib.blake2b(f"{name}:{seed}:{split}".encode(), digest_size=8, person=b"cyb-rgym").digest()
    return int.from_bytes(digest, "little") % 2**31


def draw_entries(task: str, settings: dict | None, num_examples: int, seed: int, split: str, *,
                 test_fraction: float = TEST_FRACTION) -> list[dict]:
    """``num_examples`` entries (``{"question", "answer", "metadata"}``) of the generator for
    ``split`` (``"train"`` or ``"test"``), in the order drawn (see the module docstring).

    Raises ValueError when the generator gives an entry without an answer, or cannot give that
    many questions of the split within :data:`GENERATOR_SIZE` entries."""
    name = task_name(task)
    check_int("num_examples", num_examples, 1)
    check_int("seed", seed, 0)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    gen = _generator(name, _frozen(dict(settings or {})), generator_seed(name, seed, split))
    want_test = split == "test"
    out: list[dict] = []
    for i in range(GENERATOR_SIZE):
        entry = gen[i]
        if not isinstance(entry.get("question"), str) or not isinstance(entry.get("answer"), str):
            raise ValueError(f"reasoning-gym task {name!r} gives entries without a question or answer string "
                             f"(answer {entry.get('answer')!r}): cyb trains on question and answer; choose "
                             "a task with reference answers")
        if in_test_split(entry["question"], test_fraction) == want_test:
            out.append(entry)
            if len(out) == num_examples:
                return out
    raise ValueError(f"reasoning-gym task {name!r} gave only {len(out)} {split} questions of "
                     f"{num_examples} in {GENERATOR_SIZE} entries: ask for fewer examples")


def prompt_of(entry: dict) -> str:
    """The prompt text of an entry."""
    return PROMPT_TEMPLATE.format(question=entry["question"].rstrip())


def completion_of(entry: dict) -> str:
    """The completion text of an entry (before the end-of-sequence token)."""
    return COMPLETION_TEMPLATE.format(answer=entry["answer"])


def score_answer(task: str, settings: dict | None, answer: str | None, entry: dict) -> float:
    """The task's own verifier on ``answer`` (text, stripped), in [0, 1]: reasoning-gym's
    ``score_answer(answer, entry)`` of the generator the entry came from."""
    gen = _generator(task_name(task), _frozen(dict(settings or {})), 0, 1)
    return float(gen.score_answer(answer, entry))


class ReasoningGymDataset(TextTaskDataset):
    """The rows of a reasoning-gym task for a Hugging Face ``tokenizer``: ``prompt completion
    eos``, right-padded, the loss on the completion and the end-of-sequence token.

    The attributes are those of :class:`~cyb.data.synthetic.SyntheticDataset` (``ids``,
    ``attention_mask``, ``loss_mask``, ``answer_start``, ``lengths``, ``prompts``, ``answers``:
    the completion texts), plus ``entries`` (the generator's entries, which its verifier scores)
    and ``task`` (``reasoning-gym:NAME``) and ``settings``.
    """

    def __init__(self, task: str, tokenizer, num_examples: int, seed: int = 0, split: str = "train", *,
                 settings: dict | None = None, test_fraction: float = TEST_FRACTION) -> None:
        if getattr(tokenizer, "eos_token_id", None) is None:
            raise ValueError(f"the tokenizer ({type(tokenizer).__name__}) has no end-of-sequence token: a task "
                             "answer must end with one")
        self.task = PREFIX + task_name(task)
        self.settings = dict(settings or {})
        self.tokenizer = tokenizer
        self.num_examples = num_examples
        self.seed = seed
        self.split = split
        self.test_fraction = float(test_fraction)
        self.unique = False
        self.entries = draw_entries(task, self.settings, num_examples, seed, split, test_fraction=test_fraction)
        self.prompts = [prompt_of(e) for e in self.entries]
        self.answers = [completion_of(e) for e in self.entries]
        self._encode()

    def prompt_ids(self, index: int) -> list[int]:
        """The prompt's token ids of row ``index``, as the row holds them (the generation input)."""
        return self.ids[index, :int(self.answer_start[index])].tolist()

    def score(self, index: int, answer: str | None) -> float:
        """The task's verifier on a generated ``answer`` to row ``index``."""
        return score_answer(self.task, self.settings, answer, self.entries[index])

    def __repr__(self) -> str:
        return (f"ReasoningGymDataset({self.task!r}, settings={self.settings}, split={self.split!r}, "
                f"num_examples={self.num_examples}, seed={self.seed}, seq_len={self.seq_len})")


def dataset_split(cfg, tokenizer, split: str) -> ReasoningGymDataset:
    """One of a run's sets: ``"train"`` (``data.num_train_examples`` seeded by ``train.seed``) or
    ``"test"`` (``data.num_valid_examples`` by ``train.seed + 1``), as the synthetic tasks."""
    from .synthetic.text_task import is_char_tokenizer

    d = cfg.data
    if is_char_tokenizer(tokenizer):
        raise ValueError(f"data.task ({d.task}) is written as text: it needs a pretrained model's tokenizer "
                         "(model.name_or_path) or data.tokenizer, not the character vocabulary of the "
                         "synthetic tasks")
    n, seed = (d.num_train_examples, cfg.train.seed) if split == "train" else (d.num_valid_examples, cfg.train.seed + 1)
    return ReasoningGymDataset(d.task, tokenizer, n, seed=seed, split=split, settings=d.task_kwargs)


def describe(task: str, settings: dict | None = None) -> str:
    """One line naming the task and its settings (for headers and cards)."""
    kw = ", ".join(f"{k}={v}" for k, v in (settings or {}).items())
    return f"reasoning-gym {task_name(task)}" + (f" ({kw})" if kw else "")


__all__ = ["COMPLETION_TEMPLATE", "EXTRA", "GENERATOR_SIZE", "PREFIX", "PROMPT_TEMPLATE", "ReasoningGymDataset",
           "TEST_FRACTION", "available_tasks", "check_task", "completion_of", "dataset_split", "describe",
           "draw_entries", "generator_seed", "is_reasoning_gym", "prompt_of", "require", "score_answer",
           "task_name"]

"""Reserve the pause and ``<don't know>`` ids of a model, and give new ids embedding rows.

Where the ids come from, in order of preference:

1. ``"existing"``: the tokenizer already has every name this layout needs (``<pause_1>`` ..
   ``<pause_{M-1}>`` or ``<pause>``, and ``<dont_know>``); their ids are used as they are.
2. ``"unused"``: the tokenizer has enough named unused tokens (Gemma's ``<unused0>``,
   ``<unused1>``, ...; Llama 3's ``<|reserved_special_token_N|>``); the lowest-numbered ones are
   repurposed, their trained embedding rows kept.
3. ``"added"``: the names are added to the tokenizer as special tokens.
4. ``"appended"``: without a tokenizer, ids are appended after the last embedding row.

Ids that did not exist before (3 and 4) get embedding rows (input and output, tied or not) set
to the mean of the rows of the tokens that existed, after the embedding matrix has been grown to
cover them when needed; ``new_rows="random"`` draws them at random with the spread of the
existing rows instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

PAUSE_TOKEN = "<pause_{j}>"
SHARED_PAUSE_TOKEN = "<pause>"
DK_TOKEN = "<dont_know>"
#: Named unused tokens that may be repurposed; group 1 is the token's number.
UNUSED_TOKEN_PATTERNS: tuple[str, ...] = (
    r"<unused(\d+)>",
    r"<\|reserved_special_token_(\d+)\|>",
)
_ROLE_ATTRS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "sep_token_id",
               "cls_token_id", "mask_token_id")


@dataclass(frozen=True)
class TokenPlan:
    """Ids and names reserved for pauses and dk.

    Attributes:
        pause_ids: ids fed at steps ``2..M`` (length ``M-1``).
        pause_tokens: their names (``()`` for ``"appended"``).
        dk_id: the dk id or None.
        dk_token: its name or None.
        source: ``"existing"``, ``"unused"``, ``"added"`` or ``"appended"``.
        new_ids: ids that did not exist before and need initialised embedding rows.
        num_rows: embedding rows the model needs (at least ``max id + 1``).
        old_rows: rows that held existing tokens before (the rows a mean is taken over).
    """

    pause_ids: tuple[int, ...]
    pause_tokens: tuple[str, ...]
    dk_id: int | None
    dk_token: str | None
    source: str
    new_ids: tuple[int, ...]
    num_rows: int
    old_rows: int


def pause_token_names(num_steps: int, position_scheme: str) -> list[str]:
    """Names of the pause tokens fed at steps ``2..M`` (one per step; repeated for "advance")."""
    if position_scheme == "advance":
        return [SHARED_PAUSE_TOKEN] * (num_steps - 1)
    return [PAUSE_TOKEN.format(j=j) for j in range(1, num_steps)]


# ----------------------------------------------------------------------- tokenizer access


def _is_hf(tokenizer) -> bool:
    return hasattr(tokenizer, "get_vocab") and hasattr(tokenizer, "add_tokens")


def _is_char(tokenizer) -> bool:
    return all(hasattr(tokenizer, a) for a in ("id_to_token", "token_to_id", "add_special_tokens"))


def tokenizer_vocab(tokenizer) -> dict[str, int]:
    """``{token string: id}`` of a Hugging Face tokenizer or a ``CharTokenizer``."""
    if _is_hf(tokenizer):
        return dict(tokenizer.get_vocab())
    if _is_char(tokenizer):
        return {tokenizer.id_to_token(i): i for i in range(len(tokenizer))}
    raise TypeError(
        f"tokenizer must be a Hugging Face tokenizer or a cyb CharTokenizer, got {type(tokenizer).__name__}"
    )


def _add_special(tokenizer, names: Sequence[str]) -> None:
    if _is_hf(tokenizer):
        from tokenizers import AddedToken

        tokenizer.add_tokens(
            [AddedToken(n, special=True, normalized=False) for n in names], special_tokens=True
        )
    else:
        tokenizer.add_special_tokens(list(names))


def _role_ids(tokenizer) -> set[int]:
    """Ids with a role (bos, eos, pad, ...): never repurposed even if their name looks unused."""
    out: set[int] = set()
    for attr in _ROLE_ATTRS:
        v = getattr(tokenizer, attr, None)
        for x in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(x, int):
                out.add(x)
    return out


def unused_token_ids(tokenizer, patterns: Iterable[str] = UNUSED_TOKEN_PATTERNS,
                     limit: int | None = None) -> list[tuple[str, int]]:
    """Named unused tokens ``[(name, id), ...]``, by pattern order then number.

    Tokens with a role (bos, eos, pad, unk, ...) are left out.  ``limit`` bounds the ids
    (only ids below it are returned, e.g. the number of embedding rows).
    """
    vocab = tokenizer_vocab(tokenizer)
    taken = _role_ids(tokenizer)
    found: list[tuple[str, int]] = []
    for pattern in patterns:
        rx = re.compile(pattern)
        hits = []
        for name, idx in vocab.items():
            m = rx.fullmatch(name)
            if m and idx not in taken and (limit is None or idx < limit):
                hits.append((int(m.group(1)), name, idx))
        found.extend((name, idx) for _, name, idx in sorted(hits))
    return found


# ----------------------------------------------------------------------- planning


def reserve_tokens(
    tokenizer,
    *,
    num_steps: int,
    use_dk: bool,
    position_scheme: str,
    num_rows: int,
    reuse_unused: bool = True,
) -> TokenPlan:
    """Choose (and, if needed, add to ``tokenizer``) the pause and dk tokens.

    Args:
        tokenizer: a Hugging Face tokenizer, a ``CharTokenizer``, or None (ids are appended
            after the ``num_rows`` existing embedding rows).  Mutated when tokens are added.
        num_steps: ``M`` >= 1.
        use_dk: reserve a ``<don't know>`` id.
        position_scheme: ``"shared"`` (``M-1`` distinct pause ids) or ``"advance"`` (one).
        num_rows: rows of the model's embedding matrix now.
        reuse_unused: allow repurposing named unused tokens (see module docstring).
    """
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
        raise ValueError(f"num_steps (M) must be an integer >= 1, got {num_steps!r}")
    pause_names = pause_token_names(num_steps, position_scheme)
    distinct = list(dict.fromkeys(pause_names))  # keeps order, drops the repeats of "advance"
    wanted = distinct + ([DK_TOKEN] if use_dk else [])

    if tokenizer is None:
        ids = list(range(num_rows, num_rows + len(wanted)))
        by_name = dict(zip(wanted, ids))
        return _plan(pause_names, by_name, use_dk, "appended", tuple(ids),
                     num_rows + len(wanted), num_rows, named=False)

    vocab = tokenizer_vocab(tokenizer)
    old_len = len(tokenizer)
    num_rows_needed = max(num_rows, old_len)  # every token of the tokenizer needs a row
    if all(n in vocab for n in wanted):
        by_name = {n: vocab[n] for n in wanted}
        beyond = tuple(sorted({i for i in by_name.values() if i >= num_rows}))  # rows to grow
        return _plan(pause_names, by_name, use_dk, "existing", beyond,
                     max([num_rows_needed] + [i + 1 for i in by_name.values()]), min(old_len, num_rows))

    if reuse_unused and wanted:
        spare = unused_token_ids(tokenizer, limit=num_rows)
        if len(spare) >= len(wanted):
            chosen = spare[: len(wanted)]
            by_id = {n: i for n, i in chosen}
            # The names stored are the tokenizer's own (e.g. "<unused0>"): they round-trip.
            name_of = dict(zip(wanted, (n for n, _ in chosen)))
            pause_real = [name_of[n] for n in pause_names]
            dk_real = name_of[DK_TOKEN] if use_dk else None
            return TokenPlan(
                pause_ids=tuple(by_id[n] for n in pause_real),
                pause_tokens=tuple(pause_real),
                dk_id=by_id[dk_real] if dk_real is not None else None,
                dk_token=dk_real,
                source="unused",
                new_ids=(),
                num_rows=num_rows_needed,
                old_rows=min(old_len, num_rows),
            )

    missing = [n for n in wanted if n not in vocab]
    _add_special(tokenizer, missing)
    vocab = tokenizer_vocab(tokenizer)
    absent = [n for n in wanted if n not in vocab]
    if absent:
        raise RuntimeError(f"tokens {absent} could not be added to the tokenizer")
    by_name = {n: vocab[n] for n in wanted}
    new_ids = tuple(by_name[n] for n in missing)
    rows = max([num_rows, len(tokenizer)] + [i + 1 for i in by_name.values()])
    return _plan(pause_names, by_name, use_dk, "added", new_ids, rows, min(old_len, num_rows))


def _plan(pause_names, by_name, use_dk, source, new_ids, rows, old_rows, named=True) -> TokenPlan:
    return TokenPlan(
        pause_ids=tuple(by_name[n] for n in pause_names),
        pause_tokens=tuple(pause_names) if named else (),
        dk_id=by_name[DK_TOKEN] if use_dk else None,
        dk_token=DK_TOKEN if (use_dk and named) else None,
        source=source,
        new_ids=tuple(new_ids),
        num_rows=rows,
        old_rows=old_rows,
    )


# ----------------------------------------------------------------------- embeddings


@torch.no_grad()
def _mean_init(weight: torch.Tensor, rows: Sequence[int], old_rows: int) -> None:
    if not rows:
        return
    if old_rows > 0:
        mean = weight[:old_rows].float().mean(0)
    else:
        mean = torch.zeros_like(weight[0], dtype=torch.float32)
    idx = torch.tensor(list(rows), dtype=torch.long, device=weight.device)
    weight.index_copy_(0, idx, mean.to(weight.dtype).unsqueeze(0).expand(len(rows), -1).contiguous())


@torch.no_grad()
def _random_init(weight: torch.Tensor, rows: Sequence[int], old_rows: int) -> None:
    if not rows:
        return
    std = float(weight[:old_rows].float().std()) if old_rows > 1 else 0.02
    idx = torch.tensor(list(rows), dtype=torch.long, device=weight.device)
    fresh = torch.randn(len(rows), weight.shape[1], device=weight.device) * std
    weight.index_copy_(0, idx, fresh.to(weight.dtype))


NEW_ROW_INITS = ("mean", "random")


@torch.no_grad()
def apply_plan(hf_model, plan: TokenPlan, new_rows: str = "mean") -> None:
    """Grow the embeddings of ``hf_model`` to ``plan.num_rows`` and initialise new ids.

    ``new_rows="mean"`` sets each new row to the mean of the existing rows (a pretrained
    model); ``"random"`` draws them from a normal with the existing rows' standard deviation
    (a randomly initialised model), so distinct pauses start distinct.  Both the input
    embedding and the output projection (and its bias, if any) are handled; tied matrices are
    written once.
    """
    if new_rows not in NEW_ROW_INITS:
        raise ValueError(f"new_rows must be one of {NEW_ROW_INITS}, got {new_rows!r}")
    init = _mean_init if new_rows == "mean" else _random_init
    emb = hf_model.get_input_embeddings()
    if emb.weight.shape[0] < plan.num_rows:
        hf_model.resize_token_embeddings(plan.num_rows, mean_resizing=False)
        emb = hf_model.get_input_embeddings()
    init(emb.weight, plan.new_ids, plan.old_rows)
    out = hf_model.get_output_embeddings()
    if out is None:
        return
    if out.weight.shape[0] < plan.num_rows:
        raise RuntimeError(
            f"the output projection has {out.weight.shape[0]} rows after resizing, "
            f"{plan.num_rows} are needed"
        )
    if out.weight.data_ptr() != emb.weight.data_ptr():
        init(out.weight, plan.new_ids, plan.old_rows)
    bias = getattr(out, "bias", None)
    if bias is not None and plan.new_ids:
        idx = torch.tensor(plan.new_ids, dtype=torch.long, device=bias.device)
        fill = bias[: plan.old_rows].float().mean() if plan.old_rows else torch.zeros(())
        bias.index_fill_(0, idx, float(fill))


def check_tokenizer(tokenizer, settings) -> None:
    """Raise if ``tokenizer`` maps the settings' token strings to other ids."""
    names = list(zip(settings.pause_tokens, settings.pause_ids))
    if settings.dk_token is not None:
        names.append((settings.dk_token, settings.dk_id))
    if not names:
        return
    vocab = tokenizer_vocab(tokenizer)
    for name, idx in names:
        got = vocab.get(name)
        if got != idx:
            raise ValueError(
                f"the tokenizer maps {name!r} to {got} but the model uses id {idx} for it; pass the "
                "tokenizer saved with the model"
            )

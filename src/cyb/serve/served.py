"""The model as the server sees it: its name, tokenizer, EOS ids, the context a request may
fill, and prompts (text, ids, chat messages) turned into checked token ids."""

from __future__ import annotations

import torch

from ..data.tokenizer import encode_failure
from ..engine.layout import RowLayout
from ..generation.api import default_eos_ids
from ..generation.text import decode_fn, encode_prompt
from ..model import hf as _hf

#: the context when neither the options nor a smaller position limit set one
DEFAULT_MAX_MODEL_LEN = 2048


def position_limit(model) -> int | None:
    """Real tokens a request may fill (prompt plus new tokens) within the model's
    ``max_position_embeddings`` (:meth:`cyb.engine.layout.RowLayout.last_position`: the last new
    token is never fed), or None without a limit."""
    limit = getattr(_hf.text_config(model.config), "max_position_embeddings", None)
    if not isinstance(limit, int):
        return None
    layout = RowLayout.of(model.vocab, model.pause_visibility)
    n = limit // layout.num_steps + 1 if layout.advance else limit + 1
    assert layout.last_position(1, n - 1) < limit <= layout.last_position(1, n)
    return n


class ServedModel:
    """A :class:`cyb.PauseModel` behind the API.

    A pickled copy (what the engine's process sends to the HTTP process) has everything but the
    model: names, tokenizer, EOS ids, limits and what :meth:`describe` says.

    Args:
        model: the model, in eval mode on its device.
        name: the name clients send as ``model``.
        max_model_len: real tokens a request may fill (None: the position limit, at most
            :data:`DEFAULT_MAX_MODEL_LEN`); more than the position limit is refused.
        mode: the default mode (None: adaptive with dk, else fixed).
        chat_template: a Jinja chat template replacing the tokenizer's.
        aliases: other names accepted as ``model`` (the path it was loaded from).
        trained_on: ``(what, characters)`` for a model of a synthetic task that reads characters:
            the task (``"task addition (digits=3)"``) and every character its text had; a text
            prompt with another character is refused (the model never saw it in training).
            None: the model's own (:attr:`cyb.PauseModel.trained_on`).
    """

    def __init__(self, model, name: str, *, max_model_len: int | None = None, mode: str | None = None,
                 chat_template: str | None = None, aliases: tuple[str, ...] = (),
                 trained_on: tuple[str, str] | None = None) -> None:
        self.model = model
        self.trained_on = trained_on if trained_on is not None else getattr(model, "trained_on", None)
        self.name = name
        self.names = frozenset((name, *aliases))
        self.tokenizer = model.tokenizer
        self.decode = decode_fn(self.tokenizer)
        self.vocab = model.vocab
        self.num_steps = model.vocab.num_steps
        self.has_dk = model.vocab.dk_id is not None
        self.eos = frozenset(default_eos_ids(model))
        self._special = frozenset(model.vocab.special_ids)
        self.layout = RowLayout.of(model.vocab, model.pause_visibility)
        limit = position_limit(model)
        if max_model_len is None:
            max_model_len = DEFAULT_MAX_MODEL_LEN if limit is None else min(limit, DEFAULT_MAX_MODEL_LEN)
        elif limit is not None and max_model_len > limit:
            raise ValueError(f"max_model_len={max_model_len} is beyond the model's positions: a request may "
                             f"fill at most {limit} real tokens (max_position_embeddings)")
        self.max_model_len = max_model_len
        self.default_mode = mode or ("adaptive" if self.has_dk else "fixed")
        self.device = str(model.device)
        self._about = {"method": model.settings.method, "pause_visibility": model.pause_visibility}
        if chat_template is not None:
            if self.tokenizer is None:
                raise ValueError("a chat template needs a tokenizer, and the model has none")
            self.tokenizer.chat_template = chat_template

    @property
    def columns(self) -> int:
        """Cache columns one engine row needs for a request that fills the whole context."""
        return self.layout.columns_needed(1, self.max_model_len - 1)

    @property
    def has_chat_template(self) -> bool:
        return self.tokenizer is not None and bool(getattr(self.tokenizer, "chat_template", None))

    def describe(self) -> dict:
        """What ``/v1/models`` says of the model beyond its name."""
        return {"max_model_len": self.max_model_len, "num_steps": self.num_steps, **self._about,
                "has_dk": self.has_dk, "default_mode": self.default_mode}

    # ------------------------------------------------------------------ across processes
    def __getstate__(self) -> dict:
        """Everything but the model (it stays in the engine's process) and the decode closure."""
        state = dict(self.__dict__)
        state["model"] = None
        state.pop("decode", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.decode = decode_fn(self.tokenizer)

    # ------------------------------------------------------------------ prompts
    def check_ids(self, ids: list[int]) -> list[int]:
        """``ids`` when every one is a real token of the vocabulary; else the ValueError of
        :meth:`cyb.layout.PauseVocab.check_real_ids` (checked here without a tensor: cheap)."""
        if ids and (min(ids) < 0 or max(ids) >= self.vocab.vocab_size or not self._special.isdisjoint(ids)):
            self.vocab.check_real_ids(torch.tensor(ids, dtype=torch.long))
        return ids

    def encode(self, prompt, index: int = 0) -> list[int]:
        """Token ids of a prompt: text (special tokens such as BOS added as the tokenizer is
        configured) or a list of ids; ValueError for an empty one, text without a tokenizer or
        that the model cannot read (:func:`cyb.data.tokenizer.check_text`: characters it never
        saw, named), or ids that are not real tokens of the vocabulary."""
        if isinstance(prompt, str) and self.tokenizer is None:
            raise ValueError("the model has no tokenizer: send the prompt as a list of token ids")
        return self.check_ids(encode_prompt(self.tokenizer, prompt, index, trained_on=self.trained_on))

    def chat_ids(self, messages: list[dict]) -> list[int]:
        """Token ids of chat ``messages`` through the chat template, ending with the
        assistant's turn; ValueError without a tokenizer or template."""
        if self.tokenizer is None:
            raise ValueError("the model has no tokenizer, so chat messages cannot be encoded")
        if not self.has_chat_template:
            raise ValueError("the model's tokenizer has no chat template: use /v1/completions, or start "
                             "the server with --chat-template FILE")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        try:
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        except Exception as e:  # noqa: BLE001 - a Rust tokenizer raises a bare Exception
            raise encode_failure(self.tokenizer, text, "the messages", e) from None
        if not ids:
            raise ValueError("the chat template gave an empty prompt")
        return self.check_ids(ids)

    def text(self, ids: list[int]) -> str:
        """The text of ``ids`` without special tokens ("" without a tokenizer)."""
        return self.decode(ids) if self.decode is not None and ids else ""

    def token_string(self, token: int) -> str:
        """One token as text, special tokens included (``logprobs``' ``tokens``)."""
        if self.tokenizer is None:
            return f"<{token}>"
        return self.tokenizer.decode([token], skip_special_tokens=False)


__all__ = ["DEFAULT_MAX_MODEL_LEN", "ServedModel", "position_limit"]

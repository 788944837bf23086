"""lm-evaluation-harness model ``cyb``: downstream tasks scored with pauses and the CYB readout.

::

    import lm_eval
    from lm_eval.tasks import TaskManager
    from cyb.integrations.lm_eval import tasks_dir   # importing registers the model "cyb"

    results = lm_eval.simple_evaluate(
        model="cyb", model_args="pretrained=runs/cyb/final,device=cuda,batch_size=8",
        tasks=["hellaswag_local"],
        task_manager=TaskManager(include_path=str(tasks_dir()), metadata={"data_dir": "/data/eval"}))

or on the command line ``python -m cyb.integrations.lm_eval --model cyb --model_args ...`` (the
``lm_eval`` command's arguments; this entry point registers the model first, and its ``--help``
says how to use the model, the task folder and ``CYB_EVAL_DATA``: :mod:`cyb.integrations.harness_cli`).

Every request runs Recipe 1: ``M-1`` pauses after every real token of the context and of the
continuation (the paper's downstream evaluation inserts pauses in prompt and response).

* ``loglikelihood``: the sum over continuation tokens of each token's log-likelihood under the
  model's readout (:func:`token_log_likelihood`): for models with dk the CYB marginal
  ``log sum_i Pr(S=i | d) t_i`` (``omega`` one-hot on ``M``, ``gamma = 1``); without dk the
  log-probability at the last step (TBYS), which for ``M = 1`` is plain log-softmax (baseline).
  ``is_greedy``: the greedy sequential readout (:func:`cyb.decision.greedy_decision`) picks every
  continuation token.
* ``loglikelihood_rolling``: the same summed over disjoint windows of ``max_length`` tokens.
* ``generate_until``: :func:`cyb.generation.generate`, greedy sequential readout including dk
  (fixed mode by default), with the request's stop strings and ``max_gen_toks``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import defaultdict
from typing import Sequence

if __name__ == "__main__":  # python -m cyb.integrations.lm_eval: the harness's model is this module by name
    from cyb.integrations.harness_cli import main as _main

    sys.exit(_main(model_module="cyb.integrations.lm_eval"))

import torch
from tqdm import tqdm

from ..data.tokenizer import check_text, encode_failure
from ..extras import require as _require

_require("lm_eval", "the cyb model of lm-evaluation-harness (cyb.integrations.lm_eval)")
from lm_eval.api.model import LM  # noqa: E402
from lm_eval.api.registry import register_model  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402

from ..generation.registry import DECODERS, MODES, resolve_decoder
from ..generation.registry import DEFAULT as DEFAULT_DECODER
from ..model import PauseModel
from ..paths import looks_like_path
from ..runtime import resolve_device
from ..run_models import prepare
from ..model import hf as _hf
from .scoring import score_batch, token_log_likelihood
from .tasks import DATA_ENV, tasks_dir

__all__ = ["CybLM", "DATA_ENV", "MODES", "main", "tasks_dir", "token_log_likelihood"]

log = logging.getLogger(__name__)

DEFAULT_MAX_LENGTH = 2048
_GEN_OPTIONS = {"until", "max_gen_toks", "max_new_tokens", "do_sample", "temperature", "top_k", "top_p"}


def _named(request, index: int) -> str:
    """How an error names a request: its task and document where the harness says them."""
    task, doc = getattr(request, "task_name", None), getattr(request, "doc_id", None)
    if task is not None and doc is not None:
        return f"document {doc} of task {task}"
    return f"request {index}"


def _positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


class _Codec:
    """Text <-> ids for a Hugging Face tokenizer or a :class:`cyb.data.synthetic.CharTokenizer`.

    Text the model cannot read raises :class:`cyb.data.tokenizer.UnencodableText` (a ValueError)
    in one line naming what it is and the characters at fault, as every entry point does
    (:func:`cyb.data.tokenizer.check_text`; ``trained_on``: the model's synthetic task)."""

    def __init__(self, tokenizer, add_bos_token: bool | None, trained_on: tuple[str, str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.trained_on = trained_on
        self.is_hf = hasattr(tokenizer, "convert_ids_to_tokens")
        if self.is_hf:
            self.bos = tokenizer.bos_token_id
            self.eos = tokenizer.eos_token_id
        else:
            self.bos = getattr(tokenizer, "bos_id", None)
            self.eos = getattr(tokenizer, "eos_id", None)
        if add_bos_token is None:  # do what the tokenizer does by default (Gemma, Llama: BOS)
            add_bos_token = False
            if self.is_hf and self.bos is not None:
                ids = tokenizer("a", add_special_tokens=True)["input_ids"]
                add_bos_token = bool(ids) and ids[0] == self.bos
        if add_bos_token and self.bos is None:
            raise ValueError("add_bos_token=True but the tokenizer has no BOS token")
        self.add_bos = bool(add_bos_token)
        self.prefix = self.bos if self.bos is not None else self.eos
        if self.prefix is None:
            raise ValueError("the tokenizer has neither a BOS nor an EOS token to start an empty context")

    def encode(self, text: str, what: str = "the text") -> list[int]:
        """Ids of ``text`` (``what`` it is, for an error) without special tokens added."""
        check_text(text, what, tokenizer=self.tokenizer, trained_on=self.trained_on)
        try:
            if self.is_hf:
                return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            return list(self.tokenizer.encode(text))
        except Exception as e:  # noqa: BLE001 - a Rust tokenizer raises a bare Exception
            raise encode_failure(self.tokenizer, text, what, e) from None

    def context(self, text: str, what: str = "the context") -> list[int]:
        """Ids of a context: BOS first when ``add_bos``; never empty (the prefix token)."""
        ids = self.encode(text, what) if text else []
        if self.add_bos or not ids:
            ids = [self.prefix] + ids
        return ids

    def pair(self, context: str, continuation: str, what: str = "the request") -> tuple[list[int], list[int]]:
        """``(context ids, continuation ids)`` of a request (``what`` it is, for an error); spaces
        ending the context move to the continuation and the continuation's ids are those of the
        whole text after the context's (so a word boundary tokenises as it would in running text)."""
        check_text(context, f"the context of {what}", tokenizer=self.tokenizer, trained_on=self.trained_on)
        check_text(continuation, f"the continuation of {what}", tokenizer=self.tokenizer, trained_on=self.trained_on)
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        if not context:
            return self.context(""), self.encode(continuation, f"the continuation of {what}")
        ctx = self.encode(context, f"the context of {what}")
        whole = self.encode(context + continuation, what)
        cont = whole[len(ctx):]
        return ([self.prefix] + ctx) if self.add_bos else ctx, cont


@register_model("cyb")
class CybLM(LM):
    """A :class:`cyb.PauseModel` as an lm-evaluation-harness model (registered as ``cyb``).

    Args (``model_args``; strings from the command line are converted):
        pretrained: folder or hub name of a saved pause model, or a ``PauseModel`` (moved to
            ``device`` and put in eval mode).
        device: ``cpu``, ``cuda``, ``cuda:1``... (default: ``cuda`` when available).
        batch_size: loglikelihood requests per forward, and the prompts that decode at once in
            ``generate_until`` (the engine's slots: a finished prompt's slot goes to the next) (>= 1).
        max_batch_size: accepted for the harness's interface; unused.
        mode: ``fixed`` (every token gets its ``M-1`` pauses; the paper's inference) or
            ``adaptive`` (a pause only after dk) for ``generate_until``; log-likelihoods
            always use the fixed layout.
        dtype: parameter dtype when loading (``float32``, ``bfloat16``, ``float16``, ``auto``).
        max_length: real tokens per sequence; longer contexts are cut from the left (default:
            the model's ``max_position_embeddings``, ``// M`` with the ``advance`` position
            scheme, or 2048 when the config has none).
        max_gen_toks: default ``max_gen_toks`` of ``generate_until`` requests.
        add_bos_token: put BOS before every context (default: as the tokenizer does).
        num_steps: ``M`` for a plain Hugging Face model without ``cyb_pause.json``.
        attn_implementation: ``sdpa`` or ``eager``.
        seed: seed of the sampler when a request asks for sampling.
        decoder: the decode loop of ``generate_until`` (:class:`cyb.generation.GenerationConfig`):
            ``auto`` (the engine: CUDA graphs on CUDA; eager for sliding-window models),
            ``graph``, ``static`` or ``eager``.
    """

    def __init__(self, pretrained, device: str | None = None, batch_size=8, max_batch_size=None,
                 mode: str = "fixed", dtype: str | None = None, max_length: int | None = None,
                 max_gen_toks: int = 256, add_bos_token: bool | None = None,
                 num_steps: int | None = None, attn_implementation: str | None = None,
                 seed: int = 1234, decoder: str = DEFAULT_DECODER) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
        self._decoder = decoder
        if isinstance(batch_size, str) and batch_size.startswith("auto"):
            raise ValueError("batch_size='auto' is not supported by the cyb model; give an integer >= 1")
        self._batch_size = _positive_int("batch_size", batch_size)
        self._max_gen_toks = _positive_int("max_gen_toks", max_gen_toks)
        self._mode = mode
        self._seed = int(seed)
        if isinstance(pretrained, PauseModel):
            given = [n for n, v in (("dtype", dtype), ("num_steps", num_steps),
                                    ("attn_implementation", attn_implementation)) if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)} apply when loading a folder; pretrained is "
                                 "already a PauseModel")
            model = pretrained
        elif isinstance(pretrained, (str, os.PathLike)):
            if not os.path.exists(os.path.expanduser(str(pretrained))) and looks_like_path(str(pretrained)):
                raise FileNotFoundError(f"pretrained={pretrained!s} does not exist (give a folder written by "
                                        "cyb, such as a run's final/, or a hub name)")
            prepare(pretrained)  # a training checkpoint: the model it holds, written once into the cache
            model = PauseModel.from_pretrained(pretrained, num_steps=num_steps, torch_dtype=dtype,
                                               attn_implementation=attn_implementation)
        else:
            raise TypeError(f"pretrained must be a model folder, a hub name or a PauseModel, got "
                            f"{type(pretrained).__name__}")
        if model.tokenizer is None:
            raise ValueError(f"pretrained={pretrained!s} has no tokenizer saved with it; the harness "
                             "sends text")
        self._device = resolve_device(device, what="device")
        self._model = model.to(self._device).eval()
        resolve_decoder(self._model, decoder)  # a clear error now for graph off CUDA, say
        self._codec = _Codec(model.tokenizer, add_bos_token, getattr(model, "trained_on", None))
        limit = self._position_limit()
        if max_length is None:
            max_length = limit if limit is not None else DEFAULT_MAX_LENGTH
        self._max_length = _positive_int("max_length", max_length, minimum=2)
        if limit is not None and self._max_length > limit:
            raise ValueError(f"max_length={self._max_length} real tokens exceeds what the model's "
                             f"positions allow ({limit})")
        self._warned: set[str] = set()

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "CybLM":
        """Build from ``model_args``; the harness's own ``batch_size``/``device`` (the command
        line always sends its defaults) fill in only what ``model_args`` leaves out.  An option the
        model does not take raises a ValueError naming those it takes."""
        import inspect

        options = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
        unknown = sorted(set(arg_dict) - set(options))
        if unknown:
            raise ValueError(f"model_args: the cyb model takes no option {', '.join(unknown)}; its options: "
                             f"{', '.join(options)}")
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "CybLM":
        """Build from ``"pretrained=DIR,device=cpu,batch_size=8"`` (see :meth:`create_from_arg_obj`)."""
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # ------------------------------------------------------------------ properties
    @property
    def model(self) -> PauseModel:
        return self._model

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def max_length(self) -> int:
        """Real tokens per scored sequence (each takes ``M`` positions in the network)."""
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def prefix_token_id(self) -> int:
        """The token that stands for an empty context (BOS, else EOS)."""
        return self._codec.prefix

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self._model.tokenizer, "name_or_path", type(self._model.tokenizer).__name__))

    @property
    def has_dk(self) -> bool:
        return self._model.settings.dk_id is not None

    @property
    def readout_name(self) -> str:
        """How a token's log-likelihood is read out (recorded in the results' config)."""
        if self.has_dk:
            return "CYB marginal log sum_i Pr(S=i|d) t_i (omega one-hot on M, gamma = 1)"
        if self._model.num_steps > 1:
            return "log-probability at the last step (TBYS)"
        return "log-softmax (no pauses)"

    def get_model_info(self) -> dict:
        """What the harness records in ``results["config"]``."""
        s = self._model.settings
        return {
            "model_num_parameters": self._model.num_parameters(),
            "model_dtype": str(self._model.dtype),
            "cyb": {
                "method": s.method, "num_steps": s.num_steps, "dk_id": s.dk_id, "psi_dk": s.psi_dk,
                "position_scheme": s.position_scheme, "generation_mode": self._mode,
                "decoder": resolve_decoder(self._model, self._decoder),
                "loglikelihood_readout": self.readout_name, "max_length": self._max_length,
                "add_bos_token": self._codec.add_bos,
            },
        }

    def _position_limit(self) -> int | None:
        limit = getattr(_hf.text_config(self._model.config), "max_position_embeddings", None)
        if not isinstance(limit, int):
            return None
        if self._model.settings.position_scheme == "advance":
            return limit // self._model.num_steps
        return limit

    # ------------------------------------------------------------------ log-likelihood
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """``(log-likelihood of the continuation, is_greedy)`` per ``(context, continuation)``."""
        pairs = [self._codec.pair(*req.args[:2], _named(req, i)) for i, req in enumerate(requests)]
        results = self._loglikelihood_tokens(pairs, "loglikelihood", disable_tqdm)
        for req, res in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", req.args, res)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of each whole text, scored on disjoint windows of ``max_length`` tokens
        (the first conditioned on the prefix token, the others on the window before)."""
        windows, owners = [], []
        for r, req in enumerate(requests):
            tokens = self._codec.encode(req.args[0], f"the text of {_named(req, r)}")
            rolling = get_rolling_token_windows(token_list=tokens, prefix_token=self.prefix_token_id,
                                                max_seq_len=self._max_length, context_len=1)
            for window in map(make_disjoint_window, rolling):
                windows.append(window)
                owners.append(r)
        scores = self._loglikelihood_tokens(windows, "loglikelihood_rolling", disable_tqdm)
        totals = [0.0] * len(requests)
        for owner, (ll, _) in zip(owners, scores):
            totals[owner] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def _loglikelihood_tokens(self, pairs: Sequence[tuple[list[int], list[int]]], desc: str,
                              disable_tqdm: bool) -> list[tuple[float, bool]]:
        """Score ``(context ids, continuation ids)`` pairs in batches, longest first."""
        for ctx, cont in pairs:
            if not ctx:
                raise ValueError("a context must hold at least one token (the prefix token)")
            if len(cont) > self._max_length:
                raise ValueError(f"a continuation of {len(cont)} tokens does not fit max_length="
                                 f"{self._max_length}")
        order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
        out: list[tuple[float, bool] | None] = [None] * len(pairs)
        bar = tqdm(total=len(pairs), desc=f"cyb {desc}", disable=disable_tqdm or self.rank != 0)
        for start in range(0, len(order), self._batch_size):
            batch = order[start:start + self._batch_size]
            for i, res in zip(batch, self._score_batch([pairs[i] for i in batch])):
                out[i] = res
            bar.update(len(batch))
        bar.close()
        return out  # type: ignore[return-value]

    def _score_batch(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """One forward of the batch (left-padded, Recipe 1 layout), then every row's
        continuation blocks read out together (:func:`cyb.integrations.scoring.score_batch`)."""
        return score_batch(self._model, pairs, max_length=self._max_length)

    # ------------------------------------------------------------------ generation
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Continuation text of each ``(context, gen_kwargs)``, cut before the first stop string
        of ``until``; at most ``max_gen_toks`` tokens; EOS ends it too."""
        from ..generation import generate

        prepared = []
        for i, req in enumerate(requests):
            context, gen_kwargs = req.args[0], req.args[1]
            options = self._generation_options(gen_kwargs)
            budget = self._max_length - options["max_new_tokens"]
            if budget < 1:
                raise ValueError(f"max_gen_toks={options['max_new_tokens']} leaves no room for the "
                                 f"context within max_length={self._max_length}")
            ids = self._codec.context(context, f"the context of {_named(req, i)}")[-budget:]
            prepared.append((ids, options))
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, (_, options) in enumerate(prepared):
            groups[tuple(sorted(options.items()))].append(i)
        out: list[str | None] = [None] * len(requests)
        bar = tqdm(total=len(requests), desc="cyb generate_until", disable=disable_tqdm or self.rank != 0)
        for members in groups.values():  # one engine per group: rows come and go, batch_size at once
            options = prepared[members[0]][1]
            results = generate(self._model, [prepared[i][0] for i in members], mode=self._mode,
                               seed=self._seed, decoder=self._decoder, max_batch=self._batch_size,
                               on_token=lambda e: bar.update(1) if e.finished else None, **options)
            for i, res in zip(members, results):
                out[i] = res.text or ""
                self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
        bar.close()
        return out  # type: ignore[return-value]

    def _generation_options(self, gen_kwargs) -> dict:
        """A request's ``gen_kwargs`` as :class:`cyb.generation.GenerationConfig` fields."""
        kwargs = dict(gen_kwargs or {})
        until = kwargs.get("until")
        if until is None:
            until = []
        elif isinstance(until, str):
            until = [until]
        elif not isinstance(until, (list, tuple)):
            raise ValueError(f"gen_kwargs['until'] must be a string or a list of strings, got {until!r}")
        max_new = kwargs.get("max_gen_toks", kwargs.get("max_new_tokens", self._max_gen_toks))
        temperature = kwargs.get("temperature")
        sample = bool(kwargs.get("do_sample", False)) and (temperature is None or float(temperature) > 0)
        options = {"stop": tuple(s for s in until if s),
                   "max_new_tokens": _positive_int("max_gen_toks", max_new),
                   "sample": sample}
        if sample:
            options["temperature"] = 1.0 if temperature is None else float(temperature)
            if kwargs.get("top_k") is not None:
                options["top_k"] = int(kwargs["top_k"])
            if kwargs.get("top_p") is not None:
                options["top_p"] = float(kwargs["top_p"])
        ignored = sorted(set(kwargs) - _GEN_OPTIONS - self._warned)
        if ignored:
            self._warned.update(ignored)
            log.warning("cyb model: generation options %s are not supported and are ignored", ignored)
        return options


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cyb.integrations.lm_eval ARGS``: the ``lm_eval`` command line (same arguments)
    with the ``cyb`` model registered (:func:`cyb.integrations.harness_cli.main`)."""
    from .harness_cli import main as run

    return run(argv, model_module=__name__)

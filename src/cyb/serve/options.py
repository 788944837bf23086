"""What ``cyb serve`` is told: where to listen, which limits hold, the API key."""

from __future__ import annotations

import math
from dataclasses import dataclass

MODES = ("fixed", "adaptive")


@dataclass(frozen=True)
class ServeOptions:
    """How the server runs (validated on construction).

    Attributes:
        host: address to bind (``127.0.0.1``: this machine only).
        port: TCP port (0: a free one, printed at start).
        api_key: when set, every route but ``/health`` needs ``Authorization: Bearer KEY``.
        model_name: the name clients send as ``model`` (None: the MODEL argument's last part).
        max_model_len: real tokens a request may fill, prompt and ``max_tokens`` together
            (None: the model's position limit, at most 2048).
        slots: requests that decode at once (the engine's rows; None: 256 on CUDA, 64
            elsewhere); each holds only the cache blocks its request fills.
        cache_bytes: memory for the engine's KV cache (None: the engine's default, 60% of the
            free memory on CUDA, 2 GiB elsewhere).
        block_size: columns per block of the engine's KV cache (None: the engine's default).
        prefix_caching: requests whose prompts begin alike share the cached blocks of that
            beginning (None: the engine's default, on).
        step_budget: positions per decoding step, prompt chunks included: prompts are written
            inside the decoding steps (:attr:`cyb.engine.EngineOptions.step_budget`; None:
            by prefill forwards of their own).
        prefill_chunk: prompt columns one row writes per prefill forward at most
            (:attr:`cyb.engine.EngineOptions.prefill_chunk`; None: the engine's default).
        prefill_rows: a prefill forward computes at most ``prefill_rows x prefill_chunk``
            positions (:attr:`cyb.engine.EngineOptions.prefill_rows`; None: the engine's default).
        mode: the mode of requests that do not choose one (None: adaptive for models with dk,
            fixed for the others).
        max_body_bytes: the largest request body accepted.
        max_concurrency: requests handled at once; more are refused (503) until one ends.
        max_choices: choices one request may ask for (prompts x ``n``).
        grace_s: after SIGTERM, how long requests in flight may take to finish before they
            are cancelled.
        chat_template: a Jinja chat template replacing the tokenizer's (None: the tokenizer's).
        http_processes: processes that answer HTTP on the port, in front of one engine's
            process (Linux: the kernel spreads connections over them); each takes
            ``max_concurrency / http_processes`` requests at once.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    model_name: str | None = None
    max_model_len: int | None = None
    slots: int | None = None
    cache_bytes: int | None = None
    block_size: int | None = None
    prefix_caching: bool | None = None
    step_budget: int | None = None
    prefill_chunk: int | None = None
    prefill_rows: int | None = None
    mode: str | None = None
    max_body_bytes: int = 4 << 20
    max_concurrency: int = 1024
    max_choices: int = 256
    grace_s: float = 30.0
    chat_template: str | None = None
    http_processes: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an integer in [0, 65535], got {self.port!r}")
        for name in ("max_body_bytes", "max_concurrency", "max_choices", "http_processes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("max_model_len", "slots", "cache_bytes", "step_budget", "prefill_chunk", "prefill_rows"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 (a prompt token and a new one), got {self.max_model_len}")
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if isinstance(self.grace_s, bool) or not isinstance(self.grace_s, (int, float)) \
                or not math.isfinite(self.grace_s) or self.grace_s < 0:
            raise ValueError(f"grace_s must be a finite number of seconds >= 0, got {self.grace_s!r}")
        if self.http_processes > self.max_concurrency:
            raise ValueError(f"http_processes ({self.http_processes}) must not exceed max_concurrency "
                             f"({self.max_concurrency}): each process takes a share of it")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty")
        b = self.block_size
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= 256 or b & (b - 1)):
            raise ValueError(f"block_size must be a power of two from 1 to 256 or None, got {b!r}")
        if not isinstance(self.prefix_caching, (bool, type(None))):
            raise ValueError(f"prefix_caching must be True, False or None, got {self.prefix_caching!r}")

    @property
    def engine_options(self) -> dict:
        """The :class:`cyb.engine.EngineOptions` fields these options set (beyond slots and cache
        memory)."""
        given = {"block_size": self.block_size, "prefix_caching": self.prefix_caching,
                 "step_budget": self.step_budget, "prefill_chunk": self.prefill_chunk,
                 "prefill_rows": self.prefill_rows}
        return {k: v for k, v in given.items() if v is not None}


    @property
    def concurrency_per_process(self) -> int:
        """Requests one HTTP process handles at once: its share of ``max_concurrency``."""
        return -(-self.max_concurrency // self.http_processes)


__all__ = ["MODES", "ServeOptions"]

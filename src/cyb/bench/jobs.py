"""The serving jobs measured at real model sizes: seeded prompts (token ids) and answer lengths.

Every job runs with ``max_model_len`` 4,096 and ``C`` = 256 requests in flight, EOS ignored (each
answer decodes to its length):

* ``mixed``: the serve benchmark's job: prompts of 16-512 tokens, answers of 8-256;
* ``eval``: evaluation-like: prompts of 1,000-3,000 tokens, answers of 1-32;
* ``fewshot``: 2,000 requests that share a 1,500-token prefix (the few-shot examples), each with
  50-200 tokens of its own after it, answers of 1-32.

``quick`` jobs keep each job's form at tiny lengths (a CPU smoke run).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: real tokens a request may hold at most, prompt and answer together
MAX_MODEL_LEN = 4096
#: requests in flight
CONCURRENCY = 256


@dataclass(frozen=True)
class JobSpec:
    """The form of a job.

    Attributes:
        requests: how many requests.
        prompt: (low, high) prompt tokens of each request's own (after the shared prefix), inclusive.
        answer: (low, high) answer tokens, inclusive.
        prefix: tokens every prompt starts with (0: none shared).
        max_model_len: real tokens a request may hold.
        concurrency: requests in flight.
    """

    requests: int
    prompt: tuple[int, int]
    answer: tuple[int, int]
    prefix: int = 0
    max_model_len: int = MAX_MODEL_LEN
    concurrency: int = CONCURRENCY

    def validate(self, name: str) -> "JobSpec":
        for field, (lo, hi) in (("prompt", self.prompt), ("answer", self.answer)):
            if not 1 <= lo <= hi:
                raise ValueError(f"job {name}: {field} must be (low, high) with 1 <= low <= high, got {(lo, hi)}")
        if self.requests < 1 or self.concurrency < 1 or self.prefix < 0:
            raise ValueError(f"job {name}: requests and concurrency must be >= 1 and prefix >= 0, got "
                             f"{self.requests}, {self.concurrency}, {self.prefix}")
        longest = self.prefix + self.prompt[1] + self.answer[1]
        if longest > self.max_model_len:
            raise ValueError(f"job {name}: its longest request holds {longest} tokens, over max_model_len "
                             f"{self.max_model_len}")
        return self


JOBS: dict[str, JobSpec] = {
    "mixed": JobSpec(512, (16, 512), (8, 256)),
    "eval": JobSpec(512, (1000, 3000), (1, 32)),
    "fewshot": JobSpec(2000, (50, 200), (1, 32), prefix=1500),
}
QUICK_JOBS: dict[str, JobSpec] = {
    "mixed": JobSpec(12, (2, 12), (2, 8), max_model_len=64, concurrency=4),
    "eval": JobSpec(8, (20, 40), (1, 4), max_model_len=64, concurrency=4),
    "fewshot": JobSpec(16, (2, 8), (1, 4), prefix=24, max_model_len=64, concurrency=4),
}


@dataclass(frozen=True)
class Job:
    """A job's requests: ``items`` are ``(prompt ids, answer length)`` pairs."""

    name: str
    spec: JobSpec
    items: list

    @property
    def prompts(self) -> list[list[int]]:
        return [p for p, _ in self.items]

    @property
    def answers(self) -> list[int]:
        return [n for _, n in self.items]

    def summary(self) -> dict:
        """The job's form and its totals (for the JSON of a run)."""
        lengths = [len(p) for p, _ in self.items]
        return {"name": self.name, "requests": len(self.items), "prompt_range": list(self.spec.prompt),
                "answer_range": list(self.spec.answer), "shared_prefix": self.spec.prefix,
                "max_model_len": self.spec.max_model_len, "concurrency": self.spec.concurrency,
                "prompt_tokens": sum(lengths), "answer_tokens": sum(self.answers),
                "mean_prompt": sum(lengths) / len(lengths), "mean_answer": sum(self.answers) / len(lengths)}


def make_job(name: str, id_limit: int, *, quick: bool = False, requests: int | None = None, seed: int = 0) -> Job:
    """Job ``name`` (:data:`JOBS`, or :data:`QUICK_JOBS` with ``quick``) with ids in
    ``[0, id_limit)``; ``requests`` overrides its count.  The same name, limit, count and seed give
    the same requests."""
    table = QUICK_JOBS if quick else JOBS
    if name not in table:
        raise ValueError(f"job must be one of {', '.join(table)}, got {name!r}")
    spec = table[name]
    if requests is not None:
        spec = JobSpec(requests, spec.prompt, spec.answer, spec.prefix, spec.max_model_len, spec.concurrency)
    spec.validate(name)
    g = torch.Generator().manual_seed(seed + 1000 * list(table).index(name))
    n = spec.requests
    own = torch.randint(spec.prompt[0], spec.prompt[1] + 1, (n,), generator=g).tolist()
    answers = torch.randint(spec.answer[0], spec.answer[1] + 1, (n,), generator=g).tolist()
    prefix = torch.randint(0, id_limit, (spec.prefix,), generator=g).tolist()
    items = [(prefix + torch.randint(0, id_limit, (k,), generator=g).tolist(), a) for k, a in zip(own, answers)]
    return Job(name, spec, items)


__all__ = ["CONCURRENCY", "JOBS", "MAX_MODEL_LEN", "QUICK_JOBS", "Job", "JobSpec", "make_job"]

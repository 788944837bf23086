"""lm-evaluation-harness's ``local-completions`` model against ``cyb serve``: the same scores as
the in-process ``cyb`` model, on a loglikelihood task and a generate-until task.

The harness finds the server's tokenizer routes on its own (its remote tokenizer), so it needs
no copy of the tokenizer; the in-process model reads the saved folder.
"""

from __future__ import annotations

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from lm_eval import simple_evaluate  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

pytest.importorskip("lm_eval.models.openai_completions")  # registers local-completions (needs tenacity)

from cyb.integrations.lm_eval import tasks_dir  # noqa: E402
from serve_helpers import NAME, pause_model, running, tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TASKS = ["cyb_tiny_mc", "cyb_tiny_gen"]


def _evaluate(model: str, model_args: str) -> dict:
    manager = TaskManager(include_path=str(tasks_dir()), include_defaults=False)
    return simple_evaluate(model=model, model_args=model_args, tasks=TASKS, task_manager=manager,
                           bootstrap_iters=0, log_samples=True)


def test_local_completions_scores_equal_the_in_process_model(tmp_path_factory):
    tok = tokenizer(tmp_path_factory.mktemp("tok"))
    pm = pause_model(tok)
    folder = pm.save_pretrained(tmp_path_factory.mktemp("model"))
    local = _evaluate("cyb", f"pretrained={folder},device=cpu,batch_size=4,mode=adaptive")
    with running(pm) as srv:
        served = _evaluate("local-completions", f"base_url={srv.url}/v1/completions,model={NAME},batch_size=4,"
                                                "num_concurrent=1,max_retries=1,tokenized_requests=True")
    for task in TASKS:
        want, got = local["results"][task], served["results"][task]
        for key, value in want.items():
            if isinstance(value, float) and "stderr" not in key:
                assert got[key] == pytest.approx(value, abs=1e-4), (task, key)
    # every request's score, to the 4th decimal
    for a, b in zip(local["samples"]["cyb_tiny_mc"], served["samples"]["cyb_tiny_mc"]):
        assert a["arguments"] == b["arguments"]
        assert [float(r[0][0]) for r in a["resps"]] == pytest.approx([float(r[0][0]) for r in b["resps"]], abs=1e-4)
    texts = [s["resps"][0][0] for s in local["samples"]["cyb_tiny_gen"]]
    assert [s["resps"][0][0] for s in served["samples"]["cyb_tiny_gen"]] == texts

"""HellaSwag documents: the query and the four endings, cleaned of WikiHow markup."""

import re

from cyb.integrations.tasks import load_local as load  # noqa: F401  (the task's custom_dataset)


def preprocess(text: str) -> str:
    """Strip, turn `` [title]`` into a sentence break, drop other ``[...]`` markup."""
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def process_docs(dataset):
    """Add ``query`` (activity label and context), ``choices`` (endings) and ``gold``."""

    def _process(doc):
        ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
        return {
            "query": preprocess(doc["activity_label"] + ": " + ctx),
            "choices": [preprocess(ending) for ending in doc["endings"]],
            "gold": int(doc["label"]),
        }

    return dataset.map(_process)

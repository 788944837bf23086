"""The tiny shipped tasks' documents (``data/<task>_<split>.jsonl`` beside this file)."""

from cyb.integrations.tasks import load_tiny as load  # noqa: F401  (the tasks' custom_dataset)

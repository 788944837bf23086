"""MMLU documents of one subject from the local data folder (one file for all subjects)."""

from cyb.integrations.tasks import load_local as load  # noqa: F401  (the task's custom_dataset)

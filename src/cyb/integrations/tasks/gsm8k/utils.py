"""GSM8K test documents from the local data folder."""

from cyb.integrations.tasks import load_local as load  # noqa: F401  (the task's custom_dataset)

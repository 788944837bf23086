"""Bridges to other tools.

* :mod:`cyb.integrations.lm_eval`: the lm-evaluation-harness model ``cyb`` (needs the ``eval``
  extra; importing the module registers the model) and :func:`~cyb.integrations.lm_eval.tasks_dir`.
* :mod:`cyb.integrations.tasks`: offline task definitions (HellaSwag, MMLU, GSM8K CoT from local
  JSON files, and tiny shipped tasks) to pass as ``--include_path``.
* :mod:`cyb.integrations.vllm`: the vLLM plugin that serves shared-pause models (``vllm serve
  RUN_FOLDER``; vLLM loads it through its ``vllm.general_plugins`` entry point).

Nothing is imported here, so ``import cyb.integrations`` never needs the optional packages.
"""

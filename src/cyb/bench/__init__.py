"""Benchmarks behind ``cyb bench loss|train|decode|memory``.

* :mod:`cyb.bench.timing`: CUDA-event timing, warm-up, median of repeats, peak memory, OOM
  handling, the environment record, atomic JSON output, a wall-clock budget.
* :mod:`cyb.bench.flops`: the FLOP count of a training step and MFU.
* :mod:`cyb.bench.models`: the benchmark models (a Llama of a given shape, built from a config),
  their pause settings (pause/dk ids at the top of the vocabulary), and the decode benchmark's
  spread weights and adaptive fixture.
* :mod:`cyb.bench.train_step`: one optimiser step of each training method (baseline, TBYS with
  the Hugging Face loss or Liger, CYB naive or fused), eager or with compiled decoder layers.
* :mod:`cyb.bench.decode`: decode latency and throughput, M = 4 against M = 1 (the library
  decoder and the CUDA-graph decoder of :mod:`cyb.generation.static`).
* :mod:`cyb.bench.loss`: the readout and loss alone, naive, fused, plain cross-entropy and Liger.
* :mod:`cyb.bench.memory`: peak memory and tokens/s of ``cyb train`` on real-size shapes (full
  fine-tuning or LoRA, with or without gradient checkpointing), one process per configuration,
  beside the estimate of :mod:`cyb.memory_estimate`.
* :mod:`cyb.bench.markdown`: the Markdown tables of the results (printed by ``cyb bench``, used
  for docs/record/benchmarks/).
* Serving at real sizes (``benchmarks/serve_sizes.py``): :mod:`cyb.bench.jobs` (the mixed,
  evaluation-like and few-shot jobs), :mod:`cyb.bench.engine_features` (engine options and
  counters not every engine has), :mod:`cyb.bench.size_runs` (a job through the engine, its
  ceiling, batch 1, preemption), :mod:`cyb.bench.hf_anchor` (transformers' continuous batching),
  :mod:`cyb.bench.size_serve` (the job through ``cyb serve``) and :mod:`cyb.bench.size_goals`
  (the goals as MET / MISSED lines); the named model shapes are in :mod:`cyb.bench.models`.

Everything runs on CPU with tiny shapes (``quick=True``) so the code paths can be tested
without a GPU; numbers only mean something on the GPU.
"""

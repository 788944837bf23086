"""A PauseTrainer run for tests/test_integrations_transformers.py, to start under torchrun:
``python hf_trainer_run.py OUT_DIR`` trains a tiny model built from a fixed seed for 3 steps of
8 rows (2 micro-batches per process and step at one process, 1 at two) and writes the logged
rows to OUT_DIR/log_history.json on the first process."""

from __future__ import annotations

import json
import os
import sys


def main(out: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, TrainingArguments

    from cyb.data.synthetic import CharTokenizer
    from cyb.integrations.transformers import PauseTrainer, with_pauses

    torch.set_num_threads(1)
    tok = CharTokenizer().to_hf()
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=128))
    model = with_pauses(hf, tok, method="cyb", num_steps=3)
    g = torch.Generator().manual_seed(1)
    examples = []
    for i in range(24):
        n = 6 + i % 5  # rows of different lengths: padding, and micro-batches with different target counts
        ids = torch.randint(3, 20, (n,), generator=g).tolist()
        examples.append({"input_ids": ids, "labels": [-100] * 2 + ids[2:]})
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = TrainingArguments(out, per_device_train_batch_size=4 // world, gradient_accumulation_steps=2, max_steps=3,
                             learning_rate=1e-2, lr_scheduler_type="constant", optim="adamw_torch", logging_steps=1,
                             save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
                             train_sampling_strategy="sequential", dataloader_num_workers=0)
    trainer = PauseTrainer(model=model, args=args, train_dataset=examples)
    trainer.train()
    if trainer.is_world_process_zero():
        with open(os.path.join(out, "log_history.json"), "w") as f:
            json.dump(trainer.state.log_history, f)


if __name__ == "__main__":
    main(sys.argv[1])

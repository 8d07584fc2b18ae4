"""The HF Trainer over a two-source Mixture under torchrun (for tests/test_source_losses_ranks.py): GA 2,
one epoch, a log line per optimizer step; rank 0 writes the Trainer's log history, every rank the rows of
each micro-batch it trained.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/_hf_mixture_run.py OUT
"""

from __future__ import annotations

import json
import os
import sys

import datasets
import dflash_batch as db
import torch
import transformers
from dflash_batch.hf import BucketTrainer


def rows(first: int, count: int, longest: int) -> datasets.Dataset:
    ids = [[1 + r // 100, 1 + r % 100] + [3] * ((r * 7) % longest) for r in range(first, first + count)]
    return datasets.Dataset.from_dict({"input_ids": ids})


def main() -> None:
    out = sys.argv[1]
    torch.manual_seed(0)
    chat, code = rows(0, 90, 20), rows(90, 60, 40)
    mix = db.Mixture({"chat": (db.TokenStore(chat), 0.2), "code": (db.TokenStore(code), 0.8)}, unit="samples")
    seen: list[tuple[int, list[int]]] = []

    class Recording(BucketTrainer):
        def training_step(self, model, inputs, *args, **kwargs):
            ids = inputs["input_ids"]
            seen.append([int(ids[r, 0] - 1) * 100 + int(ids[r, 1]) - 1 for r in range(len(ids))])
            return super().training_step(model, inputs, *args, **kwargs)

    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2,
    )  # fmt: skip
    args = transformers.TrainingArguments(
        output_dir=out, num_train_epochs=1, gradient_accumulation_steps=2, logging_steps=1, report_to=[],
        use_cpu=True, save_strategy="no", ddp_backend="gloo",
    )  # fmt: skip
    trainer = Recording(
        model=transformers.LlamaForCausalLM(config), args=args, store=mix, sampler={"max_tokens": 96, "seed": 3},
        train_dataset=datasets.concatenate_datasets([chat, code]),
    )  # fmt: skip
    trainer.train()
    rank = int(os.environ.get("RANK", "0"))
    record = {"rank": rank, "micro_batches": seen, "steps": len(trainer.bucket_sampler)}
    if rank == 0:
        record["log"] = trainer.state.log_history
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()

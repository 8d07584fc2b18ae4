"""The HF Trainer over a two-source Mixture under torchrun (for tests/adapters/test_source_losses_ranks.py): GA 2,
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
from _hf_rows import rows, rows_of, tiny_llama
from dflash_batch.hf import BucketTrainer


def main() -> None:
    out = sys.argv[1]
    torch.manual_seed(0)
    chat, code = rows(0, 90, 20), rows(90, 60, 40)
    mix = db.Mixture({"chat": (db.TokenStore(chat), 0.2), "code": (db.TokenStore(code), 0.8)}, unit="samples")
    seen: list[tuple[int, list[int]]] = []

    class Recording(BucketTrainer):
        def training_step(self, model, inputs, *args, **kwargs):
            seen.append(rows_of(inputs["input_ids"]))
            return super().training_step(model, inputs, *args, **kwargs)

    args = transformers.TrainingArguments(
        output_dir=out, num_train_epochs=1, gradient_accumulation_steps=2, logging_steps=1, report_to=[],
        use_cpu=True, save_strategy="no", ddp_backend="gloo",
    )  # fmt: skip
    trainer = Recording(
        model=tiny_llama(), args=args, store=mix, sampler={"max_tokens": 96, "seed": 3},
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

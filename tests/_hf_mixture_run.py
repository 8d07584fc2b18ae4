"""The HF Trainer over a two-source Mixture under torchrun (for tests/adapters/test_source_losses_ranks.py): GA 2,
one epoch, a log line per optimizer step; rank 0 writes the Trainer's log history, every rank the rows of
each micro-batch it trained.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/_hf_mixture_run.py OUT
"""

from __future__ import annotations

import json
import os
import sys

import dflash_batch as db
import torch
from _hf_rows import rows, train_recording


def main() -> None:
    out = sys.argv[1]
    torch.manual_seed(0)
    chat, code = rows(0, 90, 20), rows(90, 60, 40)
    mix = db.Mixture({"chat": (db.TokenStore(chat), 0.2), "code": (db.TokenStore(code), 0.8)}, unit="samples")
    trainer, seen = train_recording(mix, [chat, code], out, epochs=1, max_tokens=96, ddp_backend="gloo")
    rank = int(os.environ.get("RANK", "0"))
    record = {"rank": rank, "micro_batches": [batch for _, batch in seen], "steps": len(trainer.bucket_sampler)}
    if rank == 0:
        record["log"] = trainer.state.log_history
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main()

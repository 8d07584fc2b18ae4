"""accelerate as users run it, for tests/adapters/test_accelerate.py (under torchrun): ``accelerator.prepare`` on a
``DataLoader(hf_dataset, batch_sampler=batch_sampler(sampler), collate_fn=db.Collator())`` and a
``db.Loader`` wrapped by ``dflash_batch.adapters.accelerate.loader``, two epochs each; every batch's rows
are appended to a JSON-lines record per rank. The bare sampler, and one planned for other ranks, are
refused when they start.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/_accelerate_run.py DATA RECORD
"""

from __future__ import annotations

import json
import sys

import datasets
import dflash_batch as db
from _trainer_run import leave, row_ids
from accelerate import Accelerator
from dflash_batch.adapters.accelerate import batch_sampler, loader
from torch.utils.data import DataLoader


def main() -> None:
    data, record = sys.argv[1], sys.argv[2]
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    out = open(f"{record}.{rank}", "w")

    def write(**line):
        out.write(json.dumps({"rank": rank, **line}) + "\n")
        out.flush()

    store = db.TokenStore(data)
    hf = datasets.load_from_disk(data)
    sampler = db.BucketSampler(store.lengths(), max_tokens=128, seed=5)
    prepared = accelerator.prepare(DataLoader(hf, batch_sampler=batch_sampler(sampler), collate_fn=db.Collator()))
    write(kind="dataloader_len", value=len(prepared))
    for epoch in range(2):  # the epoch advances by itself: DataLoaderShard counts its iterations
        for batch in prepared:
            write(kind="dataloader", epoch=epoch, rows=row_ids(batch))
    prepared.set_epoch(5)  # and an explicit set_epoch reaches the sampler
    for batch in prepared:
        write(kind="dataloader", epoch=5, rows=row_ids(batch))

    accelerated = accelerator.prepare(
        loader(db.Loader(store, db.BucketSampler(store.lengths(), max_tokens=128, seed=5)))
    )
    for epoch in range(2):
        accelerated.set_epoch(epoch)
        for batch in accelerated:
            write(kind="loader", epoch=epoch, rows=row_ids(batch))

    for kind, given in (
        ("one_rank", batch_sampler(db.BucketSampler(store.lengths(), max_tokens=128, seed=5, world_size=1, rank=0))),
        ("bare", db.BucketSampler(store.lengths(), max_tokens=128, seed=5)),
    ):
        try:
            next(iter(accelerator.prepare(DataLoader(hf, batch_sampler=given, collate_fn=db.Collator()))))
            write(kind=kind, error=None)
        except db.PlanError as error:
            write(kind=kind, error=str(error))
    out.close()
    leave()


if __name__ == "__main__":
    main()

"""A plain PyTorch training loop on several processes with dflash_batch, on the CPU:

    torchrun --standalone --nproc_per_node=2 examples/train_ddp.py --steps 20

Each rank builds the same sampler (world size and rank come from torch.distributed), gets its own share of
every epoch's batches from the Loader, and trains a tiny causal LM under DDP. The sampler checks at each
epoch start that all ranks agree on the plan, and a checkpoint's ``state_dict`` resumes exactly.
"""

from __future__ import annotations

import argparse
import tempfile

import dflash_batch as db
import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in all")
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun sets the rank, world size and rendezvous
    rank = dist.get_rank()

    # A tokenized dataset on disk, written once by rank 0 (any datasets.save_to_disk directory works).
    directory = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(directory)
    path = directory[0] + "/data.arrow"
    if rank == 0:
        import numpy as np
        import pyarrow as pa

        lengths = db.seed_workload(args.samples, seed=0) // 64 + 1  # short rows for a CPU demo
        rng = np.random.default_rng(0)
        rows = [rng.integers(1, 255, n) for n in lengths]
        table = pa.table({"input_ids": pa.array(rows, type=pa.list_(pa.int32()))})
        with pa.ipc.new_file(path, table.schema) as writer:
            writer.write_table(table)
    dist.barrier()

    store = db.TokenStore(path)
    sampler = db.BucketSampler(store.lengths(), max_tokens=512, seed=0, accumulation=1)
    embed_dim = 32
    model = torch.nn.Sequential(torch.nn.Embedding(256, embed_dim), torch.nn.Linear(embed_dim, 256))
    model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    step = 0
    with db.Loader(store, sampler, prefetch=2) as loader:
        epoch = 0
        while step < args.steps:
            loader.set_epoch(epoch)
            for batch in loader:
                logits = model(batch["input_ids"])
                loss = torch.nn.functional.cross_entropy(
                    logits[:, :-1].reshape(-1, 256), batch["labels"][:, 1:].reshape(-1), ignore_index=-100
                )
                optimizer.zero_grad()
                loss.backward()  # DDP all-reduces gradients: every rank runs the same number of steps
                optimizer.step()
                step += 1
                if step >= args.steps:
                    break
            epoch += 1
        state = loader.state_dict()
    if rank == 0:
        print(f"trained {step} steps on {dist.get_world_size()} ranks; last loss {loss.item():.3f}; state {state}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

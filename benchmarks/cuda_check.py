"""The Loader on a real GPU: pinned slots, copies overlapped with compute, device tensors correct.

    python benchmarks/cuda_check.py              # needs CUDA; about a minute
    python benchmarks/cuda_check.py --rows 50000

Checks, in order (each prints one line; any failure exits 1):
  1. the ring's host slots are pinned and the Loader's tensors live on the GPU;
  2. every device batch of one epoch equals ``db.collate`` of the same indices on the host;
  3. overlap: with a matmul "training step" on the default stream, an epoch through the Loader takes
     about as long as the compute alone — the host-to-device copies run on the side stream, timed with
     CUDA events — and the side stream's copy time is reported;
  4. a slot is rewritten only after its copy completed: device batches kept across steps stay equal to
     their host reference.
Exits with status 2 and a message where CUDA is not available.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import dflash_batch as db
import numpy as np


def make_store(rows: int) -> db.TokenStore:
    import pyarrow as pa

    lengths = db.seed_workload(rows).astype(np.int64)
    offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = (np.arange(offsets[-1], dtype=np.int64) % 32_000).astype(np.int32)
    table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))})
    path = tempfile.mkdtemp() + "/tokens.arrow"
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=1000):
            writer.write_batch(batch)
    return db.TokenStore(path)


def fail(message: str) -> None:
    print(f"FAIL: {message}")
    sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("cuda_check: CUDA is not available here; run this on a machine with a GPU")
        sys.exit(2)
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}")
    store = make_store(args.rows)
    sampler = db.BucketSampler(store.lengths(), max_tokens=16384, seed=0)
    loader = db.Loader(store, sampler, device=device, prefetch=2)

    # 1. pinned slots, device tensors
    iterator = iter(loader)
    first = next(iterator)
    slots = loader._pipeline._slots
    pinned = all(t.is_pinned() for slot in slots for t in slot["torch"].values())
    on_gpu = all(t.device.type == "cuda" for t in first.values())
    print(
        f"1. slots pinned: {pinned}; batch on {first['input_ids'].device}; ring {loader.memory_bytes / 2**20:.1f} MiB"
    )
    if not (pinned and on_gpu):
        fail("slots must be pinned and batches on the GPU")
    loader.close()

    # 2. correctness of every device batch of (part of) an epoch
    for step, (indices, batch) in enumerate(zip(sampler, loader, strict=False)):
        if step == args.steps:
            break
        expected = db.collate(store, indices)
        for key, value in expected.items():
            if not torch.equal(batch[key].cpu(), torch.from_numpy(value)):
                fail(f"step {step}: {key} differs from the host collation")
    print(f"2. {min(args.steps, len(sampler))} device batches equal db.collate on the host")

    # 3. overlap: compute on the default stream while the Loader copies on its side stream
    weight = torch.randn(4096, 4096, device=device)

    def compute() -> None:
        x = torch.randn(512, 4096, device=device)
        for _ in range(8):
            x = x @ weight

    start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start_event.record()
    for _ in range(args.steps):
        compute()
    end_event.record()
    torch.cuda.synchronize()
    compute_ms = start_event.elapsed_time(end_event)

    copy_events = []
    transfer = loader._transfer
    original_send = transfer.send

    def timed_send(index, tensors, shape):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record(transfer.stream)
        payload = original_send(index, tensors, shape)
        end.record(transfer.stream)
        copy_events.append((begin, end))
        return payload

    transfer.send = timed_send
    start_event.record()
    wall = time.perf_counter()
    for step, batch in enumerate(loader):
        if step == args.steps:
            break
        compute()
        batch["input_ids"].sum()  # the step reads its batch on the default stream
    end_event.record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - wall
    transfer.send = original_send
    both_ms = start_event.elapsed_time(end_event)
    copy_ms = sum(begin.elapsed_time(end) for begin, end in copy_events)
    print(
        f"3. {args.steps} steps: compute alone {compute_ms:.1f} ms, compute + Loader {both_ms:.1f} ms "
        f"({both_ms / compute_ms:.2f}×), side-stream copies {copy_ms:.1f} ms in all, wall {wall * 1e3:.0f} ms"
    )
    if both_ms > 1.25 * compute_ms + 5:
        fail("copies did not overlap with compute (more than 25% slower than compute alone)")

    # 4. batches kept across steps stay intact (slots are rewritten only after their copy completed)
    kept, references = [], []
    for step, (indices, batch) in enumerate(zip(sampler, loader, strict=False)):
        if step == 20:
            break
        kept.append(batch)
        references.append(db.collate(store, indices))
    torch.cuda.synchronize()
    for step, (batch, expected) in enumerate(zip(kept, references, strict=True)):
        if not all(torch.equal(batch[k].cpu(), torch.from_numpy(v)) for k, v in expected.items()):
            fail(f"batch {step} changed after later batches were loaded")
    print("4. 20 device batches kept across steps are unchanged")
    loader.close()
    print("cuda_check: all checks passed")


if __name__ == "__main__":
    main()

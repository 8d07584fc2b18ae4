"""Extreme values never take the process down: each case returns or raises a Python exception.

The cases run in a child process whose address space is capped (``RLIMIT_AS``), so an allocation sized
by a bad value fails there instead of succeeding on a large machine: Python then raises ``MemoryError``,
while an infallible Rust allocation aborts the child, which fails the test. Each case once aborted or
got the process killed (a table of every length up to 2^32, a heap of 2^31 ranks, 34 GB of padded
arrays, an overflowing room class, billions of truncated pieces).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

resource = pytest.importorskip("resource")  # POSIX only

LIMIT = 4 << 30  # bytes of address space for the child: the cases need far less when they behave

CHILD = textwrap.dedent(
    """
    import resource, sys, tempfile
    resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
    import numpy as np
    import dflash_batch as db
    from dflash_batch.tools import metrics

    BIG = np.array([2**32 - 6, 3, 2**32 - 2_000_000, 7, 10**6], dtype=np.uint32)
    EXPECTED = (db.PlanError, ValueError, TypeError, MemoryError, IndexError)

    def padded_stats():
        return db.BucketSampler(BIG, max_tokens=2**40, threads=2).plan(0).stats()["window_tv"]

    def packed_stats():
        return db.BucketSampler(BIG, max_tokens=2**32 - 1, mode="packed").plan(0).stats()["utilization"]

    def packed_bucketed():
        return db.BucketSampler(BIG, max_tokens=2**32 - 1, mode="packed", bucketed=True).plan(0).stats()

    def packed_over_u32():
        return db.BucketSampler(BIG, max_tokens=2**32, mode="packed")

    def huge_world():
        return db.BucketSampler(BIG, max_tokens=2**40, world_size=2**31, rank=0).plan(0)

    def huge_world_drop_last():
        return len(db.BucketSampler(BIG, max_tokens=2**40, world_size=2**31, rank=0, drop_last=True).plan(0))

    def huge_world_packed():
        return db.BucketSampler(BIG, max_tokens=2**32 - 1, mode="packed", world_size=2**31, rank=0).plan(0)

    def huge_window():  # accumulation × world_size near 2^64
        sampler = db.BucketSampler(np.arange(1, 2000), max_tokens=4096, world_size=2**31, rank=0,
                                   accumulation=2**32 - 1, drop_last=True)
        return len(sampler.plan(0))

    def long_window():  # one window longer than the epoch
        return len(db.BucketSampler(np.arange(1, 2000), max_tokens=4096, world_size=2, accumulation=2**32 - 1).plan(0))

    def window_tv():
        return metrics.window_tv(BIG, np.arange(5, dtype=np.uint32), np.array([0, 2, 5], dtype=np.uint64), 1)

    def too_many_pieces():
        lengths = np.array([2**32 - 1, 2**32 - 1], dtype=np.uint32)
        return db.BucketSampler(lengths, max_tokens=1, mode="packed", oversize="truncate")

    def huge_padding():
        import pyarrow as pa

        table = pa.table({{"input_ids": pa.array([[1, 2, 3], [4, 5]], type=pa.list_(pa.int32()))}})
        path = tempfile.mkdtemp() + "/t.arrow"
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        store = db.TokenStore(path)
        return [db.collate(store, [0, 1], pad_to_multiple_of=2**31, dtype=d) for d in ("int64", "int32")]

    for case in (padded_stats, packed_stats, packed_bucketed, packed_over_u32, huge_world, huge_world_drop_last,
                 huge_world_packed, huge_window, long_window, window_tv, too_many_pieces, huge_padding):
        try:
            case()
            print("returned", case.__name__, flush=True)
        except EXPECTED as error:
            print("raised", case.__name__, type(error).__name__, flush=True)
    """
)


def test_extreme_values_return_or_raise_in_a_capped_process():
    # Few threads and malloc arenas, so the cap holds on machines with many cores (each arena reserves
    # 64 MB of address space).
    env = {**os.environ, "RAYON_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2"}
    child = subprocess.run(
        [sys.executable, "-c", CHILD.format(limit=LIMIT)], capture_output=True, text=True, timeout=300, env=env
    )
    assert child.returncode == 0, f"the child died ({child.returncode}):\n{child.stdout}\n{child.stderr[-3000:]}"
    outcomes = {line.split()[1]: line.split()[0] for line in child.stdout.splitlines()}
    assert outcomes == {
        "padded_stats": "returned",
        "packed_stats": "returned",
        "packed_bucketed": "returned",
        "packed_over_u32": "raised",
        "huge_world": "raised",
        "huge_world_drop_last": "raised",
        "huge_world_packed": "raised",
        "huge_window": "raised",
        "long_window": "returned",
        "window_tv": "returned",
        "too_many_pieces": "raised",
        "huge_padding": "raised",
    }, child.stdout

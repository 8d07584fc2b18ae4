"""The small store, sampler and oracle the position tests share (tests/planning/test_position.py,
tests/adapters/test_state_rows.py): 80 rows whose lengths name them, planned with max_tokens=128."""

from __future__ import annotations

import dflash_batch as db
import numpy as np
import pyarrow as pa

ROWS = [list(range(1, int(n) + 1)) for n in np.random.default_rng(0).integers(2, 60, 80)]
STORE = db.TokenStore(pa.table({"input_ids": ROWS}))


def sampler(**kwargs) -> db.BucketSampler:
    return db.BucketSampler(STORE.lengths(), max_tokens=128, seed=3, **kwargs)


def rows(batch) -> list[int]:
    """The dataset rows of a Loader batch (each row's length names it: rows are 1..n) or sampler batch."""
    if isinstance(batch, dict):
        return sorted(int(mask.sum()) for mask in batch["attention_mask"])
    return sorted(len(ROWS[i]) for i in batch)


def planned(epoch: int, start: int = 0) -> list[list[int]]:
    plan = sampler().plan(epoch)
    return [sorted(len(ROWS[i]) for i in plan[s]) for s in range(start, plan.steps)]


def resumed_from(state: dict) -> list[list[int]]:
    fresh = sampler()
    fresh.load_state_dict(state)
    return [rows(batch) for batch in fresh]

"""The sampler inside a real torch DataLoader, with and without worker processes."""

from __future__ import annotations

import dflash_batch as db
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from _datasets import IndexDataset  # noqa: E402


def lengths(n: int = 3_000) -> np.ndarray:
    return db.seed_workload(n, seed=11)


@pytest.mark.parametrize(
    ("num_workers", "context"), [(0, None), (2, "fork"), (2, "spawn")], ids=["main", "fork", "spawn"]
)
def test_dataloader_yields_the_plan(num_workers, context):
    sampler = db.BucketSampler(lengths(), max_tokens=16384, seed=3)
    sampler.set_epoch(2)
    dataset = IndexDataset(len(lengths()), sampler=sampler if context == "spawn" else None)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, num_workers=num_workers, multiprocessing_context=context
    )
    got = [batch.tolist() for batch in loader]
    assert got == [b.tolist() for b in sampler.plan(2)]
    assert len(loader) == len(sampler) == len(got)
    assert sorted(i for b in got for i in b) == list(range(len(lengths())))


def test_dataloader_per_rank_with_set_epoch():
    n = len(lengths())
    seen = []
    for rank in range(2):
        sampler = db.BucketSampler(lengths(), batch_size=8, world_size=2, rank=rank, seed=1)
        loader = torch.utils.data.DataLoader(IndexDataset(n), batch_sampler=sampler)
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            batches = [b.tolist() for b in loader]
            seen.append((epoch, rank, batches))
    for epoch in (0, 1):
        union = sorted(i for e, _, bs in seen if e == epoch for b in bs for i in b)
        assert union == list(range(n))
    assert seen[0][2] != seen[1][2], "epochs 0 and 1 gave the same batches"


def test_numpy_index_batches_work_with_tensor_indexing():
    data = torch.arange(100) * 10
    plan = db.BucketSampler(np.full(100, 7), batch_size=16, seed=0).plan(0)
    batch = plan[0]
    assert torch.equal(data[torch.from_numpy(batch.astype(np.int64))], data[batch.tolist()])


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_dataloader_with_workers_over_a_shared_plan_yields_each_epochs_plan(tmp_path, context):
    """plan_dir= with DataLoader workers over 3 epochs: each epoch's iteration starts the next epoch's plan
    in the background, and the next epoch's workers are forked (or spawned, pickling the sampler) while it
    may run; every epoch yields exactly the plan of a sampler without plan_dir."""
    n = len(lengths())
    sampler = db.BucketSampler(lengths(), max_tokens=16384, seed=3, plan_dir=tmp_path)
    own = db.BucketSampler(lengths(), max_tokens=16384, seed=3)
    dataset = IndexDataset(n, sampler=sampler if context == "spawn" else None)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=2, multiprocessing_context=context)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        assert [batch.tolist() for batch in loader] == [b.tolist() for b in own.plan(epoch)]

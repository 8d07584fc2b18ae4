"""The Loader's host blocks (dflash_batch.loading.blocks): a CPU batch is never rewritten while any way of holding
it lives, with torch's storage use counts and without them."""

from __future__ import annotations

import dflash_batch as db
import numpy as np
import pytest
from _arrow import token_rows, token_table, write_ipc

torch = pytest.importorskip("torch")
from dflash_batch.loading import blocks  # noqa: E402  (imports torch)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rows = token_rows(400, longest=60)
    return db.TokenStore(write_ipc(tmp_path_factory.mktemp("b") / "t.arrow", token_table(rows)))


@pytest.fixture(params=["counted", "tensor per batch"])
def counting(request, monkeypatch):
    """Both ways the pool tells a held block: torch's use counts, and (where a torch build lacks them)
    a tensor per batch whose storage holds the numpy array."""
    if request.param == "tensor per batch":
        monkeypatch.setattr(blocks, "_USES", None)
    elif blocks._USES is None:
        pytest.skip("this torch build has no storage use counts")
    return request.param


def _keep_slice(batch):
    return batch["labels"][0, :5], lambda kept: kept.numpy()


def _keep_numpy(batch):
    return batch["input_ids"][1:].numpy(), lambda kept: kept[0, :5]


def _keep_storage(batch):
    # The raw storage alone (its first bytes are input_ids' first row).
    ids = batch["input_ids"]
    return ids.untyped_storage(), lambda kept: np.frombuffer(bytes(kept[: 5 * 8]), dtype=np.int64)


def _keep_dlpack(batch):
    return torch.utils.dlpack.to_dlpack(batch["input_ids"][0]), lambda kept: torch.from_dlpack(kept)[:5].numpy()


@pytest.mark.parametrize("keep", [_keep_slice, _keep_numpy, _keep_storage, _keep_dlpack])
def test_a_batch_held_any_way_is_never_rewritten(store, counting, keep):
    """Every fifth batch is kept in one way only (its tensors dropped), the rest dropped at once; every
    kept piece still equals its step's collation once the epoch has run past it."""
    sampler = db.BucketSampler(store.lengths(), max_tokens=256, seed=1)
    plan, kept = sampler.plan(), []
    for step, batch in enumerate(db.Loader(store, sampler, prefetch=2)):
        if step % 5 == 0:
            kept.append((step, *keep(batch)))
        del batch  # freed at once (reference counting): no gc needed
    assert len(kept) >= 4
    for step, piece, read in kept:
        expected = db.collate(store, plan[step])
        key = "labels" if keep is _keep_slice else "input_ids"
        row = 1 if keep is _keep_numpy else 0
        np.testing.assert_array_equal(read(piece), expected[key][row, :5], err_msg=f"step {step}")


def test_a_batch_moved_to_shared_memory_keeps_its_data_and_the_loader_its_own(store, counting):
    """``share_memory_()`` (torch.multiprocessing does it to send a tensor) swaps a storage's memory in
    place: the block is then another process's, and the Loader never uses it again, also once the
    shared tensor is dropped."""
    sampler = db.BucketSampler(store.lengths(), max_tokens=256, seed=2)
    plan, shared = sampler.plan(), []
    for step, batch in enumerate(db.Loader(store, sampler, prefetch=1)):
        expected = db.collate(store, plan[step])
        np.testing.assert_array_equal(batch["input_ids"].numpy(), expected["input_ids"], err_msg=f"step {step}")
        if step % 4 == 0:
            ids = batch["input_ids"]
            ids.share_memory_()
            shared.append((step, ids))
        del batch
        if len(shared) == 2:  # held for a few steps, then dropped: its block is free again
            step_shared, ids = shared.pop(0)
            assert ids.is_shared()
            np.testing.assert_array_equal(ids.numpy(), db.collate(store, plan[step_shared])["input_ids"])
            del ids
    assert step > 12


def test_the_pool_reuses_the_oldest_free_block_and_drops_spares():
    pool = blocks.BlockPool(np.int64, keep=1)
    first = pool.take(100)[0]
    views = first.as_strided((10,), (1,))
    del first
    second = pool.take(100)[0]  # the first is held by `views`
    assert len(pool) == 2 and second.data_ptr() != views.data_ptr()
    del second
    again, array = pool.take(50)  # the second is free again: reused, not a third
    assert len(pool) == 2 and array.size == 100
    del again, array, views
    big = pool.take(1000)[0]  # both free blocks are too small: released, one new block
    assert len(pool) == 1 and pool.nbytes == 8000 and big.numel() == 1000


def test_a_tensor_per_batch_where_torch_has_no_use_counts(monkeypatch):
    monkeypatch.delattr(torch._C, "_storage_Use_Count")
    assert blocks._storage_uses() is None
    monkeypatch.setattr(torch._C, "_storage_Use_Count", lambda pointer: 1, raising=False)
    assert blocks._storage_uses() is None, "a count that never moves is not trusted"
    pool = blocks.BlockPool(np.int64, keep=2, counted=False)
    a = pool.take(10)[0]
    del a
    b = pool.take(10)[0]  # the same block, a new tensor over it
    c = pool.take(10)[0]  # `b` holds the first
    assert b is not c and len(pool) == 2 and b.data_ptr() != c.data_ptr()

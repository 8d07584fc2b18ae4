"""The Loader: contents, resume with prefetch in flight, errors, shutdown, and the CUDA pipeline's logic."""

from __future__ import annotations

import gc
import subprocess
import sys

import dflash_batch as db
import numpy as np
import pytest
from _arrow import token_table, write_ipc
from _loading import ROWS, as_numpy, make_store, sampler_for, workers

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_batches_equal_collate_of_the_sampler_batches(store, dtype):
    sampler = sampler_for(store, world_size=2, rank=1, pad_to_multiple_of=8)
    loader = db.Loader(store, sampler, dtype=dtype, prefetch=3)
    expected = [db.collate(store, b, pad_to_multiple_of=8, dtype=str(dtype)) for b in sampler]
    got = [as_numpy(b) for b in loader]
    assert len(got) == len(expected) == len(loader)
    for g, e in zip(got, expected, strict=True):
        for key in e:
            assert g[key].dtype == e[key].dtype
            np.testing.assert_array_equal(g[key], e[key])
    assert workers() == []


def test_epochs_and_memory(store):
    sampler = sampler_for(store)
    loader = db.Loader(store, sampler, prefetch=2, reuse_buffers=True)
    first = [as_numpy(b)["input_ids"] for b in loader]
    assert len(first) == sampler.plan(0).steps
    loader.set_epoch(1)
    second = [as_numpy(b)["input_ids"] for b in loader]
    # Every epoch has the same steps, even under a token budget.
    assert sampler.epoch == 1 and len(second) == len(first) == len(loader) == sampler.plan(1).steps
    assert any(a.shape != b.shape or (a != b).any() for a, b in zip(first, second, strict=False))
    largest = max(a.size for a in second)  # the epoch's largest padded batch (≤ max_tokens)
    assert largest <= 256
    assert loader.memory_bytes == 3 * 4 * largest * 8  # 3 slots × 4 arrays × largest batch × int64
    again = [as_numpy(b)["input_ids"] for b in loader]
    assert all((a == b).all() for a, b in zip(second, again, strict=True)), "same epoch, same batches"


def test_prefetch_past_the_epoch_makes_one_slot_per_step_and_a_ring_past_memory_is_refused(store, monkeypatch):
    sampler = sampler_for(store)
    steps = sampler.plan(0).steps
    loader = db.Loader(store, sampler, prefetch=10**9, reuse_buffers=True)  # once: a billion slots, one at a time
    got = [as_numpy(b)["input_ids"] for b in loader]
    assert len(got) == steps
    largest = max(a.size for a in got)
    assert loader.memory_bytes == (steps + 1) * 4 * largest * 8
    from dflash_batch.loading import loader as loader_module

    monkeypatch.setattr(loader_module, "_physical_memory", lambda: 1000)
    with pytest.raises(MemoryError, match=r"prefetch=2 needs a ring of 3 slots .* lower prefetch"):
        next(iter(db.Loader(store, sampler, prefetch=2, reuse_buffers=True)))
    with pytest.raises(MemoryError, match=r"prefetch=2 needs a ring of 3 slots .* lower prefetch"):
        next(iter(db.Loader(store, sampler, prefetch=2)))  # fresh batches in flight are counted too
    assert not workers()


@pytest.mark.parametrize("mode", ["padded", "packed"])
@pytest.mark.parametrize("prefetch", [1, 2, 8])
def test_batches_held_across_next_stay_intact(store, mode, prefetch):
    """Regression: the HF Trainer pulls every micro-batch of an optimizer step before training on any;
    CPU batches were views of a recycled slot, so all but the last were overwritten."""
    sampler = sampler_for(store, mode=mode) if mode == "packed" else sampler_for(store)
    loader = db.Loader(store, sampler, prefetch=prefetch)
    held = list(loader)  # every batch of the epoch held at once
    assert len(held) == len(sampler) > 4
    plan, collate = sampler.plan(), db.collate if mode == "padded" else db.collate_packed
    kwargs = {} if mode == "padded" else {"capacity": sampler.max_tokens}
    for step, batch in enumerate(held):
        expected = collate(store, plan[step], **kwargs)
        for key in ("input_ids", "labels", "position_ids"):
            np.testing.assert_array_equal(batch[key].numpy(), expected[key], err_msg=f"step {step} {key}")
    blocks = {batch["input_ids"].untyped_storage().data_ptr() for batch in held}
    assert len(blocks) == len(held), "two held batches share a block"


def test_blocks_are_reused_once_the_trainer_drops_a_batch(store):
    """Steady state: a loop that drops each batch before the next runs on prefetch + 2 blocks."""
    sampler = sampler_for(store)
    loader = db.Loader(store, sampler, prefetch=2)
    seen = set()
    for batch in loader:
        seen.add(batch["input_ids"].untyped_storage().data_ptr())
        del batch
    assert len(loader._pool) <= 4 and len(seen) <= 5
    # A view kept past its batch (a slice of labels) keeps the whole block out of reuse.
    kept = []
    for step, batch in enumerate(loader):
        if step % 5 == 0:
            kept.append((step, batch["labels"][0, :3]))
    plan = sampler.plan()
    for step, view in kept:
        np.testing.assert_array_equal(view.numpy(), db.collate(store, plan[step])["labels"][0, :3])


def test_reuse_buffers_recycles_views_after_the_next_call(store):
    """The opt-in ring: a batch is valid until the next ``next()``, and then rewritten."""
    sampler = sampler_for(store)
    iterator = iter(db.Loader(store, sampler, prefetch=1, reuse_buffers=True))
    held = [next(iterator) for _ in range(4)]
    plan = sampler.plan()
    last = db.collate(store, plan[3])["input_ids"]
    np.testing.assert_array_equal(held[3]["input_ids"].numpy(), last)
    shared = {b["input_ids"].untyped_storage().data_ptr() for b in held}
    assert len(shared) == 2  # two slots (prefetch + 1), reused in turn
    with pytest.raises(ValueError, match="reuse_buffers=True applies to CPU"):  # checked before CUDA is looked for
        db.Loader(store, sampler, reuse_buffers=True, device="cuda")
    with pytest.raises(TypeError, match="reuse_buffers must be a bool"):
        db.Loader(store, sampler, reuse_buffers="yes")


def test_resume_with_prefetch_in_flight(store):
    sampler = sampler_for(store)
    loader = db.Loader(store, sampler, prefetch=4)
    seen = []
    for i, batch in enumerate(loader):
        seen.append(as_numpy(batch)["input_ids"])
        if i == 4:
            state = loader.state_dict()
            break
    assert state["step"] == 5, "prefetched batches are not consumed"
    resumed = db.Loader(store, sampler_for(store), prefetch=4)
    resumed.load_state_dict(state)
    rest = [as_numpy(b)["input_ids"] for b in resumed]
    everything = [as_numpy(b)["input_ids"] for b in db.Loader(store, sampler_for(store))]
    assert len(seen) + len(rest) == len(everything)
    for a, b in zip(seen + rest, everything, strict=True):
        np.testing.assert_array_equal(a, b)
    assert resumed.state_dict()["step"] == len(everything)


def test_worker_errors_reach_the_trainer_with_their_type(store, monkeypatch):
    loader = db.Loader(store, sampler_for(store))
    original = loader._collate_into
    calls = []

    def failing(batch, slot):
        calls.append(1)
        if len(calls) == 3:
            raise KeyError("broken row")
        return original(batch, slot)

    monkeypatch.setattr(loader, "_collate_into", failing)
    received = 0
    with pytest.raises(KeyError, match="broken row") as info:
        for _ in loader:
            received += 1
    assert received == 2
    assert any("worker thread, preparing step 2" in note for note in getattr(info.value, "__notes__", []))
    assert workers() == []


def test_collation_errors_propagate(tmp_path):
    import pyarrow as pa

    path = write_ipc(tmp_path / "w.arrow", token_table([np.array([1, 2]), np.array([2**40])], value_type=pa.int64()))
    store = db.TokenStore(path)
    loader = db.Loader(store, db.BucketSampler(store.lengths(), batch_size=1, shuffle=False), dtype=torch.int32)
    with pytest.raises(db.DataError, match="does not fit in int32"):
        list(loader)


def test_break_close_context_and_gc_stop_the_worker(store):
    loader = db.Loader(store, sampler_for(store), prefetch=1)
    for _ in loader:
        break
    assert workers() == []
    iterator = iter(loader)
    next(iterator)
    assert len(workers()) == 1
    loader.close()
    assert workers() == []
    with db.Loader(store, sampler_for(store)) as scoped:
        next(iter(scoped))
    assert workers() == []
    dropped = db.Loader(store, sampler_for(store))
    held = iter(dropped)
    next(held)
    del dropped, held
    gc.collect()
    assert workers() == []


def test_a_new_iteration_stops_the_previous_one(store):
    loader = db.Loader(store, sampler_for(store))
    first = iter(loader)
    next(first)
    second = iter(loader)
    next(second)
    assert len(workers()) == 1
    loader.close()


def test_process_exit_mid_epoch_does_not_hang(store):
    code = f"""
import dflash_batch as db
store = db.TokenStore({str(store.paths[0])!r})
loader = db.Loader(store, db.BucketSampler(store.lengths(), max_tokens=256), prefetch=1)
it = iter(loader)
next(it)
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_torch_dataloader_with_collate_fn(store):
    sampler = sampler_for(store)

    def collate_fn(rows):
        return {k: torch.from_numpy(v) for k, v in db.collate(store, np.asarray(rows, dtype=np.int64)).items()}

    loader = torch.utils.data.DataLoader(range(len(store)), batch_sampler=sampler, collate_fn=collate_fn)
    batches = list(loader)
    assert len(batches) == len(sampler)
    first = next(iter(sampler))
    assert torch.equal(batches[0]["input_ids"], torch.from_numpy(db.collate(store, first)["input_ids"]))


def test_bad_arguments(store):
    sampler = sampler_for(store)
    with pytest.raises(TypeError, match=r"store must be a dflash_batch\.TokenStore"):
        db.Loader(np.zeros(3), sampler)
    with pytest.raises(TypeError, match=r"sampler must be a dflash_batch\.BucketSampler"):
        db.Loader(store, [np.arange(3)])
    with pytest.raises(ValueError, match="the store has 300 rows but the sampler plans 10"):
        db.Loader(store, db.BucketSampler(np.full(10, 5), batch_size=2))
    with pytest.raises(ValueError, match="prefetch=0 is invalid"):
        db.Loader(store, sampler, prefetch=0)
    with pytest.raises(ValueError, match=r"dtype=.* is invalid"):
        db.Loader(store, sampler, dtype=torch.float32)
    with pytest.raises(ValueError, match="pad_to_multiple_of=0 differs from the sampler's pad_to_multiple_of=1"):
        db.Loader(store, sampler, pad_to_multiple_of=0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs CUDA"):
            db.Loader(store, sampler, device="cuda")
        with pytest.raises(ValueError, match="pin_memory=True needs CUDA"):
            db.Loader(store, sampler, pin_memory=True)


@pytest.mark.parametrize(("dtype", "multiple"), [(torch.int64, 1), (torch.int32, 8)])
def test_in_memory_store_loads_the_same(store, dtype, multiple):
    """numpy collates an in-memory store into the same back-to-back slot layout as Rust does for files."""
    datasets = pytest.importorskip("datasets")
    memory = db.TokenStore(datasets.Dataset.from_dict({"input_ids": [r.tolist() for r in ROWS]}))
    settings = {"dtype": dtype}
    planned = {"pad_to_multiple_of": multiple}
    from_memory = [as_numpy(b) for b in db.Loader(memory, sampler_for(memory, **planned), **settings)]
    from_files = [as_numpy(b) for b in db.Loader(store, sampler_for(store, **planned), **settings)]
    assert len(from_memory) == len(from_files)
    for a, b in zip(from_memory, from_files, strict=True):
        assert a["input_ids"].shape[1] % multiple == 0
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_slot_collation_checks_the_slot(store):
    good = np.full(4 * 512, 7, dtype=np.int64)
    rows, width = db._core.collate_slot(store.native, np.array([0, 1], dtype=np.uint32), good, 0, -100, 1)
    n = rows * width
    expected = db.collate(store, [0, 1])
    for k, key in enumerate(("input_ids", "attention_mask", "labels", "position_ids")):  # back to back
        np.testing.assert_array_equal(good[k * n : (k + 1) * n].reshape(rows, width), expected[key])
    assert (good[4 * n :] == 7).all()
    with pytest.raises(ValueError, match=r"slot must be 1-D \(4 × capacity elements\), got shape \[4, 512\]"):
        db._core.collate_slot(store.native, np.array([0]), np.zeros((4, 512), dtype=np.int64), 0, -100, 1)
    with pytest.raises(ValueError, match="C-contiguous"):
        db._core.collate_slot(store.native, np.array([0]), np.zeros(4096, dtype=np.int64)[::2], 0, -100, 1)
    with pytest.raises(TypeError, match="int64 or int32"):
        db._core.collate_slot(store.native, np.array([0]), np.zeros(2048), 0, -100, 1)
    length = int(store.lengths()[0])
    too_small = rf"buffer slot holds 3 elements but the batch needs {4 * length} \(4 arrays × rows"
    with pytest.raises(ValueError, match=too_small):
        db._core.collate_slot(store.native, np.array([0]), np.zeros(3, dtype=np.int64), 0, -100, 1)


def test_batch_contents_are_identical_across_processes(store):
    code = f"""
import hashlib, dflash_batch as db
store = db.TokenStore({str(store.paths[0])!r})
loader = db.Loader(store, db.BucketSampler(store.lengths(), max_tokens=256, seed=4), prefetch=3)
loader.set_epoch(2)
digest = hashlib.sha256()
for batch in loader:
    for key in sorted(batch):
        digest.update(batch[key].numpy().tobytes())
print(digest.hexdigest())
"""
    digests = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    }
    assert len(digests) == 1 and len(next(iter(digests)).strip()) == 64


def test_set_epoch_then_state_dict_records_the_new_epoch_at_step_zero(store):
    """Regression: the Loader kept the previous epoch's step count, so a resume skipped the new epoch."""
    loader = db.Loader(store, sampler_for(store))
    assert len(list(loader)) == len(loader)
    loader.set_epoch(1)
    state = loader.state_dict()
    assert (state["epoch"], state["step"]) == (1, 0)


def test_num_items_in_batch_is_the_label_tokens_of_the_optimizer_step(store):
    for world in (1, 2):
        sampler = sampler_for(store, accumulation=3, world_size=world, rank=world - 1)
        batches = list(db.Loader(store, sampler, num_items_in_batch=True))
        plan = sampler.plan()
        for step, batch in enumerate(batches):
            window = range((step // 3) * 3 * world, min((step // 3 + 1) * 3 * world, len(plan)))
            expected = sum(int((db.collate(store, plan[b])["labels"][:, 1:] != -100).sum()) for b in window)
            assert batch["num_items_in_batch"] == expected, (world, step)
    assert sampler.label_tokens().sum() == int((store.lengths() - 1).sum())
    with pytest.raises(TypeError, match="num_items_in_batch must be a bool"):
        db.Loader(store, sampler, num_items_in_batch=1)


def test_skip_refuses_steps_outside_the_epoch(store):
    loader = db.Loader(store, sampler_for(store))
    with pytest.raises(ValueError, match=r"steps=-1 is invalid; pass 0 ≤ steps ≤"):
        loader.skip(-1)
    with pytest.raises(ValueError, match="is invalid"):
        loader.skip(len(loader) + 1)
    loader.skip(len(loader))
    assert list(loader) == []


def test_a_sampler_planned_on_other_lengths_of_the_same_count_is_refused(store):
    """Regression: only the count was compared, so budgets planned for other lengths were accepted."""
    other = np.full(len(store), 3, dtype=np.int64)
    with pytest.raises(ValueError, match="planned on other lengths than the store's"):
        db.Loader(store, db.BucketSampler(other, max_tokens=256))


def test_a_device_the_loader_cannot_deliver_to_is_refused(store):
    """Regression: device="meta" silently returned CPU tensors."""
    with pytest.raises(ValueError, match="device='meta' is not supported"):
        db.Loader(store, sampler_for(store), device="meta")


def test_the_ring_holds_the_largest_padded_batch_left_on_the_rank():
    """The Rust core sizes the ring: rows × longest rounded up, over the steps the rank still runs."""
    lengths = np.random.default_rng(3).integers(1, 500, 400)
    for world, multiple in ((1, 1), (3, 8), (4, 64)):
        plan = db.BucketSampler(lengths, max_tokens=2048, world_size=world, seed=1).plan()
        for rank in range(world):
            for start in (0, plan.steps // 2, plan.steps):
                batches = [plan[s * world + rank] for s in range(start, plan.steps)]
                padded = [len(b) * -(-int(lengths[b].max()) // multiple) * multiple for b in batches]
                assert plan.largest_padded(start, rank, multiple) == max(padded, default=1), (world, rank, start)
    with pytest.raises(ValueError, match="rank 4 is not one of this plan's 4 ranks"):
        plan.largest_padded(0, 4, 1)


def test_set_epoch_between_iter_and_the_first_batch_applies_to_a_loader_as_to_a_sampler(store):
    """Regression (issue 59): `iter(loader)`, `set_epoch(1)`, `next()` raised "superseded" on a Loader while
    a sampler's iterator yielded epoch 1. One rule now: an iteration begins at its first next()."""
    sampler = sampler_for(store)
    loader = db.Loader(store, sampler)
    batches = iter(loader)
    loader.set_epoch(1)
    first = as_numpy(next(batches))
    assert sampler.epoch == 1 and sampler.position.step == 1
    expected = db.collate(store, sampler.plan(1)[0])
    np.testing.assert_array_equal(first["input_ids"], expected["input_ids"])
    other = sampler_for(store)
    indices = iter(other)
    other.set_epoch(1)
    assert np.array_equal(next(indices), other.plan(1)[0])
    # Once a batch has been taken, set_epoch supersedes the iteration: both raise at the next batch.
    loader.set_epoch(2)
    other.set_epoch(2)
    for running in (batches, indices):
        with pytest.raises(RuntimeError, match="superseded"):
            next(running)
    loader.close()

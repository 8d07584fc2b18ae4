"""The Loader's CUDA pipeline, its logic checked on the CPU: copies start one batch ahead, a failed copy is
raised for its own batch, packed rows take the same path (the GPU run itself: benchmarks/cuda_check.py)."""

from __future__ import annotations

import threading

import dflash_batch as db
import numpy as np
import pytest
from _loading import as_numpy, make_store, sampler_for, workers
from dflash_batch.loading.pipeline import _views

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory)


class FakeEvent:
    def __init__(self, log, index):
        self.log, self.index = log, index

    def synchronize(self):
        self.log.append(("synchronize", self.index))


class FakeCudaTransfer:
    """The CUDA transfer's protocol, recorded: what the pipeline must call and in which order."""

    needs_ring = True

    def __init__(self):
        self.log = []
        self.events = {}
        self.lock = threading.Lock()

    def before_reuse(self, index):
        with self.lock:
            self.log.append(("reuse", index))
            event = self.events.pop(index, None)
        if event is not None:
            event.synchronize()

    def send(self, index, slot, shape):
        # The "device" copy: the used front of the block in one piece, as the CUDA transfer sends it.
        used = len(slot["keys"]) * shape[0] * shape[1]
        cu = slot["cu_torch"][: shape[2] + 1].clone() if len(shape) == 4 else None
        payload = _views(slot["block"][:used].clone(), slot["keys"], shape, cu)
        with self.lock:
            self.log.append(("send", index))
            self.events[index] = FakeEvent(self.log, index)
        return payload, index

    def receive(self, payload):
        tensors, index = payload
        self.log.append(("wait", index))
        return tensors


def test_cuda_pipeline_protocol_on_the_cpu(store):
    transfer = FakeCudaTransfer()
    sampler = sampler_for(store)
    loader = db.Loader(store, sampler, prefetch=2, _transfer=transfer)
    batches = [as_numpy(b) for b in loader]
    assert len(batches) == len(sampler)
    sends = [i for op, i in transfer.log if op == "send"]
    assert sorted(set(sends)) == [0, 1, 2] and len(sends) == len(batches)
    pending = set()
    for op, index in transfer.log:
        if op == "send":
            assert index not in pending, "a slot was rewritten before its copy was waited for"
            pending.add(index)
        elif op == "synchronize":
            pending.discard(index)
    assert sum(op == "wait" for op, _ in transfer.log) == len(batches)
    for got, indices in zip(batches, sampler_for(store), strict=True):
        np.testing.assert_array_equal(got["labels"], db.collate(store, indices)["labels"])


def iterate_with_two_ready(loader):
    """An iterator of ``loader`` whose first copy waits until the worker has collated two batches (an
    Event, no sleep), so the first ``next()`` finds the following batch ready when it decides whether to
    start its copy ahead. (An iteration begins at its first ``next()``: the worker starts there.)"""
    two_ready = threading.Event()
    collate_into, done = loader._collate_into, []

    def counted(batch, slot):
        shape = collate_into(batch, slot)
        done.append(shape)
        if len(done) == 2:
            two_ready.set()
        return shape

    transfer, sent = loader._transfer, []
    send = transfer.send

    def first_waits(index, slot, shape):
        if not sent:
            assert two_ready.wait(timeout=60)
        sent.append(index)
        return send(index, slot, shape)

    loader._collate_into = counted
    transfer.send = first_waits
    return iter(loader)


def test_cuda_copy_starts_one_batch_ahead(store):
    """When the worker has the next batch ready, next() starts its copy before handing out the current
    one, so the copy runs during the trainer's step."""
    transfer = FakeCudaTransfer()
    loader = db.Loader(store, sampler_for(store), prefetch=2, _transfer=transfer)
    iterator = iterate_with_two_ready(loader)
    next(iterator)
    with transfer.lock:
        ops = [op for op, _ in transfer.log if op in ("send", "wait")]
    assert ops[:3] == ["send", "send", "wait"], ops  # batch 1's copy started before batch 0 was handed out
    rest = list(iterator)
    assert len(rest) == len(sampler_for(store)) - 1
    loader.close()


def test_a_failed_copy_ahead_is_raised_for_its_own_batch(store):
    """A copy that fails to start one batch ahead does not cost the batch being handed out: the error is
    raised by the next call, with a note saying where, and the worker stops."""

    class FailingSecondSend(FakeCudaTransfer):
        def send(self, index, slot, shape):
            if sum(op == "send" for op, _ in self.log) == 1:
                raise RuntimeError("CUDA out of memory (simulated)")
            return super().send(index, slot, shape)

    loader = db.Loader(store, sampler_for(store), prefetch=2, _transfer=FailingSecondSend())
    iterator = iterate_with_two_ready(loader)
    first = next(iterator)
    np.testing.assert_array_equal(first["labels"].numpy(), db.collate(store, next(iter(sampler_for(store))))["labels"])
    with pytest.raises(RuntimeError, match="simulated") as info:
        next(iterator)
    assert any("host-to-device copy of the next batch" in note for note in getattr(info.value, "__notes__", []))
    assert workers() == []


def test_cuda_pipeline_protocol_with_packed_rows(store):
    """A packed row goes through the same one-copy send: its four arrays from the block, cu_seqlens apart."""
    transfer = FakeCudaTransfer()
    sampler = sampler_for(store, mode="packed")
    got = list(db.Loader(store, sampler, prefetch=2, _transfer=transfer))
    assert len(got) == len(sampler)
    for batch, indices in zip(got, sampler_for(store, mode="packed"), strict=True):
        expected = db.collate_packed(store, indices, capacity=256)
        assert batch["max_seqlen"] == expected.pop("max_seqlen")
        for key, value in expected.items():
            np.testing.assert_array_equal(batch[key].numpy(), value)

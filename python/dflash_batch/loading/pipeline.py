"""The Loader's moving parts: one epoch's worker thread and its slots (``Pipeline``), and how a collated
slot reaches the trainer (``HostTransfer`` on the CPU, ``CudaTransfer`` to a GPU). See
:mod:`dflash_batch.loading.loader` for the design; this module holds no planning or collation of its own.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..base import runtime

_END = object()
_STOP = object()


class _Failed:
    """An error to raise in the trainer's thread, with a note saying where it happened."""

    def __init__(self, error: BaseException, where: str) -> None:
        self.error, self.where = error, where


class Pipeline:
    """One epoch's worker thread and its ring of slots."""

    def __init__(
        self,
        collate_into,
        batches: Iterator[np.ndarray],
        slots: list[Any],
        transfer: Any,
        fresh: Any = None,
    ) -> None:
        self._collate_into, self._batches, self._slots, self._transfer = collate_into, batches, slots, transfer
        # fresh() → a new slot for one batch alone, made in the trainer's thread (Python in the worker
        # ran ~4× slower than alone, contending for the GIL: measured); None: the ring `slots` is recycled.
        self._fresh = fresh
        self._free: queue.SimpleQueue = queue.SimpleQueue()  # (index, slot): a ring slot, or a fresh one
        for index in range(len(slots)):
            self._free.put((index, slots[index] if fresh is None else fresh()))
        self._ready: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._held: int | None = None
        self._ahead: Any = None  # the next ready batch, its copy started; or an end or failure
        self._closed = False
        self._pid = os.getpid()  # its worker thread lives in this process only
        self.thread = runtime.thread(self._work, "dflash-batch-loader")

    def _work(self) -> None:
        step = -1
        try:
            for batch in self._batches:
                step += 1
                token = self._free.get()
                if token is _STOP or self._stop.is_set():
                    return
                index, slot = token
                self._transfer.before_reuse(index)
                self._ready.put((index, slot, self._collate_into(batch, slot)))
            self._ready.put(_END)
        except BaseException as error:  # raised again in the trainer's thread
            self._ready.put(_Failed(error, f"in the dflash_batch Loader's worker thread, preparing step {step}"))

    def __iter__(self) -> Pipeline:
        return self

    def __next__(self) -> dict[str, Any]:
        if os.getpid() != self._pid:
            raise RuntimeError(
                f"this Loader iterator was started in process {self._pid}; a forked child has no copy of its worker "
                "thread (it would wait forever): build a new Loader (or iterate it anew) in the child"
            )
        if self._held is not None:  # the trainer is done with the previous batch: recycle its slot
            self._free.put((self._held, self._slots[self._held]))
            self._held = None
        if self._closed:
            raise StopIteration
        item = self._ahead if self._ahead is not None else self._started(self._ready.get())
        self._ahead = None
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failed):
            self.close()
            error = item.error
            if hasattr(error, "add_note"):
                error.add_note(f"(raised {item.where})")
            raise error
        index, payload = item
        # One batch ahead: when the worker has the next batch ready, its copy starts now and runs during
        # this step, also when the trainer synchronizes every step. Copies start in the trainer's thread,
        # which holds the GIL anyway: from the worker they waited on it (measured on an H200).
        try:
            following = self._ready.get_nowait()
        except queue.Empty:
            following = None
        if following is not None:
            try:
                self._ahead = self._started(following)
            except Exception as error:  # this batch is fine: the error belongs to the next call
                self._ahead = _Failed(error, "starting the host-to-device copy of the next batch")
        if self._fresh is None:
            self._held = index  # its slot is recycled when the trainer asks for the next batch
        else:  # this block is the batch's own; the next batch gets another, free one
            self._free.put((index, self._fresh()))
        return self._transfer.receive(payload)

    def _started(self, item: Any) -> Any:
        """A ready batch as ``(slot, payload)`` with its copy started; an end or a failure as it is."""
        if item is _END or isinstance(item, _Failed):
            return item
        index, slot, shape = item
        return index, self._transfer.send(index, slot, shape)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._free.put(_STOP)
        if threading.current_thread() is not self.thread:
            self.thread.join()


def _views(block: Any, keys: tuple[str, ...], shape: tuple[int, ...], cu_seqlens: Any = None) -> dict[str, Any]:
    """``[rows, L]`` views of the arrays lying back to back at the front of ``block`` (one
    ``as_strided`` and an ``unbind``); a packed row's shape also carries its sample count, which cuts
    ``cu_seqlens``, and ``max_seqlen``."""
    rows, width = shape[0], shape[1]
    n = rows * width
    views = dict(zip(keys, block.as_strided((len(keys), rows, width), (n, width, 1)).unbind(0), strict=True))
    if len(shape) == 4:
        views["cu_seqlens"] = cu_seqlens[: shape[2] + 1]
        views["max_seqlen"] = shape[3]  # the longest sample, an int, as varlen kernels take it
    return views


class HostTransfer:
    """CPU tensors: ``[rows, L]`` views of the slot (the batch's own block, or with ``reuse_buffers`` a ring
    slot valid until the trainer asks for the next batch). Like every transfer, it runs in the trainer's
    thread, so the worker only collates."""

    def before_reuse(self, index: int) -> None:
        pass

    def send(self, index: int, slot: dict[str, Any], shape: tuple[int, ...]) -> tuple[dict[str, Any], tuple]:
        return slot, shape

    def receive(self, payload: tuple[dict[str, Any], tuple[int, ...]]) -> dict[str, Any]:
        slot, shape = payload
        return _views(slot["block"], slot["keys"], shape, slot.get("cu_torch"))


class CudaTransfer:
    """Host slot → device on a side stream, the batch's arrays in one copy (a packed row's
    ``cu_seqlens`` in a second), started from the trainer's thread; the trainer's stream waits on the
    copy's event, and the worker rewrites a slot only after the copy out of it has completed."""

    needs_ring = True  # copies read pinned host slots, recycled once their copy completed

    def __init__(self, device: Any) -> None:
        import torch

        self._torch = torch
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self._events: dict[int, Any] = {}

    def before_reuse(self, index: int) -> None:
        event = self._events.pop(index, None)
        if event is not None:
            event.synchronize()

    def send(self, index: int, slot: dict[str, Any], shape: tuple[int, ...]) -> tuple:
        torch = self._torch
        used = len(slot["keys"]) * shape[0] * shape[1]
        with torch.cuda.stream(self.stream):
            block = slot["block"][:used].to(self.device, non_blocking=True)
            cu = slot["cu_torch"][: shape[2] + 1].to(self.device, non_blocking=True) if len(shape) == 4 else None
            event = torch.cuda.Event()
            event.record(self.stream)
        self._events[index] = event
        return block, cu, slot["keys"], event, shape

    def receive(self, payload: tuple) -> dict[str, Any]:
        block, cu, keys, event, shape = payload
        current = self._torch.cuda.current_stream(self.device)
        current.wait_event(event)
        block.record_stream(current)  # its memory is not reused before the trainer's work on it ends
        if cu is not None:
            cu.record_stream(current)
        return _views(block, keys, shape, cu)

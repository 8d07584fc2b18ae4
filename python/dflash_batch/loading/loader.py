"""``Loader``: this rank's batches as torch tensors, collated ahead of the trainer on a background thread.

The pipeline, per batch::

    worker thread: plan (Rust, once per epoch) → collate into a free slot (Rust, GIL released)
    trainer's thread, in next():
        → CPU: the batch's own tensors (collated straight into them)        → the trainer
        → CUDA: copy on a side stream + event, started one batch ahead      → the trainer's stream waits

**A batch handed out stays valid for as long as the trainer holds it**, on every device: trainers that
pull several micro-batches before training on any (the HF Trainer's gradient accumulation) get each
one intact. On the CPU the worker collates every batch straight into a block that no tensor handed
out still refers to — a pool whose blocks are reused only once the trainer has dropped every tensor
of their batch (:mod:`dflash_batch.loading.blocks`), so there is no copy and, in steady state, no
allocation; the trainer's thread hands the worker a free block for each batch it takes (pool
bookkeeping in the worker ran 0.78× the ring's speed, in the trainer's thread 0.92×: measured); on
CUDA the host side is a ring of ``prefetch + 1`` pinned slots, each one block with room for the four
arrays of the largest padded batch of the epoch, copied to fresh device tensors (torch's caching
allocator makes that cheap), and a host slot is only rewritten after the copy out of it has
completed (its event is synchronized first). A batch's four arrays lie back to back at
the front of its block, so they reach the GPU in one copy.

``reuse_buffers=True`` (CPU only) opts into the ring on the host as well: a batch's tensors are then
views of a slot that the worker rewrites once the trainer asks for the *next* batch — valid until that
``next()`` and no longer (clone to keep one). It saves an allocation per batch and suits loops that
train on each batch before fetching another.

The worker runs at most ``prefetch`` batches ahead. A ring (or the ``prefetch + 1`` fresh batches
that can be alive in the pipeline) larger than the machine's memory raises ``MemoryError`` before
anything is allocated.

``state_dict()`` is the sampler's: its position counts batches handed to the trainer, never those
merely prefetched, so a resume replays nothing and skips nothing. One iteration at a time: a new one
supersedes the previous (same thread), and one started while another thread's is running raises
``RuntimeError``. An iteration begins at its first ``next()``, as the sampler's does (one rule for
both: ``set_epoch`` between ``iter()`` and the first batch applies to it). ``set_epoch``, ``skip`` and
``load_state_dict`` — on the Loader or on its sampler — move the position at once; a loop that had
taken a batch then raises ``RuntimeError`` at its next one instead of ending early, and a refused
``load_state_dict`` changes nothing (the loop goes on).
Errors in the worker are raised in the trainer's thread with their original type and traceback.
Breaking out of the loop, ``close()``, leaving a ``with`` block, garbage collection and interpreter exit
all stop the worker and wait for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

import dflash_batch._core as _core

from ..base import runtime
from ..base.arguments import _is_int
from ..base.errors import invalid_setting
from ..data.mixture import Mixture
from ..data.reading import TokenStore
from ..planning.cursor import Run
from ..planning.sampler import BucketSampler
from .checks import check_pair, padding_of, placement, ring_too_large
from .collate import KEYS, PACKED_KEYS, add_padded, check_token, collate, collate_packed, output_dtype, pack_into
from .from_plan import FromPlan
from .pipeline import CudaTransfer, HostTransfer, Pipeline


class Loader:
    """Batches of ``store`` in ``sampler``'s order, padded and prefetched, as dicts of torch tensors.

    Args:
        store: the :class:`TokenStore` with the token column, or the :class:`Mixture` the sampler plans
            (its sources' stores read as one).
        sampler: the :class:`BucketSampler` that plans the epochs (its lengths must be the store's).
        pad_id, label_pad_id: as for :func:`collate`.
        pad_to_multiple_of: the sampler's (its budgets count the padding, so it owns the value); passing
            another one is refused.
        dtype: ``torch.int64`` (default) or ``torch.int32``.
        prefetch: batches collated ahead of the trainer (≥ 1; more than the epoch's steps buys nothing).
        device: where tensors go: ``None`` or ``"cpu"`` keeps them on the host; a CUDA device copies
            them on a side stream.
        pin_memory: pin the host slots (default: when ``device`` is CUDA). Needs CUDA.
        reuse_buffers: on the CPU, hand out views of a recycled ring slot, valid only until the next
            ``next()`` (default ``False``: every batch has its own tensors; see the module docs).
        num_items_in_batch: add ``"num_items_in_batch"`` to every batch: the label tokens of its whole
            optimizer step, all ranks and ``sampler.accumulation`` micro-batches together (an int;
            :meth:`BucketSampler.label_tokens`): a loss summed over a batch's label tokens and divided by it
            is the step's token mean (times ``world_size`` where DDP averages over ranks). Off by default
            (HF models take it as a keyword, others may not). A mixture adds ``"num_items_per_source"``,
            the same per source (1-D int64 in the mixture's order): per-source losses' denominators.

    A :class:`Mixture`'s sampler adds ``"source"``: each row's source number (``sampler.mixture.names[i]``;
    int64), or each packed sample's in ``cu_seqlens`` order.

    With a ``mode="packed"`` sampler each batch is one packed row (see :func:`collate_packed`):
    ``input_ids``, ``labels``, ``position_ids``, ``seq_idx`` as ``[1, max_tokens]`` tensors,
    ``cu_seqlens`` (int32) and ``max_seqlen`` (int); samples padded for ``context_parallel`` add
    ``cu_seqlens_padded`` and ``max_seqlen_padded`` (:func:`context_parallel_shard` cuts a batch for a CP rank).
    """

    def __init__(
        self,
        store: TokenStore,
        sampler: BucketSampler,
        *,
        pad_id: int = 0,
        label_pad_id: int = -100,
        pad_to_multiple_of: int | None = None,
        dtype: Any = None,
        prefetch: int = 2,
        device: Any = None,
        pin_memory: bool | None = None,
        reuse_buffers: bool = False,
        num_items_in_batch: bool = False,
        _transfer: Any = None,
    ) -> None:
        import torch

        if isinstance(store, Mixture):
            store = store.store
        check_pair(store, sampler)
        if not _is_int(prefetch) or prefetch < 1:
            raise invalid_setting("prefetch", f"prefetch={prefetch!r} is invalid; pass an integer ≥ 1")
        self.store, self.sampler, self.prefetch = store, sampler, prefetch
        # How batches of the sampler's plans are read: every batch is collated from its iteration's plan and
        # these, never by asking the sampler (which only moves the position: begin, set_epoch, skip, state).
        self._entries = sampler.entries
        self._packed = sampler.mode == "packed"
        self._piece_multiple = self._entries.piece_multiple
        self._dtype = output_dtype(dtype if dtype is not None else torch.int64)
        self._settings: dict[str, int] = {
            "pad_id": check_token("pad_id", pad_id),
            "label_pad_id": check_token("label_pad_id", label_pad_id),
            "pad_to_multiple_of": padding_of(sampler, pad_to_multiple_of),
        }
        settings = self._settings  # validated now, on no rows
        collate(store, np.zeros(0, dtype=np.int64), pad_id=settings["pad_id"], label_pad_id=settings["label_pad_id"])
        self.device, self.pin_memory = placement(device, pin_memory, reuse_buffers)
        cuda = self.device.type == "cuda"
        self.reuse_buffers = reuse_buffers
        if not isinstance(num_items_in_batch, bool):
            raise TypeError(f"num_items_in_batch must be a bool, got {type(num_items_in_batch).__name__}")
        self._num_items = num_items_in_batch
        self._transfer = _transfer or (CudaTransfer(self.device) if cuda else HostTransfer())
        # Fresh host blocks per batch unless the transfer copies out of a ring (CUDA) or the user
        # opted into recycled views.
        self._fresh = not (cuda or reuse_buffers or getattr(self._transfer, "needs_ring", False))
        from .blocks import BlockPool  # imports torch, which is optional until a Loader is built

        self._pool = BlockPool(self._dtype, keep=prefetch + 2)
        self._capacity_now, self._int32 = 0, torch.int32
        self._keys = PACKED_KEYS if self._packed else KEYS
        self._lengths = store.lengths()
        self._pipeline: Pipeline | None = None
        self._run: Run | None = None  # this Loader's iteration of the sampler's position
        self._slot_bytes = 0
        runtime.stop_at_exit(self)

    # -- iteration --------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Steps of an epoch on this rank (the same every epoch, and after a resume: see the sampler)."""
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next iteration runs (the sampler's ``set_epoch``: another epoch than the
        current one supersedes a running loop, whose next batch raises ``RuntimeError``)."""
        self.sampler.set_epoch(epoch)
        self._stop_if_superseded()

    def skip(self, steps: int) -> None:
        """Starts the next iteration of the current epoch at step ``steps``, as a resume would (the plan
        is a function of the seed and epoch, so the batches before it are known without reading them).
        A running loop is superseded: its next batch raises ``RuntimeError``."""
        self.sampler.position.skip(steps)
        self._stop_if_superseded()

    @property
    def epoch(self) -> int:
        return self.sampler.epoch  # the epoch the next iteration runs

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # A generator: it begins at the first next(), as the sampler's iterator does (module docs); an
        # iteration running in another thread is refused before this one stops anything.
        run = self.sampler.begin()
        self.close()
        self._run = run
        world, rank, start = self.sampler.world_size, self.sampler.rank, run.start
        # More slots than steps left would never be filled.
        slots = self._slots(self._capacity(run.plan, world, rank, start), max(run.steps - start, 1))
        batches = (batch for _, batch in run.batches((rank,)))  # read by the worker
        fresh = self._fresh_slot if self._fresh else None
        self._pipeline = Pipeline(self._collate_into, batches, slots, self._transfer, fresh)
        yield from self._run_epoch(self._pipeline, run)

    def _run_epoch(self, pipeline: Pipeline, run: Run) -> Iterator[dict[str, Any]]:
        shape = (self.sampler.accumulation, self.sampler.rank)
        extras = FromPlan(self._entries, run.plan, shape, self.store, self._num_items, self.device)
        step, exhausted = run.start, False
        try:
            for batch in pipeline:
                extras.add(batch, step)
                if self._piece_multiple > 1:
                    add_padded(batch, self._piece_multiple)
                step += 1
                run.advance(step)  # raises if a call moved the position while this loop ran
                yield batch
            run.check()  # a superseded loop raises rather than end as if its epoch were done
            exhausted = step == run.steps
        finally:
            pipeline.close()
            run.finish(exhausted)

    def _stop_if_superseded(self) -> None:
        """Frees the worker of an iteration the position no longer counts (its loop raises next)."""
        run = self._run
        if run is not None and not run.live:
            pipeline, self._pipeline, self._run = self._pipeline, None, None
            if pipeline is not None:
                pipeline.close()

    def collate(self, batch: Any) -> dict[str, Any]:
        """One index batch of the sampler's plan collated as this Loader's iterations collate it, into new
        CPU tensors: what a torch ``DataLoader`` over the sampler's index batches takes as ``collate_fn``
        (the HF Trainer's fast-forward of a resumed epoch does)."""
        import torch

        entries = np.asarray(batch)
        pad_id, label_pad_id = self._settings["pad_id"], self._settings["label_pad_id"]
        arrays: dict[str, Any]
        if self._packed:
            starts = lengths = None
            if self._entries.truncated:  # entries may be later pieces of long samples
                entries, starts, lengths = self._entries.pieces(entries)
            capacity = self._entries.capacity
            arrays = collate_packed(
                self.store, entries, capacity=capacity, pad_id=pad_id, label_pad_id=label_pad_id,
                dtype=self._dtype, starts=starts, lengths=lengths, piece_multiple=self._piece_multiple,
            )  # fmt: skip
        else:
            multiple = self._settings["pad_to_multiple_of"]
            arrays = collate(
                self.store, entries, pad_id=pad_id, label_pad_id=label_pad_id, pad_to_multiple_of=multiple,
                dtype=self._dtype,
            )  # fmt: skip
        out = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}
        if self._entries.mixed:
            out["source"] = torch.from_numpy(self._entries.sources_of(np.asarray(batch)))
        return out

    def _collate_into(self, batch: np.ndarray, slot: dict[str, Any]) -> tuple[int, ...]:
        inner, settings = self.store.native, self._settings
        if self._packed:  # one row of max_tokens: (1, C, samples, max_seqlen)
            pad_id, label_pad_id = settings["pad_id"], settings["label_pad_id"]
            windows = None
            if self._entries.truncated:  # entries may be later pieces of long samples
                batch, starts, lengths = self._entries.pieces(batch)
                windows = (starts, lengths)
            rows = slot["numpy"].reshape(len(PACKED_KEYS), -1)
            samples, _, longest = pack_into(
                self.store, batch, rows, slot["cu_seqlens"], pad_id, label_pad_id, windows, self._piece_multiple
            )
            return 1, rows.shape[1], samples, longest
        if isinstance(inner, _core.TokenStore):  # straight to Rust: this runs once per batch
            return _core.collate_slot(inner, batch, slot["numpy"], *settings.values())
        # In memory: the shape first, then numpy writes each array at its place in the block.
        multiple = settings["pad_to_multiple_of"]
        longest = int(self._lengths[batch].max()) if len(batch) else 0
        width = -(-longest // multiple) * multiple
        n = len(batch) * width
        block = slot["numpy"]
        out = {key: block[k * n : (k + 1) * n] for k, key in enumerate(KEYS)}
        views = collate(
            self.store,
            batch,
            pad_id=settings["pad_id"],
            label_pad_id=settings["label_pad_id"],
            pad_to_multiple_of=multiple,
            out=out,
        )
        return views["input_ids"].shape

    def _capacity(self, plan: Any, world: int, rank: int, start: int) -> int:
        """Elements of the largest padded batch this rank runs from ``start`` on (the Rust core's
        ``largest_padded``); a packed row's capacity."""
        if self._packed:
            return self._entries.capacity
        return plan.largest_padded(start, rank, self._settings["pad_to_multiple_of"])

    def _slots(self, capacity: int, steps: int) -> list[dict[str, Any] | None]:
        """``prefetch + 1`` slots of ``capacity`` elements per array (pinned for CUDA), at most one more
        than the ``steps`` left to run; a ring larger than the machine's memory is refused up front."""
        import torch

        dtype = getattr(torch, self._dtype)
        keys = PACKED_KEYS if self._packed else KEYS
        count = min(self.prefetch, steps) + 1
        ring = count * len(keys) * capacity * np.dtype(self._dtype).itemsize
        memory = _physical_memory()
        if memory is not None and ring > memory:
            why = f"more than this machine's {memory / 2**30:,.1f} GiB"
            raise ring_too_large(self.prefetch, self._settings["pad_to_multiple_of"], (count, capacity, ring), why)
        self._slot_bytes = 0
        if self._fresh:  # `prefetch` tokens bound the batches in flight; each gets a block of the pool
            self._capacity_now = capacity
            return [None] * (count - 1)
        slots: list[dict[str, Any] | None] = []
        try:
            for _ in range(count):
                block = torch.empty(len(keys) * capacity, dtype=dtype, pin_memory=self.pin_memory)
                slot = {"block": block, "numpy": block.numpy(), "keys": keys}
                if self._packed:  # a row holds at most `capacity` samples
                    cu = torch.empty(capacity + 1, dtype=torch.int32, pin_memory=self.pin_memory)
                    slot["cu_torch"], slot["cu_seqlens"] = cu, cu.numpy()
                slots.append(slot)
        except RuntimeError as error:  # torch's allocators report running out as a RuntimeError
            if "alloc" not in str(error).lower() and "out of memory" not in str(error).lower():
                raise
            why = "more than can be allocated now"
            raise ring_too_large(
                self.prefetch, self._settings["pad_to_multiple_of"], (count, capacity, ring), why
            ) from error
        self._slot_bytes = ring
        if self._packed:
            self._slot_bytes += len(slots) * (capacity + 1) * 4
        return slots

    def _fresh_slot(self) -> dict[str, Any]:
        """A block for one batch that no tensor handed out still refers to (see :mod:`dflash_batch.loading.blocks`).
        This runs once per batch in the trainer's thread: it stays a few lines of Python."""
        keys, capacity = self._keys, self._capacity_now
        n = len(keys) * capacity
        if not self._packed:
            tensor, array = self._pool.take(n)
            return {"block": tensor, "numpy": array, "keys": keys}
        cu_elements = -(-(capacity + 1) * 4 // self._pool.dtype.itemsize)
        tensor, array = self._pool.take(n + cu_elements)
        # cu_seqlens (int32) in the block's tail, so the block's counts cover the whole batch.
        cu = array[n : n + cu_elements].view(np.int32)[: capacity + 1]
        return {
            "block": tensor,
            "numpy": array[:n],
            "keys": keys,
            "cu_torch": tensor[n : n + cu_elements].view(self._int32)[: capacity + 1],
            "cu_seqlens": cu,
        }

    @property
    def memory_bytes(self) -> int:
        """Bytes of host memory the prefetch ring holds for the current epoch; on the CPU without
        ``reuse_buffers``, the blocks of the batches in flight and those the trainer still holds."""
        return self._pool.nbytes if self._fresh else self._slot_bytes

    # -- checkpoints ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state: the steps the trainer has received (not those prefetched)."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes at ``state``: the next iteration yields exactly the rest of its epoch. A refused state
        changes nothing — a running loop goes on; an accepted one supersedes it."""
        self.sampler.load_state_dict(state)
        self._stop_if_superseded()

    # -- shutdown ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stops the worker thread and waits for it (idempotent); a running loop then ends."""
        pipeline, self._pipeline = getattr(self, "_pipeline", None), None  # None if __init__ failed
        run, self._run = getattr(self, "_run", None), None
        if pipeline is not None:
            pipeline.close()
        if run is not None:
            run.finish(exhausted=False)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Loader({len(self.store)} rows, {len(self)} steps, prefetch={self.prefetch}, device={self.device}, "
            f"dtype={self._dtype}, pin_memory={self.pin_memory})"
        )


def _physical_memory() -> int | None:
    """Bytes of physical memory, where the system says (the Rust core reads it)."""
    return _core.physical_memory()

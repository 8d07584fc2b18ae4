"""``StepTimer``: the price ranks are balanced by, refitted from the run's own step times.

Rank balance is as good as its price ``a·L + b·L²``. The trainer times every micro-batch anyway, and the
plan knows what each one ran, so a :class:`StepTimer` records, per micro-batch, the seconds it took and
what it ran — padded: ``rows·L`` and ``rows·L²`` of its padded length ``L``; packed: ``Σ l`` and ``Σ l²`` of
its samples — and at each epoch's end fits ``seconds ≈ c + a·x + b·x²`` (non-negative least squares over
relative errors, refitted without the steps it misses by far: checkpoints, evaluation, GC). The fit is
applied to the next epoch's **rank balance only** (``BucketSampler(rank_cost=...)``): batches, budgets and
the step count stay as the sampler's ``cost`` forms them, so nothing a trainer counted changes.

A fit is applied only when it predicts held-back micro-batches better than the price in use
(:mod:`dflash_batch.pricing.price_fit`). Under ``torch.distributed`` every rank's records are gathered, rank 0
decides and broadcasts, so every rank plans with the same price (``end_epoch`` is then a collective). The
prices are part of the sampler's position: checkpoints carry them, and a resume plans every epoch with the
price it was trained with.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np

from .._core import PlanError
from ..base.arguments import _is_int
from .price_fit import Calibration, decide

log = logging.getLogger("dflash_batch")


class StepTimer:
    """Records each micro-batch's time and refits the sampler's rank price at epoch ends (module docs).

    Args:
        sampler: the :class:`BucketSampler` whose batches are timed (its ranks, mode and lengths).
        margin: a fit is applied when its held-back error is below ``(1 - margin) ×`` the price in use's.
        clock: seconds for :meth:`time` on the CPU (default ``time.perf_counter``).
        all_ranks_here: this one process records every rank's micro-batches (``record(..., rank=r)``: a
            simulation, or one process driving all ranks). Without it, a sampler of several ranks needs
            ``torch.distributed`` initialized when the timer is built: each rank's own timings would fit
            each its own price, and ranks balanced by different prices take their batches from different
            plans (samples trained twice and others never), so the timer refuses.

    Refused (``PlanError``) for a ``trim_steps=True`` sampler, whose steps are trimmed to a common cost that
    a new price would change.

    A torch loop::

        timer = db.StepTimer(sampler)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for batch in loader:                 # or: for indices in sampler
                with timer.time(batch):
                    model(**batch).loss.backward()
                ...
            timer.end_epoch()                    # every rank, when torch.distributed runs
    """

    def __init__(
        self,
        sampler: Any,
        *,
        margin: float = 0.1,
        clock: Callable[[], float] = time.perf_counter,
        all_ranks_here: bool = False,
    ) -> None:
        if isinstance(margin, bool) or not (isinstance(margin, int | float | np.number) and 0.0 <= margin < 1.0):
            raise ValueError(f"margin={margin!r} is invalid; pass a number in [0, 1), e.g. 0.1")
        if not callable(clock):
            raise TypeError(f"clock must be callable (seconds as a float), got {type(clock).__name__}")
        if not isinstance(all_ranks_here, bool | np.bool_):
            raise TypeError(f"all_ranks_here must be a bool, got {type(all_ranks_here).__name__}")
        _check_sampler(sampler, bool(all_ranks_here))
        self._all_here = bool(all_ranks_here)
        self._sampler, self._margin, self._clock = sampler, float(margin), clock
        schedule = sampler.schedule
        self._packed = schedule.mode == "packed"
        self._multiple = schedule.pad_to_multiple_of
        self._lengths: np.ndarray | None = None  # every entry's length, copied on first need
        # Records of the epoch: (rank, ordinal on that rank, x, x², seconds or a pending CUDA event pair).
        self._records: list[tuple[int, int, float, float, Any]] = []
        self._counts: dict[int, int] = {}
        self._epoch: int | None = None
        self._pending: tuple[Any, Any] | None = None  # a batch begun and not yet ended, and its start
        self.history: list[Calibration] = []

    @property
    def sampler(self) -> Any:
        """The sampler whose batches this timer times and re-prices."""
        return self._sampler

    # -- recording --------------------------------------------------------------------------------------

    def features(self, batch: Any) -> tuple[float, float]:
        """What ``batch`` runs: padded ``(rows·L, rows·L²)`` of its padded length ``L``, packed ``(Σ l, Σ l²)``.
        ``batch``: the sampler's index array, or a :class:`Loader` batch (``attention_mask`` or
        ``cu_seqlens``)."""
        lengths = self._batch_lengths(batch)
        if len(lengths) == 0:
            raise ValueError("an empty batch runs nothing to time; record the batches the sampler yields")
        if self._packed:
            return float(lengths.sum()), float((lengths**2).sum())
        longest = float(-(-int(lengths.max()) // self._multiple) * self._multiple)
        return len(lengths) * longest, len(lengths) * longest * longest

    def _batch_lengths(self, batch: Any) -> np.ndarray:
        if isinstance(batch, dict):
            # Padded spans under context parallelism: the kernels compute the padding too.
            keys = ("cu_seqlens_padded", "cu_seqlens", "cu_seq_lens_q")
            cu_key = next((key for key in keys if key in batch), None)
            if cu_key is not None:  # a Loader's packed row, or as hf.packed_inputs hands it to the model
                cu = np.asarray(_to_numpy(batch[cu_key]), dtype=np.float64)
                return np.diff(cu)[np.diff(cu) > 0]
            if "attention_mask" in batch:
                mask = _to_numpy(batch["attention_mask"])
                return np.asarray(mask, dtype=np.float64).reshape(len(mask), -1).sum(axis=1)
            raise TypeError(
                f"a batch dict needs 'attention_mask' (padded) or 'cu_seqlens' (packed) to be timed, got keys "
                f"{sorted(batch)}; pass the dflash_batch Loader's batch, or the sampler's index array"
            )
        entries = np.asarray(batch)
        if entries.dtype.kind not in "iu" or entries.ndim != 1:
            raise TypeError(
                f"batch must be the sampler's 1-D integer index array or a Loader batch dict, got "
                f"{type(batch).__name__} of dtype {getattr(entries, 'dtype', None)}"
            )
        if self._lengths is None:
            self._lengths = self._sampler.schedule.lengths().astype(np.float64)
        if entries.size and (entries.min() < 0 or entries.max() >= len(self._lengths)):
            raise IndexError(f"batch entries must be below {len(self._lengths)}, the entries this sampler plans")
        return self._lengths[entries]

    def record(self, batch: Any, seconds: float, *, rank: int | None = None) -> None:
        """Records that ``batch`` (one micro-batch) took ``seconds`` on ``rank`` (default: the sampler's; pass
        it to simulate several ranks in one process). Call in training order from the epoch's start."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float | np.number) or not math.isfinite(seconds):
            raise ValueError(f"seconds={seconds!r} is invalid; pass the micro-batch's time, a finite number")
        if seconds <= 0:
            raise ValueError(f"seconds={seconds!r} is invalid; a micro-batch takes a positive time")
        if not MIN_SECONDS <= seconds <= MAX_SECONDS:
            raise ValueError(
                f"seconds={seconds!r} is invalid; a micro-batch's time in seconds lies between {MIN_SECONDS:g} "
                f"(a nanosecond) and {MAX_SECONDS:g} (a day): pass seconds, not another unit"
            )
        self._add(batch, float(seconds), rank)

    def _add(self, batch: Any, seconds: Any, rank: int | None) -> None:
        rank = self._sampler.rank if rank is None else rank
        if not _is_int(rank) or not 0 <= rank < self._sampler.world_size:
            raise ValueError(f"rank={rank!r} is invalid; pass 0 ≤ rank < {self._sampler.world_size}")
        epoch = self._sampler.epoch
        if self._epoch is not None and epoch != self._epoch:
            raise PlanError(
                f"records of epoch {self._epoch} were not fitted before epoch {epoch} began; call "
                "timer.end_epoch() at the end of every epoch (on every rank)"
            )
        x, x2 = self.features(batch)
        self._epoch = epoch
        ordinal = self._counts.get(rank, 0)
        self._counts[rank] = ordinal + 1
        self._records.append((rank, ordinal, x, x2, seconds))

    @contextmanager
    def time(self, batch: Any) -> Iterator[None]:
        """Times the block (the micro-batch's forward, or forward and backward) and records it for ``batch``.
        On a GPU (a Loader batch of CUDA tensors) with CUDA events, read at :meth:`end_epoch` (no
        synchronization per step); else with ``clock``. A block that raises is not recorded."""
        self.begin(batch)
        try:
            yield
        except BaseException:
            self.cancel()
            raise
        self.end()

    def begin(self, batch: Any) -> None:
        """Starts timing ``batch``: what :meth:`time` does on entry, for hooks that bracket a step from two
        calls (a Lightning callback)."""
        if _cuda_device(batch) is None:
            self._pending = (batch, self._clock())
            return
        import torch

        begin = torch.cuda.Event(enable_timing=True)
        begin.record()
        self._pending = (batch, begin)

    def cancel(self) -> None:
        """Forgets the batch :meth:`begin` started (a step that never reached what :meth:`end` marks)."""
        self._pending = None

    def end(self) -> None:
        """Records the batch :meth:`begin` started; without one, nothing (a hook the step skipped)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        batch, start = pending
        if isinstance(start, float):
            self.record(batch, self._clock() - start)
            return
        import torch

        finish = torch.cuda.Event(enable_timing=True)
        finish.record()
        self._add(batch, (start, finish), None)

    # -- fitting ----------------------------------------------------------------------------------------

    def end_epoch(self) -> Calibration:
        """Fits this epoch's records (every rank's, gathered: a collective under ``torch.distributed``), and
        when the fit predicts held-back micro-batches better than the price in use, balances the ranks of the
        next epoch on by it. Logs and returns what it found (also in :attr:`history`); clears the records."""
        _check_sampler(self._sampler, self._all_here)  # a process group destroyed since: still refused
        records = [(r, o, x, x2, _seconds(s)) for r, o, x, x2, s in self._records]
        records = [r for r in records if MIN_SECONDS <= r[4] <= MAX_SECONDS]  # CUDA events read as 0 ms
        epoch = self._sampler.epoch if self._epoch is None else self._epoch
        before = self._sampler.rank_price(epoch)
        gathered = records if self._all_here else _gather(records)
        decision = decide(gathered, before, epoch, self._margin, self._sampler.world_size)
        decision = decision if self._all_here else _broadcast(decision)
        if decision.applied and decision.price is not None:
            # The epoch after the records', or after the one under way when it has begun since.
            start = self._sampler.position.price_after(epoch, decision.price)
            decision = replace(decision, from_epoch=start)
        self._records, self._counts, self._epoch = [], {}, None
        self.history.append(decision)
        log.info("dflash_batch StepTimer: %s", decision)
        return decision


#: The shortest and longest micro-batch time taken, in seconds: below, a denormal or a clock's zero; above,
#: another unit (a timestamp, milliseconds of a long step).
MIN_SECONDS, MAX_SECONDS = 1e-9, 86_400.0


def _check_sampler(sampler: Any, all_here: bool) -> None:
    """Refuses a sampler whose ranks could not share one refitted price (see :class:`StepTimer`)."""
    from ..base.ranks import process_group_size

    if sampler.schedule.config.get("trim_steps"):
        raise PlanError(
            "a StepTimer cannot re-price a trim_steps=True sampler: its steps are trimmed to a common cost "
            "that a new rank price would change (and the step count with it); build the sampler without "
            "trim_steps to let a StepTimer balance its ranks, or keep trim_steps and drop the StepTimer"
        )
    if sampler.world_size > 1 and not all_here and not process_group_size():
        raise PlanError(
            f"this sampler plans for world_size={sampler.world_size} ranks, but torch.distributed is not "
            "initialized: this process's StepTimer would fit its own timings alone and balance the next epochs "
            "by a price the other ranks never see, and ranks balanced by different prices train batches of "
            "different plans (samples twice, others never). Call torch.distributed.init_process_group() "
            "before building the StepTimer (its end_epoch then gathers every rank's timings and broadcasts one "
            "price), or fix the price with BucketSampler(rank_cost=(a, b)); a single process that records "
            "every rank's micro-batches passes StepTimer(sampler, all_ranks_here=True)"
        )


def _gather(records: list[Any]) -> list[Any]:
    """Every rank's records, rank by rank (this process's alone without a process group)."""
    from ..base.ranks import process_group_size

    if not process_group_size():
        return records
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, records)
    return [r for part in gathered for r in part]


def _broadcast(decision: Calibration) -> Calibration:
    """Rank 0's decision on every rank (a BLAS on another machine may round a fit differently)."""
    from ..base.ranks import process_group_size

    if not process_group_size():
        return decision
    import torch.distributed as dist

    box = [decision]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _seconds(value: Any) -> float:
    if isinstance(value, tuple):  # CUDA events: read once, at the epoch's end
        begin, end = value
        end.synchronize()
        return float(begin.elapsed_time(end)) / 1e3
    return float(value)


def _to_numpy(value: Any) -> Any:
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return value


def _cuda_device(batch: Any) -> Any:
    if not isinstance(batch, dict):
        return None
    for value in batch.values():
        device = getattr(value, "device", None)
        if device is not None and getattr(device, "type", None) == "cuda":
            return device
    return None

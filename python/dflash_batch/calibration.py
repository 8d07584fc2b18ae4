"""``StepTimer``: the price ranks are balanced by, refitted from the run's own step times.

Rank balance is as good as its price ``a·L + b·L²``. The trainer times every micro-batch anyway, and the
plan knows what each one ran, so a :class:`StepTimer` records, per micro-batch, the seconds it took and
what it ran — padded: ``rows·L`` and ``rows·L²`` of its padded length ``L``; packed: ``Σ l`` and ``Σ l²`` of
its samples — and at each epoch's end fits ``seconds ≈ c + a·x + b·x²`` (non-negative least squares over
relative errors, refitted without the steps it misses by far: checkpoints, evaluation, GC). The fit is
applied to the next epoch's **rank balance only** (``BucketSampler(rank_cost=...)``): batches, budgets and
the step count stay as the sampler's ``cost`` forms them, so nothing a trainer counted changes.

A fit is applied only when it predicts held-back micro-batches (every fourth) better than the price in use
(median relative error, by ``margin``); the held-back ones then join the fit. Under ``torch.distributed``
every rank's records are gathered, rank 0 decides and broadcasts, so every rank plans with the same price
(``end_epoch`` is then a collective). The prices are part of the sampler's position: checkpoints carry them,
and a resume plans every epoch with the price it was trained with.

The fit is plain numpy: the core plans with whatever price it is given.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ._core import PlanError
from .cost import _nonnegative_fit

log = logging.getLogger("dflash_batch")

#: A micro-batch whose time is off the fit by more than this many median deviations (relative) is left out.
OUTLIER_DEVIATIONS = 5.0
#: Micro-batches recorded (over all ranks) below which an epoch's records are not fitted.
MIN_RECORDS = 24


@dataclass(frozen=True)
class Calibration:
    """What :meth:`StepTimer.end_epoch` found for ``epoch``'s records (every rank's).

    ``fitted``: the fit's ``(a, b, c)`` in seconds (``None`` when too few records); ``price``: the fit as a
    rank price ``(1, b/a)``; ``error``/``error_before``: median relative error of the fit and of the price in
    use (scaled to seconds) on the held-back micro-batches; ``applied``: whether the next epochs balance by
    ``price``, from ``from_epoch``; ``records``/``dropped``: micro-batches fitted and left out as outliers;
    ``measured``: the synchronous efficiency per micro-batch the ranks' times show (``None`` on one rank);
    ``predicted``/``predicted_before``: what the fit and the price in use predict for the same micro-batches.
    """

    epoch: int
    price_before: tuple[float, float]
    fitted: tuple[float, float, float] | None
    price: tuple[float, float] | None
    error: float | None
    error_before: float | None
    applied: bool
    from_epoch: int | None
    records: int
    dropped: int
    measured: float | None
    predicted: float | None
    predicted_before: float | None
    reason: str

    def __str__(self) -> str:
        if self.fitted is None:
            return f"epoch {self.epoch}: rank price kept at {self.price_before} ({self.reason})"
        verb = f"applied from epoch {self.from_epoch}" if self.applied else "not applied"
        balance = ""
        if self.measured is not None:
            balance = (
                f"; balance measured {self.measured:.3f}, predicted {self.predicted:.3f} by the fit, "
                f"{self.predicted_before:.3f} by the price in use"
            )
        return (
            f"epoch {self.epoch}: fitted rank price {self.price} {verb} "
            f"(held-back error {self.error:.1%} vs {self.error_before:.1%}; {self.records} micro-batches, "
            f"{self.dropped} outliers){balance} — {self.reason}"
        )


class StepTimer:
    """Records each micro-batch's time and refits the sampler's rank price at epoch ends (module docs).

    Args:
        sampler: the :class:`BucketSampler` whose batches are timed (its ranks, mode and lengths).
        margin: a fit is applied when its held-back error is below ``(1 - margin) ×`` the price in use's.
        clock: seconds for :meth:`time` on the CPU (default ``time.perf_counter``).

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

    def __init__(self, sampler: Any, *, margin: float = 0.1, clock: Callable[[], float] = time.perf_counter) -> None:
        if not (isinstance(margin, int | float) and 0.0 <= margin < 1.0):
            raise ValueError(f"margin={margin!r} is invalid; pass a number in [0, 1), e.g. 0.1")
        if not callable(clock):
            raise TypeError(f"clock must be callable (seconds as a float), got {type(clock).__name__}")
        self._sampler, self._margin, self._clock = sampler, float(margin), clock
        schedule = sampler.schedule
        self._packed = schedule.mode == "packed"
        self._multiple = schedule.pad_to_multiple_of
        self._lengths: np.ndarray | None = None  # every entry's length, copied on first need
        # Records of the epoch: (rank, ordinal on that rank, x, x², seconds or a pending CUDA event pair).
        self._records: list[tuple[int, int, float, float, Any]] = []
        self._counts: dict[int, int] = {}
        self._epoch: int | None = None
        self.history: list[Calibration] = []

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
            if "cu_seqlens" in batch:
                cu = np.asarray(_to_numpy(batch["cu_seqlens"]), dtype=np.float64)
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
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
            raise ValueError(f"seconds={seconds!r} is invalid; pass the micro-batch's time, a finite number")
        if seconds <= 0:
            raise ValueError(f"seconds={seconds!r} is invalid; a micro-batch takes a positive time")
        self._add(batch, float(seconds), rank)

    def _add(self, batch: Any, seconds: Any, rank: int | None) -> None:
        rank = self._sampler.rank if rank is None else rank
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self._sampler.world_size:
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
        """Times the block (the micro-batch's forward and backward) and records it for ``batch``. On a GPU
        (a Loader batch of CUDA tensors) with CUDA events, read at :meth:`end_epoch` (no synchronization
        per step); else with ``clock``. A block that raises is not recorded."""
        device = _cuda_device(batch)
        if device is None:
            start = self._clock()
            yield
            self.record(batch, self._clock() - start)
            return
        import torch

        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        yield
        end.record()
        self._add(batch, (begin, end), None)

    # -- fitting ----------------------------------------------------------------------------------------

    def end_epoch(self) -> Calibration:
        """Fits this epoch's records (every rank's, gathered: a collective under ``torch.distributed``), and
        when the fit predicts held-back micro-batches better than the price in use, balances the ranks of the
        next epoch on by it. Logs and returns what it found (also in :attr:`history`); clears the records."""
        records = [(r, o, x, x2, _seconds(s)) for r, o, x, x2, s in self._records]
        epoch = self._sampler.epoch if self._epoch is None else self._epoch
        before = self._sampler.rank_price(epoch)
        gathered = _gather(records)
        decision = _decide(gathered, before, epoch, self._margin, self._sampler.world_size)
        decision = _broadcast(decision)
        if decision.applied and decision.price is not None:
            # The epoch after the records', or after the one under way when it has begun since.
            start, position = epoch + 1, self._sampler.position
            if position.epoch > start or (position.epoch == start and (position.step or position.running)):
                start = position.epoch + 1
            position.price_from(start, decision.price)
            decision = replace(decision, from_epoch=start)
        self._records, self._counts, self._epoch = [], {}, None
        self.history.append(decision)
        log.info("dflash_batch StepTimer: %s", decision)
        return decision


def _decide(
    records: list[tuple[int, int, float, float, float]],
    before: tuple[float, float],
    epoch: int,
    margin: float,
    world: int,
) -> Calibration:
    """The fit of ``records`` and whether it replaces the price ``before`` (see the module docs)."""
    keep: dict[str, Any] = {"epoch": epoch, "price_before": before, "from_epoch": epoch + 1}
    if len(records) < MIN_RECORDS:
        return Calibration(
            **keep, fitted=None, price=None, error=None, error_before=None, applied=False, records=len(records),
            dropped=0, measured=None, predicted=None, predicted_before=None,
            reason=f"{len(records)} micro-batches recorded, fewer than the {MIN_RECORDS} a fit needs",
        )  # fmt: skip
    data = np.asarray(records, dtype=np.float64)
    x, x2, seconds = data[:, 2], data[:, 3], data[:, 4]
    held = np.arange(len(data)) % 4 == 3
    fit, _ = robust_fit(x[~held], x2[~held], seconds[~held])
    scaled, _ = robust_fit(x[~held], x2[~held], seconds[~held], price=before)
    error = _median_error(fit, x[held], x2[held], seconds[held])
    error_before = _median_error(scaled, x[held], x2[held], seconds[held])
    full, used_all = robust_fit(x, x2, seconds)
    a, b, c = full
    price = (1.0, b / a) if a > 0 else (0.0, 1.0)
    if a > 0 and 0 < price[1] < 1e-12:
        price = (1.0, 0.0)
    applied = error < (1.0 - margin) * error_before
    reason = (
        "it predicts held-back micro-batches better than the price in use"
        if applied
        else "it does not predict held-back micro-batches better than the price in use by the margin"
    )
    measured, predicted, predicted_before = _balance(data, full, before, world)
    return Calibration(
        **keep, fitted=(a, b, c), price=price, error=error, error_before=error_before, applied=applied,
        records=int(used_all.sum()), dropped=int((~used_all).sum()), measured=measured, predicted=predicted,
        predicted_before=predicted_before, reason=reason,
    )  # fmt: skip


def robust_fit(
    x: np.ndarray, x2: np.ndarray, seconds: np.ndarray, *, price: tuple[float, float] | None = None
) -> tuple[tuple[float, float, float], np.ndarray]:
    """``seconds ≈ c + a·x + b·x2`` by non-negative least squares over relative errors, refitted twice
    without the records off by more than :data:`OUTLIER_DEVIATIONS` median deviations; with ``price``
    ``(p, q)``, only a scale ``s`` and ``c`` are fitted (``a = s·p``, ``b = s·q``): the price in use, in
    seconds. Returns ``(a, b, c)`` and which records were kept."""
    kept = np.ones(len(seconds), dtype=bool)
    coefficients = (0.0, 0.0, 0.0)
    for _ in range(3):
        if price is None:
            columns = np.stack([x, x2, np.ones_like(x)], axis=1)
        else:
            columns = np.stack([price[0] * x + price[1] * x2, np.ones_like(x)], axis=1)
        w = _nonnegative_fit(columns[kept] / seconds[kept, None], np.ones(int(kept.sum())))
        fitted = columns @ w
        relative = np.abs(fitted - seconds) / seconds
        deviation = float(np.median(np.abs(relative[kept] - np.median(relative[kept]))))
        limit = np.median(relative[kept]) + OUTLIER_DEVIATIONS * max(deviation, 1e-3)
        again = relative <= limit
        coefficients = (float(w[0]), float(w[1]), float(w[2])) if price is None else (
            float(w[0] * price[0]), float(w[0] * price[1]), float(w[1]))  # fmt: skip
        if again.sum() < 3 or np.array_equal(again, kept):
            break
        kept = again
    return coefficients, kept


def _median_error(fit: tuple[float, float, float], x: np.ndarray, x2: np.ndarray, seconds: np.ndarray) -> float:
    a, b, c = fit
    return float(np.median(np.abs(c + a * x + b * x2 - seconds) / seconds))


def _balance(
    data: np.ndarray, fit: tuple[float, float, float], before: tuple[float, float], world: int
) -> tuple[float | None, float | None, float | None]:
    """Synchronous efficiency per micro-batch over the ordinals every rank recorded: measured, predicted by
    ``fit`` and by the price ``before`` (``None`` on one rank)."""
    if world < 2:
        return None, None, None
    ranks, ordinals = data[:, 0].astype(np.int64), data[:, 1].astype(np.int64)
    steps = int(min((ordinals[ranks == r].max() + 1) if np.any(ranks == r) else 0 for r in range(world)))
    if steps == 0:
        return None, None, None
    a, b, c = fit
    inside = ordinals < steps
    grid = np.zeros((3, steps, world))
    for row, rank, ordinal in zip(data[inside], ranks[inside], ordinals[inside], strict=True):
        grid[:, ordinal, rank] = (row[4], c + a * row[2] + b * row[3], before[0] * row[2] + before[1] * row[3])
    figures = [float(g.sum() / (world * g.max(axis=1).sum())) for g in grid]
    return figures[0], figures[1], figures[2]


def _gather(records: list[Any]) -> list[Any]:
    """Every rank's records, rank by rank (this process's alone without a process group)."""
    from .distributed import process_group_size

    if not process_group_size():
        return records
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, records)
    return [r for part in gathered for r in part]


def _broadcast(decision: Calibration) -> Calibration:
    """Rank 0's decision on every rank (a BLAS on another machine may round a fit differently)."""
    from .distributed import process_group_size

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

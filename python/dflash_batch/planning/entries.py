"""What a consumer of a plan needs to read it, from the schedule that planned it and nothing of the
position: each entry's dataset row and token window (``oversize="truncate"`` plans the later pieces of
long samples as entries of their own), each row's source in a mixture, and the label tokens of every
optimizer step of a plan. The :class:`~dflash_batch.Loader` reads its batches through one of these and
its iteration's plan, so collating a batch never asks the sampler; the sampler's own ``pieces``,
``sources_of`` and ``label_tokens`` are these.

None of it depends on the epoch or the rank price: a schedule replaced by a new price reads the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._core import Plan, PlanError
from . import label_tokens


class Entries:
    """The entries of ``schedule``'s plans, as a consumer reads them (see the module docs)."""

    __slots__ = ("_schedule", "capacity", "count", "mixed", "piece_multiple", "sources", "truncated")

    def __init__(self, schedule: Any) -> None:
        self._schedule = schedule
        #: Whether entries may be later pieces of long samples (then a batch goes through :meth:`pieces`).
        self.truncated = bool(schedule.truncated)
        #: The token budget per batch (a packed row's capacity), or 0 with ``batch_size``.
        self.capacity = int(schedule.max_tokens or 0)
        #: Entries a plan indexes: the rows, then the later pieces of split samples.
        self.count = int(schedule.entries)
        #: What every sample of a packed row is padded to a multiple of (context parallelism; 1: none).
        self.piece_multiple = int(schedule.config.piece_multiple)
        #: Whether rows belong to a mixture's sources.
        self.mixed = schedule.mixture is not None
        #: Sources the rows belong to (1 without a mixture).
        self.sources = len(schedule.mixture.names) if self.mixed else 1

    def pieces(self, batch: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(rows, starts, lengths)`` of a batch's entries, uint32: entry ``s`` trains tokens
        ``starts[s] : starts[s] + lengths[s]`` of dataset row ``rows[s]``."""
        given = np.asarray(batch)
        if given.size and given.dtype.kind not in "iu":  # 0.5 would have been read as entry 0
            raise TypeError(f"batch must hold integer entries, got dtype {given.dtype}")
        entries = np.ascontiguousarray(given, dtype=np.int64)
        if entries.ndim != 1:
            raise PlanError(
                f"batch must be a 1-D array of entries of this sampler's plans (0 ≤ entry < {self._schedule.entries})"
            )
        return self._schedule.locate(entries)

    def sources_of(self, rows: Any) -> np.ndarray:
        """The source number (int64) of each of ``rows``: all 0 without a mixture."""
        return self._schedule.sources_of(rows)

    def label_tokens(self, plan: Plan, accumulation: int, store: Any = None, by_source: bool = False) -> np.ndarray:
        """Label tokens of every optimizer step of ``plan`` (``accumulation`` micro-batches on every rank),
        int64; ``by_source``: steps × sources (see :mod:`dflash_batch.planning.label_tokens`)."""
        counts = label_tokens.per_entry(self._schedule, store)
        if not by_source:
            return label_tokens.per_step(plan, counts, accumulation)
        return label_tokens.per_step_by_source(plan, counts, accumulation, self.sources_of, self.sources)

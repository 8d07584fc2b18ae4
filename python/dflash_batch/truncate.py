"""``oversize="truncate"``: samples longer than the packed row cut into ``max_tokens``-token pieces, each
planned like a sample of its own (see ``BucketSampler.pieces``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import dflash_batch._core as _core

from ._core import PlanError


@dataclasses.dataclass(frozen=True)
class _Pieces:
    """The pieces past the first of samples longer than the row capacity (``oversize="truncate"``):
    piece ``k`` is tokens ``starts[k] : starts[k] + C`` (or to the sample's end) of row ``rows[k]``."""

    rows: np.ndarray
    starts: np.ndarray
    split: int


def _split_long(chunks: list[np.ndarray], capacity: int) -> tuple[list[np.ndarray], _Pieces | None]:
    """The lengths the planner plans when long samples are split into ``capacity``-token pieces: every
    row's first piece (``min(L, C)``) in row order, then the later pieces (the Rust core's
    ``plan::truncate``; see ``BucketSampler.pieces``)."""
    if capacity <= 0:
        return chunks, None  # the planner refuses the budget with its own message
    split = _core.split_long(chunks, capacity)
    if split is None:
        return chunks, None
    planned, rows, starts, count = split
    return [planned], _Pieces(rows=rows, starts=starts, split=count)


def _locate(pieces: _Pieces | None, batch: Any, samples: int, planned: np.ndarray) -> tuple:
    """``(rows, starts, lengths)`` of a batch's plan entries (see ``BucketSampler.pieces``)."""
    given = np.asarray(batch)
    if given.size and given.dtype.kind not in "iu":  # 0.5 would have been read as entry 0
        raise TypeError(f"batch must hold integer entries, got dtype {given.dtype}")
    entries = np.ascontiguousarray(given, dtype=np.int64)
    if entries.ndim != 1:
        raise PlanError(f"batch must be a 1-D array of entries of this sampler's plans (0 ≤ entry < {len(planned)})")
    if pieces is None:
        return _core.locate_pieces(entries, samples, planned)
    return _core.locate_pieces(entries, samples, planned, pieces.rows, pieces.starts)

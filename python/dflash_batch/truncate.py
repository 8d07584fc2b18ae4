"""``oversize="truncate"``: samples longer than the packed row cut into ``max_tokens``-token pieces, each
planned like a sample of its own (see ``BucketSampler.pieces``)."""

from __future__ import annotations

import dataclasses

import numpy as np

from ._core import PlanError

_U32_MAX = 2**32 - 1


@dataclasses.dataclass(frozen=True)
class _Pieces:
    """The pieces past the first of samples longer than the row capacity (``oversize="truncate"``):
    piece ``k`` is tokens ``starts[k] : starts[k] + C`` (or to the sample's end) of row ``rows[k]``."""

    rows: np.ndarray
    starts: np.ndarray
    split: int


def _split_long(chunks: list[np.ndarray], capacity: int) -> tuple[list[np.ndarray], _Pieces | None]:
    """The lengths the planner plans when long samples are split into ``capacity``-token pieces: every
    row's first piece (``min(L, C)``) in row order, then the later pieces (see ``BucketSampler.pieces``).

    Arrays the size of the pieces are uint32 (4 bytes a piece): a billion pieces (a sample of billions
    of tokens cut into tiny rows) took six int64 temporaries, 50 GB, and the process was killed."""
    lengths = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
    if capacity <= 0 or lengths.size == 0 or lengths.max() <= capacity:
        return chunks, None  # nothing to split (bad values are the planner's to report)
    long_rows = np.flatnonzero(lengths > capacity)
    long_lengths = lengths[long_rows].astype(np.int64)
    if long_lengths.max() > _U32_MAX:
        return chunks, None  # lengths past uint32 are the planner's to report
    later = (long_lengths + capacity - 1) // capacity - 1  # pieces after the first, per long row (≥ 1)
    total = int(later.sum())
    if lengths.size + total > _U32_MAX:
        raise PlanError(
            f"oversize='truncate' would cut {len(long_rows):,} long sample(s) into {total:,} more pieces of at most "
            f"max_tokens={capacity} tokens, past the {_U32_MAX:,} entries a plan holds; raise max_tokens or pass "
            "oversize='skip'"
        )
    rows = np.repeat(long_rows.astype(np.uint32), later)
    # Piece k = 1, 2, … of a row starts at k·C: a running sum of C that restarts at each row's first piece,
    # where the step takes back the previous row's last start. Steps wrap in uint32, and every running
    # sum is a start below 2^32, so the sums are exact.
    steps = np.full(total, capacity, dtype=np.uint32)
    firsts = np.cumsum(later) - later
    steps[firsts[1:]] = (capacity - later[:-1] * capacity) & _U32_MAX
    starts = np.cumsum(steps, dtype=np.uint32)
    del steps
    piece_lengths = np.repeat(long_lengths.astype(np.uint32), later)
    piece_lengths -= starts
    np.minimum(piece_lengths, capacity, out=piece_lengths)
    first = np.minimum(lengths, capacity)
    planned = np.concatenate([first, piece_lengths.astype(first.dtype, copy=False)])
    return [planned], _Pieces(rows=rows, starts=starts, split=len(long_rows))

"""``Batches``: what ``iter(sampler)`` returns — this rank's index batches of the current epoch, one
:class:`~dflash_batch.planning.cursor.Run` of the position — and the view of every rank's batches that a client
sharding the batches itself (accelerate's ``BatchSamplerShard``) iterates.

It begins at its first ``next()`` (so ``set_epoch`` between ``iter()`` and the first batch applies), counts
every batch it hands out, and raises ``RuntimeError`` if a call moved the position while it was going.

It is a torchdata ``Stateful`` (``state_dict`` / ``load_state_dict``): torchdata's ``StatefulDataLoader``
snapshots an iterator's state as it takes each batch and keeps the snapshot of the last batch its loop
received, so its own ``state_dict()`` is exact even with workers fetching ahead; on a resume it loads the
state into a new iterator before any batch is taken.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .cursor import Cursor, Run


class Batches:
    """Index batches of ``shares`` (rank numbers) of every step of the current epoch, from the resumed
    step; ``shares`` of all ranks yield every batch of the plan in order (see the module docs)."""

    def __init__(
        self,
        cursor: Cursor,
        shares: tuple[int, ...] | range,
        begin: Callable[[], Run] | None = None,
        convert: Callable[[np.ndarray], Any] | None = None,
    ) -> None:
        # ``begin``: how a run starts (the sampler's checks ranks agree first); default the cursor's own.
        self._cursor, self._shares, self._convert = cursor, shares, convert
        self._begin = begin or cursor.begin
        self._run: Run | None = None
        self._batches: Iterator[tuple[int, np.ndarray]] | None = None
        self._last, self._ended = -1, False

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> Any:
        if self._ended:
            raise StopIteration
        if self._run is None:
            self._run = self._begin()
            self._batches = self._run.batches(self._shares)
            self._last = self._run.start - 1
        assert self._batches is not None
        try:
            step, batch = next(self._batches)
        except StopIteration:
            self._run.check()  # a superseded run must not end as if it had finished the epoch
            self._end(exhausted=True)
            raise
        if step != self._last:  # the first batch of a step hands the step out
            self._run.advance(step + 1)
            self._last = step
        else:
            self._run.check()
        return batch if self._convert is None else self._convert(batch)

    def _end(self, exhausted: bool) -> None:
        if not self._ended:
            self._ended = True
            if self._run is not None:
                self._run.finish(exhausted)

    def close(self) -> None:
        """Ends this iteration (a pending resume that handed nothing out is kept)."""
        self._end(exhausted=False)

    def __del__(self) -> None:
        self._end(exhausted=False)

    # -- torchdata's Stateful protocol ----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The position as of the batches this iteration handed out (what a loader that snapshots it as it
        takes each batch, as ``StatefulDataLoader`` does, wants)."""
        if self._run is not None:
            self._run.check()
        return self._cursor.state_dict(self._cursor.step)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes at ``state``; only before this iteration handed out a batch."""
        if self._run is not None:
            raise RuntimeError(
                "load_state_dict on an iteration that has begun: load the state into the sampler (or a new "
                "iterator) before the first batch"
            )
        self._cursor.load_state_dict(state)


class GlobalBatches:
    """Every rank's batches of a sampler's current epoch in plan order — what a client that shards batches
    itself takes as its batch sampler (accelerate's ``BatchSamplerShard`` hands rank ``r`` every
    ``world_size``-th batch from the ``r``-th: exactly its share of the plan). The sampler's position
    counts steps, as for its own iteration. Deliberately not ``Stateful``: the client's loader saves the
    position (accelerate's stateful loaders fast-forward this sampler, which costs no collation)."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler  # accelerate's DataLoaderShard.set_epoch reaches the sampler through this

    def __iter__(self) -> Batches:
        sampler = self.sampler
        return Batches(sampler.position, range(sampler.world_size), begin=sampler.begin, convert=_as_list)

    def __len__(self) -> int:
        return len(self.sampler) * self.sampler.world_size

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __repr__(self) -> str:
        return f"GlobalBatches({self.sampler!r})"


def _as_list(batch: np.ndarray) -> list[int]:
    return batch.tolist()

"""`Windows` in torch ``DataLoader`` workers: each worker takes every ``k``-th batch of the rank's windows.

``DataLoader(windows.iterable(), batch_size=None, num_workers=k, collate_fn=...)``: each of the ``k`` workers
holds its own forked copy of the :class:`~dflash_batch.Windows`, reads the same windows, plans them alike (a
window's plan is a pure function of its examples and settings) and hands out batches ``w, w + k, w + 2k, …`` of
the rank's order, making Python examples of those rows only. The ``DataLoader`` takes one batch from each worker
in turn, so the loop sees the rank's batches in their order, exactly as when iterating the ``Windows`` itself.

What the training process can no longer see is how far the workers got, so ``state_dict`` asks for it:
``windows.state_dict(step=n)``, ``n`` the batches the loop trained since the iteration began (it plans the
windows from the iteration's start again to find where ``n`` ends). Workers are forked at each ``iter(loader)``
from the training process's object, so ``set_epoch`` and ``load_state_dict`` reach them; persistent workers
would keep a stale copy, and are refused when they start a second pass. Ranks compare windows only when
planning them in the training process (a worker cannot use the process group): the comparison is skipped in
workers.

This module imports torch, and is imported by :meth:`Windows.iterable` only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Protocol

from torch.utils.data import IterableDataset, get_worker_info


class _Split(Protocol):
    """What a worker needs of a :class:`~dflash_batch.Windows`: its batches, all or a worker's share."""

    def __iter__(self) -> Iterator[list[Any]]: ...

    def _iterate(self, split: tuple[int, int] | None) -> Iterator[list[Any]]: ...


class WorkerBatches(IterableDataset[list[Any]]):
    """This rank's batches of ``windows``, split among the ``DataLoader``'s workers (see the module docs)."""

    def __init__(self, windows: _Split) -> None:
        self._windows = windows
        self._started_in: int | None = None  # the worker process that iterated this copy

    def __iter__(self) -> Iterator[list[Any]]:
        info = get_worker_info()
        if info is None:  # num_workers=0: the training process iterates the Windows itself
            return iter(self._windows)
        if self._started_in == os.getpid():
            # Raised at the first batch, not here: the DataLoader hands a batch's exception to the training
            # process, while one raised as a worker starts its pass only kills the worker.
            return _refused_again()
        self._started_in = os.getpid()
        return self._windows._iterate((info.id, info.num_workers))

    def __reduce__(self) -> Any:
        raise TypeError(
            "Windows.iterable() reaches DataLoader workers by fork (each worker copies the training process's "
            "position); with another start method, pass multiprocessing_context='fork' to the DataLoader, or "
            "iterate the Windows in the loop"
        )


def _refused_again() -> Iterator[list[Any]]:
    raise RuntimeError(
        "a Windows iterated by persistent DataLoader workers (persistent_workers=True): a worker's copy would not "
        "see set_epoch or load_state_dict and would replay its first pass; use persistent_workers=False (workers "
        "forked at each iter(loader))"
    )
    yield []  # a generator: raised at the first batch

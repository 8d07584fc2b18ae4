"""accelerate: a sampler's batches in a prepared ``DataLoader``, and a :class:`~dflash_batch.Loader` under
``accelerator.accumulate``.

Prepared ``DataLoader`` (``accelerator.prepare(DataLoader(dataset, batch_sampler=...))``): accelerate
shards the batch sampler itself (rank ``r`` takes every ``world_size``-th batch from the ``r``-th), so
give it :func:`batch_sampler`, every rank's batches in plan order. Its prepared loader reads one batch
ahead of the loop, so the position is saved by accelerate's own stateful loaders:
``Accelerator(dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))`` makes
``save_state`` / ``load_state`` save and restore the loader exactly (nothing to register). The bare
sampler handed to ``prepare`` on several processes is refused when it starts (each rank would train a
``world_size``-th of its share), and its own ``state_dict()`` is refused while accelerate reads ahead.

A :class:`~dflash_batch.Loader`: ``accelerator.prepare`` returns it as it is; wrap it with :func:`loader`
so ``accelerator.accumulate`` knows where each epoch ends (the short last window of an epoch is an
optimizer step of its own), through accelerate's public ``DataLoaderStateMixin``. Its ``state_dict()``
is the Loader's, exact (the Loader counts what it handed to the loop, not what it prefetched): register
it with ``accelerator.register_for_checkpointing``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import accelerate
from accelerate.data_loader import DataLoaderStateMixin
from accelerate.state import GradientState

from ..loading.loader import Loader
from ..planning.batches import GlobalBatches
from ..planning.sampler import BucketSampler
from .versions import require

require(accelerate)

__all__ = ["AcceleratedLoader", "EpochState", "batch_sampler", "epoch_state", "loader"]


def batch_sampler(sampler: BucketSampler) -> GlobalBatches:
    """Every rank's batches of ``sampler`` in plan order, for ``DataLoader(batch_sampler=...)`` prepared by
    accelerate (its shard hands each process exactly its share)."""
    if not isinstance(sampler, BucketSampler):
        raise TypeError(f"sampler must be a dflash_batch.BucketSampler, got {type(sampler).__name__}")
    return GlobalBatches(sampler)


def epoch_state(sampler: BucketSampler) -> EpochState:
    """The sampler's epoch as accelerate checkpoints it: ``accelerator.register_for_checkpointing(
    epoch_state(sampler))``. A prepared ``DataLoader``'s stateful loader saves how many batches of the epoch
    were trained, not which epoch: after ``accelerator.load_state``, ``sampler.epoch`` is then the
    checkpoint's, and a loop that continues from it is exact::

        accelerator.load_state(checkpoint)
        for epoch in range(sampler.epoch, epochs):
            loader.set_epoch(epoch)
            for batch in loader: ..."""
    if not isinstance(sampler, BucketSampler):
        raise TypeError(f"sampler must be a dflash_batch.BucketSampler, got {type(sampler).__name__}")
    return EpochState(sampler)


class EpochState:
    """accelerate's checkpointing protocol (``state_dict`` / ``load_state_dict``) over a sampler's epoch."""

    def __init__(self, sampler: BucketSampler) -> None:
        self.sampler = sampler

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.sampler.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.set_epoch(state["epoch"])  # checked as every epoch is (an int in [0, 2**64))


def loader(loader: Loader) -> AcceleratedLoader:
    """``loader`` as accelerate's gradient accumulation sees a prepared loader (see the module docs)."""
    if not isinstance(loader, Loader):
        raise TypeError(f"loader must be a dflash_batch.Loader, got {type(loader).__name__}")
    return AcceleratedLoader(loader)


class AcceleratedLoader(DataLoaderStateMixin):
    """A :class:`~dflash_batch.Loader` that tells accelerate's ``GradientState`` while it iterates and when
    it hands out the last batch of its epoch (accelerate's documented ``DataLoaderStateMixin``)."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self.gradient_state = GradientState()  # what DataLoaderStateMixin's begin/end register with
        self._drop_last = True  # the mixin's remainder is for a dataset split in equal batches: not ours

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.begin()
        try:
            steps = self.loader.sampler.plan().steps
            for batch in self.loader:
                self.end_of_dataloader = self.loader.sampler.position.step == steps
                yield batch
        finally:
            self.end()

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)

    @property
    def sampler(self) -> BucketSampler:
        return self.loader.sampler

    def __repr__(self) -> str:
        return f"AcceleratedLoader({self.loader!r})"

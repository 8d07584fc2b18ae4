"""A torch ``DataLoader`` over a sampler. A plain ``torch.utils.data.DataLoader`` with workers takes
batches ahead of the training loop, and nothing public says how many it holds: its sampler's
``state_dict()`` counts every batch handed out, so pass ``state_dict(step=<batches trained>)``. Or use
torchdata's ``StatefulDataLoader``, whose ``state_dict()`` is exact with any number of workers (it
snapshots the sampler's iterator as it takes each batch and keeps the snapshot of the last batch the
loop received): ``StatefulDataLoader(hf_dataset, batch_sampler=sampler, collate_fn=db.Collator(),
num_workers=2)``, or :func:`loader` for a :class:`~dflash_batch.TokenStore`, collated in Rust.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..data.reading import TokenStore
from ..loading.collate import collate, collate_packed
from ..planning.sampler import BucketSampler

__all__ = ["Rows", "StoreCollator", "loader", "resume_epoch"]


def resume_epoch(state: Any) -> int:
    """The epoch a ``StatefulDataLoader`` checkpoint ``state`` over a sampler was taken in.

    torchdata applies a loaded state only when the next iteration starts, so after
    ``loader.load_state_dict(state)`` the sampler still reports the epoch it had. A loop that continues
    from the sampler's epoch sets it first, and is then exact::

        loader.load_state_dict(state)
        sampler.set_epoch(resume_epoch(state))      # the epoch torchdata resumes at its next iteration
        for epoch in range(sampler.epoch, epochs):
            sampler.set_epoch(epoch)
            for batch in loader: ...

    Reads only ``state``, the value torchdata's ``state_dict()`` returned: the sampler's own state inside it
    (found by its shape, wherever the loader's format nests it). ``PlanError`` when it holds none, or holds
    states of different epochs.
    """
    from .._core import PlanError
    from ..planning.checkpoint import REQUIRED

    epochs = {found["epoch"] for found in _sampler_states(state, REQUIRED)}
    if len(epochs) == 1:
        return int(epochs.pop())
    if not epochs:
        raise PlanError(
            "this state holds no dflash_batch sampler state: pass what StatefulDataLoader(..., batch_sampler="
            "sampler).state_dict() returned (a loader over another sampler saves none)"
        )
    raise PlanError(f"this state holds sampler states of several epochs ({sorted(epochs)}); pass one loader's state")


def _sampler_states(value: Any, required: tuple[str, ...], depth: int = 0) -> list[dict[str, Any]]:
    """Every dict shaped like a sampler's ``state_dict()`` inside ``value`` (nested dicts and lists)."""
    if depth > 16:
        return []
    if isinstance(value, dict):
        if all(key in value for key in required) and isinstance(value.get("epoch"), int):
            return [value]
        return [s for v in value.values() for s in _sampler_states(v, required, depth + 1)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _sampler_states(v, required, depth + 1)]
    return []


def loader(store: TokenStore, sampler: BucketSampler, *, num_workers: int = 0, **kwargs: Any) -> Any:
    """torchdata's ``StatefulDataLoader`` over ``store`` in ``sampler``'s order: worker processes collate
    the batches in Rust (:class:`StoreCollator`); ``state_dict()`` / ``load_state_dict()`` resume exactly.
    ``kwargs`` go to ``StatefulDataLoader`` (``prefetch_factor``, ``multiprocessing_context``, ...) and to
    the collation (``pad_id``, ``label_pad_id``, ``dtype``)."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as error:
        raise ImportError(
            "dflash_batch.adapters.torch.loader needs torchdata's StatefulDataLoader: pip install 'torchdata>=0.8'"
        ) from error
    if not isinstance(store, TokenStore):
        raise TypeError(f"store must be a dflash_batch.TokenStore, got {type(store).__name__}")
    if not isinstance(sampler, BucketSampler):
        raise TypeError(f"sampler must be a dflash_batch.BucketSampler, got {type(sampler).__name__}")
    collation = {key: kwargs.pop(key) for key in ("pad_id", "label_pad_id", "dtype") if key in kwargs}
    collator = StoreCollator(store, sampler, **collation)
    return StatefulDataLoader(
        Rows(len(store)), batch_sampler=sampler, collate_fn=collator, num_workers=num_workers, **kwargs
    )


class StoreCollator:
    """A picklable ``collate_fn`` for index batches of a sampler's plan: the rows of ``store`` padded (or
    packed, for a ``mode="packed"`` sampler) as the :class:`~dflash_batch.Loader` collates them, as torch
    tensors. Worker processes unpickle the store by mapping its files again."""

    def __init__(
        self,
        store: TokenStore,
        sampler: BucketSampler,
        *,
        pad_id: int = 0,
        label_pad_id: int = -100,
        dtype: Any = "int64",
    ) -> None:
        self.store, self.pad_id, self.label_pad_id, self.dtype = store, pad_id, label_pad_id, dtype
        self.packed = sampler.mode == "packed"
        self.capacity = sampler.max_tokens
        self.pad_to_multiple_of = sampler.pad_to_multiple_of
        entries = sampler.entries
        self.piece_multiple = entries.piece_multiple  # context parallelism (1: none)
        # Entries past the rows are pieces of long samples: located once here, as a table.
        self.pieces = entries.pieces(np.arange(entries.count)) if entries.truncated else None

    def __call__(self, batch: Any) -> dict[str, Any]:
        entries = np.asarray(batch, dtype=np.int64)
        settings = {"pad_id": self.pad_id, "label_pad_id": self.label_pad_id, "dtype": self.dtype}
        if self.packed:
            starts = lengths = None
            if self.pieces is not None:
                rows, starts, lengths = (part[entries] for part in self.pieces)
                entries = rows
            arrays = collate_packed(
                self.store, entries, capacity=int(self.capacity or 0), starts=starts, lengths=lengths,
                piece_multiple=self.piece_multiple, **settings,
            )  # fmt: skip
        else:
            arrays = collate(self.store, entries, pad_to_multiple_of=self.pad_to_multiple_of, **settings)
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}


class Rows(torch.utils.data.Dataset):
    """Row numbers as a map-style dataset whose batch fetch returns the batch's indices (collation reads
    the tokens): what a ``DataLoader`` over a sampler's index batches and a store fetches from."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> int:
        return index

    def __getitems__(self, indices: Any) -> Any:
        return indices

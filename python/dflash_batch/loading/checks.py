"""What a :class:`~dflash_batch.Loader` is given, checked before anything is allocated: a store and a
sampler that plan the same rows, and where its batches go (the CPU, or a CUDA device torch can use)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base.errors import invalid_setting
from ..data.reading import TokenStore
from ..planning.sampler import BucketSampler


def check_pair(store: Any, sampler: Any) -> None:
    """``store`` and ``sampler`` are the library's, and the sampler planned the store's own lengths (the
    same count is not enough: budgets would not hold)."""
    if not isinstance(store, TokenStore):
        raise TypeError(f"store must be a dflash_batch.TokenStore, got {type(store).__name__}")
    if not isinstance(sampler, BucketSampler):
        raise TypeError(f"sampler must be a dflash_batch.BucketSampler, got {type(sampler).__name__}")
    if len(store) != sampler.num_samples:
        raise ValueError(
            f"the store has {len(store)} rows but the sampler plans {sampler.num_samples} samples; "
            "build both from the same dataset"
        )
    mine = store.lengths()
    planned = sampler.schedule.lengths()[: len(mine)]
    if sampler.truncated:  # a long sample's first piece is planned at the row capacity
        mine = np.minimum(mine, int(sampler.max_tokens or 0))
    differs = np.flatnonzero(mine != planned)
    if len(differs):
        row = int(differs[0])
        raise ValueError(
            f"the sampler was planned on other lengths than the store's ({len(differs)} rows differ; row {row}: "
            f"{int(planned[row])} planned, {int(mine[row])} in the store); build the sampler from store.lengths()"
        )


def padding_of(sampler: Any, given: Any) -> int:
    """The padding multiple a Loader pads with: the sampler's, whose budgets count it (``max_tokens`` holds
    for the padded batch). Another value would break them, or pad short of what the plan assumed."""
    planned = sampler.pad_to_multiple_of
    if given is None or (not isinstance(given, bool) and isinstance(given, (int, np.integer)) and given == planned):
        return planned
    if isinstance(given, bool) or not isinstance(given, (int, np.integer)):
        raise TypeError(f"pad_to_multiple_of must be an int or None, got {type(given).__name__} {given!r}")
    budget = f"max_tokens={sampler.max_tokens} per batch" if sampler.max_tokens else "its batches"
    raise invalid_setting(
        "pad_to_multiple_of",
        f"pad_to_multiple_of={given!r} differs from the sampler's pad_to_multiple_of={planned}, which planned "
        f"{budget} with that padding; build the sampler with pad_to_multiple_of={given} (the Loader pads "
        "as the sampler planned), or leave it unset here",
    )


def placement(device: Any, pin_memory: bool | None, reuse_buffers: Any) -> tuple[Any, bool]:
    """The torch device batches go to and whether host batches are pinned."""
    import torch

    placed = torch.device(device) if device is not None else torch.device("cpu")
    if placed.type not in ("cpu", "cuda"):
        raise invalid_setting(
            "device",
            f"device={device!r} is not supported; the Loader delivers CPU tensors (device=None) or copies "
            "them to a CUDA device; move batches elsewhere yourself",
        )
    cuda = placed.type == "cuda"
    if not isinstance(reuse_buffers, bool):
        raise TypeError(f"reuse_buffers must be a bool, got {type(reuse_buffers).__name__}")
    if reuse_buffers and cuda:
        raise invalid_setting(
            "reuse_buffers",
            "reuse_buffers=True applies to CPU batches; CUDA batches are always fresh device tensors "
            "(the pinned host ring is internal): leave it unset",
        )
    if cuda and not torch.cuda.is_available():
        raise invalid_setting("device", f"device={device!r} needs CUDA, which torch cannot use here; pass device=None")
    pinned = cuda if pin_memory is None else bool(pin_memory)
    if pinned and not torch.cuda.is_available():
        raise invalid_setting("pin_memory", "pin_memory=True needs CUDA; pass pin_memory=False or leave it unset")
    return placed, pinned


def ring_too_large(prefetch: int, multiple: int, ring: tuple[int, int, int], why: str) -> MemoryError:
    """The error for a prefetch ring of ``(slots, tokens a slot, bytes)`` that cannot be held, and ``why``."""
    count, capacity, nbytes = ring
    cause = f"; lower pad_to_multiple_of={multiple}, which sets that width" if multiple > 1 else ""
    return MemoryError(
        f"prefetch={prefetch} needs a ring of {count} slots of {capacity:,} tokens (the epoch's "
        f"largest padded batch), {nbytes / 2**30:,.1f} GiB, {why}{cause}; lower prefetch"
    )

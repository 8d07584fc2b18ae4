"""Batches a consumer fetched ahead of the training loop: handed out by the sampler, not yet trained on.

A checkpoint records the steps the loop has trained on. A sampler counts the batches it hands out, and
two consumers take them ahead of the loop:

* a torch ``DataLoader`` with workers sends ``prefetch_factor × num_workers`` batches of indices ahead
  (its iterator's ``_send_idx`` counts the batches taken from the sampler, ``_rcvd_idx`` those returned);
* accelerate's ``DataLoaderShard`` (what ``accelerator.prepare`` makes of a ``DataLoader``) reads one
  batch ahead to know which batch is the last, except once it has reached the end.

When a sampler hands out its first batch of an iteration it looks up the call stack for them, once, and
keeps weak references, so ``state_dict()`` — called by ``accelerator.save_state`` through
``register_for_checkpointing``, or by the user — subtracts what they hold. torch and accelerate are
never imported here.
"""

from __future__ import annotations

import sys
import weakref
from types import FrameType
from typing import Any

# How far up the stack a consumer can be: the sampler's generator, accelerate's BatchSamplerShard and
# SkipBatchSampler, torch's _next_index/_next_data/__next__, DataLoaderShard.__iter__.
_FRAMES = 12


class Consumers:
    """The torch iterator and the accelerate shard pulling one iteration's batches (either may be absent)."""

    def __init__(self, loader_iter: Any, shard: Any) -> None:
        self._iter = None if loader_iter is None else weakref.ref(loader_iter)
        self._shard = None if shard is None else weakref.ref(shard)

    def in_flight(self) -> int:
        """Batches taken from the sampler that the training loop has not been given."""
        ahead = 0
        loader_iter = None if self._iter is None else self._iter()
        if loader_iter is not None:
            sent, received = getattr(loader_iter, "_send_idx", None), getattr(loader_iter, "_rcvd_idx", None)
            if isinstance(sent, int) and isinstance(received, int):  # workers; without them, none ahead
                ahead += max(sent - received, 0)
        shard = None if self._shard is None else self._shard()
        if shard is not None and getattr(shard, "end_of_dataloader", True) is False:
            ahead += 1
        return ahead


def find(frame: FrameType | None) -> Consumers | None:
    """The consumers above ``frame`` (a sampler generator's own frame), or ``None`` when there are none."""
    torch_module = sys.modules.get("torch.utils.data.dataloader")
    iter_type = getattr(torch_module, "_BaseDataLoaderIter", None)
    shard_type = getattr(sys.modules.get("accelerate.data_loader"), "DataLoaderShard", None)
    if iter_type is None and shard_type is None:
        return None
    loader_iter = shard = None
    for _ in range(_FRAMES):
        frame = None if frame is None else frame.f_back
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if loader_iter is None and iter_type is not None and isinstance(owner, iter_type):
            loader_iter = owner
        elif shard is None and shard_type is not None and isinstance(owner, shard_type):
            shard = owner
            break  # the outermost consumer: what is above it is the training loop
    if loader_iter is None and shard is None:
        return None
    return Consumers(loader_iter, shard)

"""Recognizing accelerate's ``BatchSamplerShard`` around a :class:`BucketSampler`.

``accelerator.prepare(DataLoader(ds, batch_sampler=sampler))`` on several processes wraps the batch
sampler in a ``BatchSamplerShard`` that keeps every ``num_processes``-th batch. A sampler that yielded
only its own rank's batches would be sharded a second time (each rank seeing half its share, with no
warning). accelerate offers no way to say "already sharded", so the sampler looks at who is asking:
when its caller is a ``BatchSamplerShard`` whose processes match its ranks, it yields every rank's
batches in plan order and the shard's pick is exactly this rank's share. A shard that does not match
raises, naming the fix. A ``Loader`` that ``accelerator.prepare`` returns as it is tells accelerate's
``GradientState`` where its epoch ends, as a prepared ``DataLoader`` does (:func:`gradient_state`), so
``accelerator.accumulate`` closes the last window of every epoch. accelerate is never imported here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from . import _in_flight
from ._core import PlanError


def wrapping_shard(sampler: Any) -> Any | None:
    """The ``BatchSamplerShard`` that is iterating or measuring ``sampler`` (the caller of the caller of
    this function), checked against the sampler's ranks; ``None`` when there is none."""
    module = sys.modules.get("accelerate.data_loader")
    shard_type = getattr(module, "BatchSamplerShard", None)
    if shard_type is None:
        return None
    caller = sys._getframe(2).f_locals.get("self")
    if not isinstance(caller, shard_type) or getattr(caller, "batch_sampler", None) is not sampler:
        return None
    if caller.split_batches:
        raise PlanError(
            "accelerate's split_batches=True cuts every batch across processes, which breaks the plan's token "
            "budgets; prepare the DataLoader with split_batches=False (the default)"
        )
    if (caller.num_processes, caller.process_index) != (sampler.world_size, sampler.rank):
        raise PlanError(
            f"accelerate shards this sampler over {caller.num_processes} processes (this is process "
            f"{caller.process_index}), but it plans for world_size={sampler.world_size}, rank={sampler.rank}; "
            "build it with world_size=accelerator.num_processes and rank=accelerator.process_index (the "
            "defaults once accelerate has initialized torch.distributed)"
        )
    return caller


def iter_for_shard(sampler: Any) -> Iterator[list[int]]:
    """Every rank's batches in plan order, as lists: accelerate's ``BatchSamplerShard`` (what
    ``accelerator.prepare`` puts around ``DataLoader(batch_sampler=sampler)``) hands rank ``r`` every
    ``world_size``-th batch from the ``r``-th, which is exactly its share of the plan. The position
    counts this rank's steps; the batch the prepared loader reads ahead is not counted as trained
    (:mod:`dflash_batch._in_flight`)."""
    plan, start, token = sampler._begin()
    world, position = sampler.world_size, sampler.position
    consumers, exhausted = _in_flight.find(sys._getframe()), False
    try:
        for batch in range(start * world, plan.steps * world):
            position.advance(token, batch // world + 1, consumers)
            yield plan[batch].tolist()
        position.check(token)
        exhausted = True
    finally:
        position.finish(token, exhausted)


def gradient_state() -> Any | None:
    """accelerate's ``GradientState`` when an ``Accelerator`` exists in this process, else ``None``."""
    state_type = getattr(sys.modules.get("accelerate.state"), "GradientState", None)
    if state_type is None or not getattr(state_type, "_shared_state", None):
        return None
    return state_type()

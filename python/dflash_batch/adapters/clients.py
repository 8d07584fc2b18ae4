"""What a client iterating a sampler publishes about itself — the one place the library looks at another
library's objects, and only at what they document: no stack frames, no private fields.

accelerate's prepared ``DataLoader`` (``DataLoaderShard``) registers itself as
``GradientState().active_dataloader`` while it iterates, exposes the batch sampler it iterates as
``batch_sampler`` (a ``BatchSamplerShard`` or ``SkipBatchSampler`` exposes the one it wraps the same way),
and reads one batch ahead of the training loop. When a sampler's iteration starts, this module finds
whether such a loader is the one iterating it:

* a ``BatchSamplerShard`` around a rank's own batches would give each rank every ``world_size``-th of its
  share — a silent loss — so the sampler refuses it, naming the adapter that hands accelerate every
  rank's batches (:func:`dflash_batch.adapters.accelerate.batch_sampler`);
* a loader reading ahead makes "batches handed out" one more than "batches trained", so the sampler's
  own ``state_dict()`` refuses to guess while that iteration runs (accelerate's stateful loaders save
  the exact position themselves).
"""

from __future__ import annotations

import sys
from typing import Any

from .._core import PlanError
from ..base.clients import Reader, register

#: How many ``batch_sampler`` links a prepared loader's chain can have (shard, skip, the sampler).
_DEPTH = 4


def accelerate_reader(target: Any, global_view: type) -> Reader | None:
    """accelerate's :class:`Reader` when its active prepared loader iterates ``target`` (a sampler) or a
    ``global_view`` of it, else ``None``; raises ``PlanError`` for a sharding that would lose samples."""
    state_module = sys.modules.get("accelerate.state")
    loader_module = sys.modules.get("accelerate.data_loader")
    if state_module is None or loader_module is None:
        return None
    try:
        active = state_module.GradientState().active_dataloader
    except Exception:  # an accelerate without this public property: nothing it publishes to read
        return None
    if active is None:
        return None
    shard_type = getattr(loader_module, "BatchSamplerShard", None)
    chain: list[Any] = []
    link = getattr(active, "batch_sampler", None)
    while link is not None and len(chain) < _DEPTH:
        chain.append(link)
        if link is target or (isinstance(link, global_view) and getattr(link, "sampler", None) is target):
            break
        link = getattr(link, "batch_sampler", None)
    else:
        return None  # the active loader iterates something else
    for shard in chain:
        if shard_type is not None and isinstance(shard, shard_type):
            _check_shard(shard, target, bare=chain[-1] is target)
    return Reader("accelerate", READS_AHEAD.format(client="accelerate"))


def _check_shard(shard: Any, sampler: Any, *, bare: bool) -> None:
    if getattr(shard, "split_batches", False):
        raise PlanError(
            "accelerate's split_batches=True cuts every batch across processes, which breaks the plan's token "
            "budgets; prepare the DataLoader with split_batches=False (the default)"
        )
    if bare:
        raise PlanError(
            f"accelerate shards this sampler's batches over {shard.num_processes} processes, but they are "
            f"already rank {sampler.rank}'s share: each rank would train every {shard.num_processes}th of its "
            "share. Prepare DataLoader(dataset, batch_sampler=db.adapters.accelerate.batch_sampler(sampler)), "
            "which hands accelerate every rank's batches in plan order"
        )
    if (shard.num_processes, shard.process_index) != (sampler.world_size, sampler.rank):
        raise PlanError(
            f"accelerate shards this sampler over {shard.num_processes} processes (this is process "
            f"{shard.process_index}), but it plans for world_size={sampler.world_size}, rank={sampler.rank}; "
            "build it with world_size=accelerator.num_processes and rank=accelerator.process_index (the "
            "defaults once accelerate has initialized torch.distributed)"
        )


READS_AHEAD = (
    "this sampler is iterated by {client}'s prepared DataLoader, which reads a batch ahead of the training "
    "loop, so the batches it has handed out are not the batches trained. Let accelerate save the loader's "
    "position (Accelerator(dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True)): "
    "accelerator.save_state then saves it exactly) instead of registering the sampler, or pass "
    "state_dict(step=<micro-batches trained this epoch>)"
)


register(accelerate_reader)

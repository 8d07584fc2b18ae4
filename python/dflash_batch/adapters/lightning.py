"""Lightning: a :class:`~dflash_batch.Loader` as the train dataloader needs nothing — Lightning saves and
restores a stateful train dataloader in its checkpoints (the Loader's ``state_dict`` counts the batches
it handed to the loop), and sets its sampler's epoch. Beside ``DataLoader(dataset, batch_sampler=sampler)``
(no workers; Lightning does not fetch ahead of a loader whose length it knows), add
:class:`SamplerCheckpoint` to the Trainer's callbacks: Lightning's own stateful-callback protocol saves
the sampler's position in every checkpoint and restores it on ``fit(ckpt_path=...)``. Build the Trainer
with ``use_distributed_sampler=False``: the plan already gives each rank its share.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback

from .._core import PlanError
from ..sampler import BucketSampler

__all__ = ["SamplerCheckpoint"]


class SamplerCheckpoint(Callback):
    """Saves ``sampler``'s position in Lightning checkpoints and restores it when one is loaded; checks at
    ``setup`` that the sampler plans for the Trainer's processes."""

    def __init__(self, sampler: BucketSampler) -> None:
        if not isinstance(sampler, BucketSampler):
            raise TypeError(f"sampler must be a dflash_batch.BucketSampler, got {type(sampler).__name__}")
        self.sampler = sampler

    @property
    def state_key(self) -> str:
        return "dflash_batch.SamplerCheckpoint"

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        world, rank = trainer.world_size, trainer.global_rank
        if (world, rank) != (self.sampler.world_size, self.sampler.rank):
            raise PlanError(
                f"the sampler plans for world_size={self.sampler.world_size}, rank={self.sampler.rank}, but this "
                f"Lightning Trainer runs process {rank} of {world}; build the sampler with world_size={world} "
                f"and rank={rank} (Lightning starts torch.distributed inside fit, so pass them)"
            )

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state_dict)

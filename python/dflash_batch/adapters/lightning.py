"""Lightning: a :class:`~dflash_batch.Loader` as the train dataloader needs nothing — Lightning saves and
restores a stateful train dataloader in its checkpoints (the Loader's ``state_dict`` counts the batches
it handed to the loop), and sets its sampler's epoch. Beside ``DataLoader(dataset, batch_sampler=sampler)``
(no workers; Lightning does not fetch ahead of a loader whose length it knows), add
:class:`SamplerCheckpoint` to the Trainer's callbacks: Lightning's own stateful-callback protocol saves
the sampler's position in every checkpoint and restores it on ``fit(ckpt_path=...)``. Build the Trainer
with ``use_distributed_sampler=False``: the plan already gives each rank its share.

:class:`StepTiming` refits the price ranks are balanced by from the run's own step times
(``docs/calibration.md``): it times each training batch from ``on_train_batch_start`` to
``on_before_backward`` (the forward pass and the loss: under DDP no gradient all-reduce, so each rank
times its own work) and fits at every ``on_train_epoch_end`` (a collective: every rank runs it).
"""

from __future__ import annotations

from typing import Any

import lightning
from lightning.pytorch.callbacks import Callback

from .._core import PlanError
from ..planning.sampler import BucketSampler
from ..pricing.calibration import StepTimer
from .versions import require

require(lightning)

__all__ = ["SamplerCheckpoint", "StepTiming"]


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


class StepTiming(Callback):
    """Times every training batch's forward pass into ``timer`` (a :class:`~dflash_batch.StepTimer`, or a
    sampler to build one of) and refits its sampler's rank price at every epoch's end; what was found is
    logged as ``rank_price/*`` (see the module docs). The batches must say what they ran: a
    :class:`~dflash_batch.Loader`'s (``attention_mask`` or ``cu_seqlens``)."""

    def __init__(self, timer: StepTimer | BucketSampler) -> None:
        if isinstance(timer, BucketSampler):
            timer = StepTimer(timer)
        if not isinstance(timer, StepTimer):
            raise TypeError(f"timer must be a dflash_batch.StepTimer or BucketSampler, got {type(timer).__name__}")
        self.timer = timer

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.timer.begin(batch)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.timer.end()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.timer.cancel()  # a step that skipped its backward (training_step returned None) is not timed
        report = self.timer.end_epoch()
        for key, value in report.logs().items():
            pl_module.log(key, value, on_epoch=True, on_step=False)

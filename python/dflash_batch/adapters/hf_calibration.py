"""A :class:`~dflash_batch.hf.BucketTrainer`'s rank price refitted from its own step times
(``BucketTrainer(step_timer=True)``): the forward pass of every training micro-batch is timed in
``compute_loss`` (the Trainer's public hook for the loss; backward costs a near-constant multiple of the
forward, and under DDP the forward holds no gradient all-reduce, so each rank times its own work), and at
every epoch's end (``on_epoch_end``, on every process: the fit is a collective) the
:class:`~dflash_batch.StepTimer` fits and may re-price the next epochs' rank balance. What it found is
logged with the Trainer's logs as ``rank_price/*``."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from .._core import PlanError
from ..pricing.calibration import StepTimer


def timer_of(value: Any, sampler: Any) -> StepTimer | None:
    """``step_timer=``: ``False`` (none), ``True`` (a :class:`StepTimer` of ``sampler``) or a StepTimer of it."""
    if value is False or value is None:
        return None
    if value is True:
        return StepTimer(sampler)
    if not isinstance(value, StepTimer):
        raise TypeError(f"step_timer must be a bool or a dflash_batch.StepTimer, got {type(value).__name__}")
    if value.sampler is not sampler:
        raise PlanError(
            "step_timer times another sampler's batches than this Trainer's; build it as "
            "dflash_batch.StepTimer(sampler) with the sampler passed to the Trainer, or pass step_timer=True"
        )
    return value


class Calibrate(TrainerCallback):
    """Fits the epoch's timings at its end and logs what was found (see the module docs)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        report = self.trainer.step_timer.end_epoch()
        self.trainer.log(report.logs())

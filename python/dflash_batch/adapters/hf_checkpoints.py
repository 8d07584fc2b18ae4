"""The files a :class:`~dflash_batch.hf.BucketTrainer` keeps in the Trainer's checkpoint folders: one
``dflash_batch.json`` (the position, written by the first process — every rank's is the same) beside
``trainer_state.json``, and how a resume reads it back and checks it against the Trainer's own step count.

The Trainer counts an epoch in optimizer steps: ``ceil(len(sampler) / gradient_accumulation_steps)`` of them,
each taking ``gradient_accumulation_steps`` micro-batches (the last one, what is left). Its ``global_step``
therefore names a position in the sampler's epoch — :func:`trainer_position` — which a resume must agree with,
and which is what a loader reading ahead of the Trainer records (:func:`trained_position`)."""

from __future__ import annotations

import json
import math
import os
import warnings
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .._core import PlanError
from ..planning import checkpoint

#: The state file the first process writes into every checkpoint folder (one position for all ranks).
STATE_FILE = "dflash_batch.json"
#: Per-rank state files of checkpoints written before 0.2 (read when ``STATE_FILE`` is absent).
LEGACY_STATE_FILE = "dflash_batch_rank{rank}.json"


def saved_state(folder: str) -> dict[str, Any] | None:
    """The dflash_batch state of a checkpoint folder (written by any number of processes), or ``None``."""
    for name in (STATE_FILE, LEGACY_STATE_FILE.format(rank=0)):
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            try:
                state = json.load(f)
            except json.JSONDecodeError as error:
                raise PlanError(
                    f"{path} is not a dflash_batch state ({error}); delete it to resume from the Trainer's count alone"
                ) from None
        if not isinstance(state, dict):
            raise PlanError(f"{path} is not a dflash_batch state (a {type(state).__name__}); delete it to resume")
        return state
    return None


class Checkpoints(TrainerCallback):
    """Writes the position into every checkpoint folder the Trainer saves (its ``on_save`` event, after
    the folder is complete), from the first process: every rank's position is the same."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loader = self.trainer.train_loader
        if loader is None or not state.is_world_process_zero:
            return
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if not os.path.isdir(folder):
            raise PlanError(
                f"the Trainer saved a checkpoint, but {folder} is not there; dflash_batch writes its {STATE_FILE} "
                "beside trainer_state.json in each checkpoint folder (hyperparameter searches, which save "
                "elsewhere, are not supported)"
            )
        path = os.path.join(folder, STATE_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump(loader.position_at(state.global_step), f)
        os.replace(path + ".tmp", path)


def trainer_position(global_step: int, steps: int, accumulation: int) -> tuple[int, int]:
    """``(epoch, micro-batches of it)`` where the Trainer's ``global_step`` resumes, for epochs of ``steps``
    micro-batches."""
    per_epoch = max(math.ceil(steps / accumulation), 1)
    return global_step // per_epoch, (global_step % per_epoch) * accumulation


def trained_position(sampler: Any, global_step: int, accumulation: int) -> dict[str, Any]:
    """The sampler's state after the Trainer's ``global_step`` optimizer steps — what they trained, not what a
    loader took ahead of them — checked to be in the epoch the sampler is in."""
    epoch, trained = trainer_position(global_step, len(sampler), accumulation)
    if trained == 0 and epoch > 0:  # the epoch's last optimizer step: the Trainer has not moved on yet
        epoch, trained = epoch - 1, len(sampler)
    if epoch != sampler.epoch:
        raise PlanError(
            f"the Trainer saves at global step {global_step} (epoch {epoch} by its count) but the sampler is in "
            f"epoch {sampler.epoch}: they count epochs apart (was set_epoch called on the sampler outside the "
            "Trainer?), so the checkpoint cannot name what was trained"
        )
    return sampler.state_dict(step=trained)


def check_resume(folder: str, sampler: Any, accumulation: int) -> None:
    """The checkpoint's position is where the Trainer's own step count resumes, on these processes and with
    these settings; else a ``PlanError`` before anything trains. Leaves the sampler in the resumed epoch, with
    the checkpoint's rank prices."""
    state = saved_state(folder)
    trainer_state = os.path.join(folder, "trainer_state.json")
    if state is None or not os.path.exists(trainer_state):
        warnings.warn(
            f"{folder} holds no {STATE_FILE}: the resume follows the Trainer's step count, unchecked "
            "against the data and settings the checkpoint was trained with",
            stacklevel=4,
        )
        return
    if state.get("world_size") != sampler.world_size:
        raise PlanError(
            f"{folder} was written by {state.get('world_size')} process(es) and this run has "
            f"{sampler.world_size}: the Trainer counts an epoch in optimizer steps of the processes it runs "
            "on, so it cannot continue that epoch exactly here (it would skip or repeat samples). Resume it "
            f"with {state.get('world_size')} process(es) (torchrun --nproc_per_node "
            f"{state.get('world_size')}) and change the number at an epoch boundary in a new run from the "
            "saved model, or train with a torch loop, accelerate or Lightning over a dflash_batch.Loader, "
            "which resume on any number of ranks"
        )
    # The rank prices a StepTimer set are the checkpoint's: the resumed epoch is planned with its own.
    sampler.position.load_prices(state)
    resume, _ = checkpoint.decode(sampler.position.keys, state)  # refuses other data or settings, naming them
    with open(trainer_state) as f:
        global_step = int(json.load(f)["global_step"])
    counted = trainer_position(global_step, len(sampler), accumulation)
    if counted != (resume.epoch, resume.step) and (resume.epoch, resume.step) != (counted[0] - 1, len(sampler)):
        per_epoch = max(math.ceil(len(sampler) / accumulation), 1)
        raise PlanError(
            f"{folder}: its dflash_batch state is at step {resume.step} of epoch {resume.epoch}, but the "
            f"Trainer resumes at step {counted[1]} of epoch {counted[0]} (global step {global_step}, "
            f"{per_epoch} optimizer steps an epoch): the checkpoint was written with another "
            "gradient_accumulation_steps, sampler or number of processes; resume with the settings it was "
            f"trained with (gradient_accumulation_steps={state.get('settings', {}).get('accumulation')})"
        )
    # The Trainer fast-forwards the resumed epoch over the sampler's batches itself; its epoch is set
    # here too, for Trainer releases that set it only on the loader they skip from.
    sampler.set_epoch(counted[0])

"""The files a :class:`~dflash_batch.hf.BucketTrainer` keeps in the Trainer's checkpoint folders: one
``dflash_batch.json`` (the position, written by the first process — every rank's is the same) beside
``trainer_state.json``, and how a resume reads it back."""

from __future__ import annotations

import json
import os
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .._core import PlanError

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
            json.dump(loader.state_dict(), f)
        os.replace(path + ".tmp", path)

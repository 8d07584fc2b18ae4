"""``BucketTrainer(sampler=db.Windows(...), data_collator=..., use_data_collator=True)``: a stream — Parquet
shards, a ``datasets.IterableDataset``, your generator — trained by the HF Trainer (or TRL) in length-bucketed
or packed batches, planned a window at a time (:class:`~dflash_batch.Windows`), made by your collator.

How the Trainer's own model of an iterable dataset is kept:

* **Steps, passes**: a stream has no length, so the Trainer trains ``max_steps`` optimizer steps (required) and
  counts a pass over the stream as an epoch; its ``set_epoch`` is the Windows' pass. Every window's plan ends
  on a whole optimizer step (the Windows' ``accumulation`` is the Trainer's ``gradient_accumulation_steps``).
* **Checkpoints**: each checkpoint folder gets the Windows state (pass, window, steps of it taken) of the
  micro-batches the Trainer has taken — counted as they reach it, behind what DataLoader workers read ahead.
* **Resume**: the Trainer's own fast-forward replays an iterable loader from its start and cannot name a later
  pass, so it is switched off by ``ignore_data_skip=True`` (required to resume; refused otherwise, naming it)
  and the Windows state resumes the stream instead: it reads on from the window's first example and goes on
  after the steps trained (a state of another ``world_size`` plans the rest of its window on these ranks).
* **Budgets**: every collated batch is checked against the plan's token budget (the rows the collator made,
  from their ``attention_mask`` or a flattened row's ``position_ids``): a collator that makes more tokens than
  the lengths the Windows measured is a ``DataError`` at that batch, never a budget silently exceeded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from .._core import DataError, PlanError
from ..loading.checked import collated_lengths
from ..planning.windows import Windows
from .hf_checkpoints import STATE_FILE, saved_state


def check_windows(windows: Windows, args: Any, train_dataset: Any, step_timer: Any) -> None:
    """What the Trainer must be told for a stream: a ``PlanError`` or ``TypeError`` naming the fix."""
    if train_dataset is not None:
        raise TypeError(
            "the Windows reads the stream itself: leave train_dataset out (train_dataset=None) when the sampler is "
            "a dflash_batch.Windows"
        )
    if step_timer is not False:
        raise TypeError("step_timer= re-prices a BucketSampler's epochs; a Windows plans each window unpriced")
    if args.max_steps is None or args.max_steps <= 0:
        raise PlanError(
            "a stream has no length, so the Trainer needs max_steps (optimizer steps to train, over as many passes "
            "of the stream as they take): pass TrainingArguments(max_steps=...)"
        )
    if windows.accumulation != args.gradient_accumulation_steps:
        raise PlanError(
            f"the Windows ends each window on a whole step of accumulation={windows.accumulation} micro-batches, "
            f"but the Trainer accumulates gradient_accumulation_steps={args.gradient_accumulation_steps}; build the "
            f"Windows with accumulation={args.gradient_accumulation_steps}"
        )
    context = getattr(args, "dataloader_multiprocessing_context", None)
    if args.dataloader_num_workers and context not in (None, "fork"):
        raise PlanError(
            f"dataloader_multiprocessing_context={context!r}: DataLoader workers copy the Windows' position by fork "
            "(windows_workers); pass dataloader_multiprocessing_context='fork' (or leave it unset)"
        )
    if args.dataloader_num_workers and args.dataloader_persistent_workers:
        raise PlanError(
            "dataloader_persistent_workers=True keeps each worker's copy of the Windows from one pass to the next, "
            "where set_epoch and a resume do not reach it; pass dataloader_persistent_workers=False"
        )


def resume(windows: Windows, args: Any, folder: str) -> bool:
    """Loads the Windows state of checkpoint ``folder`` (the Trainer's own replay of the loader off)."""
    if not args.ignore_data_skip:
        raise PlanError(
            f"resuming {folder}: the Trainer would fast-forward the stream by replaying it from its start, which "
            "re-reads everything trained and cannot tell the passes apart; the Windows state in the checkpoint "
            "resumes it exactly instead: pass TrainingArguments(ignore_data_skip=True)"
        )
    state = saved_state(folder)
    if state is None:
        raise PlanError(
            f"{folder} holds no {STATE_FILE}, so where the stream stood is unknown (the Trainer would start it "
            "again from its first example); resume from a checkpoint this BucketTrainer wrote"
        )
    windows.load_state_dict(state)  # refuses another stream's settings or window size, naming them
    return True


class BudgetChecked:
    """Your collator, each batch it makes checked against the plan's token budget."""

    def __init__(self, collate_fn: Callable[[list[Any]], Any], mode: str, max_tokens: int | None) -> None:
        self.collate_fn, self.mode, self.max_tokens = collate_fn, mode, max_tokens

    def __call__(self, examples: list[Any]) -> Any:
        batch = self.collate_fn(examples)
        if self.max_tokens is None:
            return batch
        real = np.asarray(collated_lengths(batch), dtype=np.int64).reshape(-1)
        used = int(real.sum()) if self.mode == "packed" else len(real) * int(real.max(initial=0))
        if used > self.max_tokens:
            kind = "tokens in a packed row" if self.mode == "packed" else "rows × the longest row"
            raise DataError(
                f"the data_collator made a batch of {len(examples)} examples into {used} {kind}, over max_tokens "
                f"{self.max_tokens}: the Windows measured these examples shorter than the collator makes them. "
                "Measure them as the collator does (its template, its special tokens: column=, length= or "
                "tokenizer= with text=)"
            )
        return batch


class StreamBatches(torch.utils.data.DataLoader):
    """This rank's batches of the Windows, collated by your collator, as the iterable loader the Trainer takes:
    its epochs are passes (the Trainer's epoch ``k`` is pass ``first + k``), and it counts the batches it hands
    the Trainer, which a checkpoint records."""

    def __init__(self, windows: Windows, collate_fn: Any, args: Any, resumed: bool) -> None:
        workers = int(args.dataloader_num_workers)
        options: dict[str, Any] = {"num_workers": workers, "pin_memory": bool(args.dataloader_pin_memory)}
        if workers:
            options["prefetch_factor"] = args.dataloader_prefetch_factor
            options["multiprocessing_context"] = "fork"  # the workers copy the Windows' position (windows_workers)
        checked = BudgetChecked(collate_fn, windows.mode, windows.max_tokens)
        super().__init__(windows.iterable(), batch_size=None, collate_fn=checked, **options)
        # The Trainer counts its epochs from 0 again on a resume: they go on from the resumed pass.
        self.windows, self.first, self.resumed, self.taken = windows, windows.epoch if resumed else 0, resumed, 0

    def set_epoch(self, epoch: int) -> None:
        if self.resumed and epoch == 0:
            return  # the resumed pass: the Windows stands where the checkpoint left it
        self.resumed = False
        self.windows.set_epoch(self.first + epoch)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        yield from self._counted()
        if self.taken == 0 and self.resumed:
            # Resumed after the last step of its pass: the Trainer's epoch goes on with the next pass (an
            # empty epoch would stop its training), and its later epochs follow from there.
            self.resumed, self.first = False, self.first + 1
            self.windows.set_epoch(self.first)
            yield from self._counted()

    def _counted(self) -> Iterator[Any]:
        self.taken = 0
        for batch in super().__iter__():
            self.taken += 1
            yield batch

    def position_at(self, global_step: int) -> dict[str, Any]:
        """The Windows state after the micro-batches the Trainer has taken (and trained: it saves after a step)."""
        return self.windows.state_dict(step=self.taken)

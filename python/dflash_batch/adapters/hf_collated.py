"""``BucketTrainer(..., use_data_collator=True)``: the sampler's batches of *your* dataset, made by the Trainer's
``data_collator`` (yours, or the one TRL or the Trainer sets) — for data that is not in a token store: raw chat
rows a collator renders with a template, images it expands, any row the collator tokenizes itself. The sampler
plans from the lengths that collator makes (``db.measure_lengths`` with its function).

What the Loader path guarantees holds here too, in the Trainer's own terms:

* **The plan, checked**: a plain ``torch.utils.data.DataLoader(dataset, batch_sampler=sampler)`` with the
  Trainer's worker settings; every row the collator makes is compared with the length it was planned at
  (:func:`~dflash_batch.checked`): a row longer than planned — a budget silently exceeded — is a ``DataError``
  at that batch, naming the example.
* **Exact resume with workers**: a DataLoader with workers takes batches ahead of the Trainer, so the
  sampler's count of batches handed out is not what was trained. The position a checkpoint records is read
  from the Trainer's own ``global_step`` (every optimizer step takes ``gradient_accumulation_steps``
  micro-batches of the epoch, the last one what is left), the same count its resume fast-forwards by.
* **Loss normalization**: the Trainer counts ``num_items_in_batch`` from the collated ``labels`` itself.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch

from .._core import PlanError
from ..loading.checked import checked
from ..planning.sampler import BucketSampler
from ..planning.windows import Windows
from .hf_checkpoints import trained_position


class CollatedBatches(torch.utils.data.DataLoader):
    """The sampler's index batches of ``dataset``, collated by ``collate_fn``, each row checked against its
    planned length; the Trainer sets its epoch and fast-forwards it (``skip_first_batches``) like its own."""

    def __init__(self, dataset: Any, collate_fn: Any, sampler: BucketSampler, args: Any) -> None:
        indexed, collate = checked(dataset, collate_fn, sampler.schedule.dataset_lengths())
        workers = int(args.dataloader_num_workers)
        options: dict[str, Any] = {"num_workers": workers, "pin_memory": bool(args.dataloader_pin_memory)}
        if workers:
            from transformers.trainer_utils import seed_worker

            options["persistent_workers"] = bool(args.dataloader_persistent_workers)
            options["prefetch_factor"] = args.dataloader_prefetch_factor
            options["multiprocessing_context"] = getattr(args, "dataloader_multiprocessing_context", None)
            options["worker_init_fn"] = partial(seed_worker, num_workers=workers, rank=args.process_index)
        super().__init__(indexed, batch_sampler=sampler, collate_fn=collate, **options)  # type: ignore[arg-type]
        self.bucket_sampler, self.accumulation = sampler, int(args.gradient_accumulation_steps)

    def set_epoch(self, epoch: int) -> None:
        self.bucket_sampler.set_epoch(epoch)

    def position_at(self, global_step: int) -> dict[str, Any]:
        """The position a checkpoint at the Trainer's ``global_step`` records: what its optimizer steps trained
        (the workers have taken batches ahead of it)."""
        return trained_position(self.bucket_sampler, global_step, self.accumulation)


def check_sampler_kind(sampler: Any, use_data_collator: Any, with_trl: bool) -> None:
    """A ``BucketSampler``, a dict of its settings, or — making batches with the collator, in a Trainer that
    does not require a ``train_dataset`` (TRL's do) — a ``Windows``."""
    if not isinstance(use_data_collator, bool):
        raise TypeError(f"use_data_collator must be True or False, got {use_data_collator!r}")
    if isinstance(sampler, Windows) and with_trl:
        raise TypeError(
            "TRL's trainers require a train_dataset, which a stream planned by a dflash_batch.Windows replaces: train "
            "the stream with dflash_batch.hf.BucketTrainer (a transformers.Trainer) and your data_collator"
        )
    if isinstance(sampler, Windows) and not use_data_collator:
        raise TypeError(
            "a dflash_batch.Windows hands examples of a stream, which your data_collator makes into batches: pass "
            "data_collator=... and use_data_collator=True"
        )
    if not isinstance(sampler, (BucketSampler, Windows, Mapping)):
        raise TypeError(
            "sampler must be a dflash_batch.BucketSampler, a dict of its keyword arguments, or a dflash_batch.Windows "
            f"(with use_data_collator=True), got {type(sampler).__name__}"
        )


def refuse_settings(sampler: Any, store: Any, eval_store: Any, loader_kwargs: Any) -> None:
    """What ``use_data_collator=True`` cannot take: a ``PlanError`` or ``TypeError`` naming the fix."""
    settings = (("store", store), ("eval_store", eval_store), ("loader_kwargs", loader_kwargs))
    given = next((name for name, value in settings if value is not None), None)
    if given is not None:
        raise TypeError(
            f"use_data_collator=True makes batches with your dataset and data_collator, so {given}= has nothing "
            f"to do; drop {given}=, or drop use_data_collator=True to have the Loader collate the store's tokens"
        )
    if isinstance(sampler, Windows):
        return
    if not isinstance(sampler, BucketSampler):
        raise TypeError(
            "use_data_collator=True needs a dflash_batch.BucketSampler built from the lengths your collator makes "
            "(db.measure_lengths(dataset, tokenizer=..., text=..., version=...)), not a dict of its settings"
        )
    if sampler.truncated:
        raise PlanError(
            f"the sampler split {sampler.truncated} long sample(s) into pieces (oversize='truncate'), which your "
            "dataset cannot hand out; truncate in your collator and measure the lengths it makes, or build the "
            "sampler with oversize='skip'"
        )


def warn_pruned_evaluation(args: Any, eval_dataset: Any) -> None:
    """Training hands the collator whole examples; the Trainer's own evaluation drops the columns the model
    does not take first (``remove_unused_columns``), so one collator would see two kinds of rows."""
    if eval_dataset is not None and getattr(args, "remove_unused_columns", False):
        warnings.warn(
            "use_data_collator=True hands your data_collator whole training examples, but with "
            "remove_unused_columns=True the Trainer's evaluation drops the eval_dataset's columns the model does "
            "not take before they reach it; pass remove_unused_columns=False so both see the same rows",
            UserWarning,
            stacklevel=4,
        )


def check_dataset(dataset: Any, sampler: BucketSampler) -> None:
    """The dataset is the one the sampler's lengths were measured from: as many rows, an index per row."""
    if dataset is None:
        raise TypeError("use_data_collator=True needs the train_dataset the sampler's lengths were measured from")
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError(
            f"use_data_collator=True indexes train_dataset row by row, but a {type(dataset).__name__} has no "
            "len() and [i]; pass a map-style dataset (a datasets.Dataset, a list, a torch Dataset)"
        )
    rows = sampler.num_samples
    if len(dataset) != rows:
        raise ValueError(
            f"the sampler plans {rows} rows but train_dataset has {len(dataset)}: build the sampler from this "
            "dataset's lengths (db.measure_lengths(train_dataset, ...))"
        )

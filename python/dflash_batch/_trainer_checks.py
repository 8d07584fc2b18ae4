"""What a ``transformers.Trainer`` (or TRL's ``SFTTrainer``) is told that :class:`~dflash_batch.hf.BucketTrainer`
does its own way. Each such setting is honoured, or gets one warning naming what the sampler does instead,
or is refused naming the fix — never ignored in silence. The same for the training data: ``train_dataset``
must hold the store's rows (the ones the sampler plans), and the loss mask it carries is the one the
store applies (``TokenStore(mask=...)``), unless TRL is told not to mask.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np

from ._core import PlanError
from .reading import MASK_COLUMNS

#: Rows of ``train_dataset`` whose tokens are compared with the store's (evenly spaced, first and last).
SAMPLED_ROWS = 16


def check_composition(cls: type, bucket: type) -> None:
    """``class SFT(SFTTrainer, BucketTrainer)`` runs ``SFTTrainer.__init__`` first, which does not take
    ``sampler=`` (a ``TypeError`` naming neither class): refused when the class is made, naming the order."""
    from transformers import Trainer

    mro = cls.__mro__
    ahead = [k for k in mro[: mro.index(bucket)] if issubclass(k, Trainer) and not issubclass(k, bucket)]
    if ahead:
        bases = ", ".join(base.__name__ for base in cls.__bases__)
        raise TypeError(
            f"class {cls.__name__}({bases}) puts {ahead[0].__name__} before BucketTrainer, so its __init__ "
            f"runs first and rejects sampler= and store=; list BucketTrainer first: "
            f"class {cls.__name__}(BucketTrainer, {ahead[0].__name__})"
        )


def settings_overridden(args: Any, kwargs: dict[str, Any], sampler: Any) -> None:
    """One warning for each training argument the sampler and Loader replace, naming what they do instead;
    a ``PlanError`` for TRL settings that would train on other rows than the plan's."""
    defaults = {f.name: f.default for f in dataclasses.fields(args) if f.default is not dataclasses.MISSING}
    budget = f"max_tokens={sampler.max_tokens}" if sampler.max_tokens else "its batch_size"
    given = {name: getattr(args, name) for name in defaults if getattr(args, name, None) != defaults[name]}
    notes = {
        "per_device_train_batch_size": f"the sampler's {budget} sets every batch; build the sampler with the "
        "batch size you want",
        "dataloader_drop_last": "every rank gets the same number of steps from the plan; the sampler's "
        "drop_last=True drops the last batches instead of splitting them",
        "group_by_length": "the sampler groups lengths into buckets and reshuffles them every epoch",
        "train_sampling_strategy": "the sampler's plan decides the order (length buckets reshuffled every epoch)",
    }
    for name, why in notes.items():
        if name in given:
            _warn(f"{name}={given[name]!r} is not used by BucketTrainer: {why}")
    if kwargs.get("data_collator") is not None:
        rows = "packed rows" if sampler.mode == "packed" else "padded rows"
        _warn(
            f"data_collator={type(kwargs['data_collator']).__name__} is not used by BucketTrainer: the Loader "
            f"collates {rows} in Rust, with labels = input_ids (-100 on padding and on each packed sample's first "
            "token); pass loader_kwargs (pad_id, label_pad_id, ...) to change them"
        )
    if getattr(args, "packing", False):
        raise PlanError(
            "SFTConfig(packing=True) makes TRL pack the dataset into other rows than the store's; dflash_batch "
            "packs every epoch itself: pass packing=False and build the sampler with mode='packed'"
        )
    if getattr(args, "padding_free", False) and sampler.mode != "packed":
        raise PlanError(
            "SFTConfig(padding_free=True) asks for rows without padding, but the sampler pads; build it with "
            "mode='packed' (rows of max_tokens with cu_seqlens), or pass padding_free=False"
        )


def check_max_length(args: Any, lengths: np.ndarray) -> None:
    """TRL truncates the rows it prepares to ``max_length``; the store's rows are trained whole."""
    limit = getattr(args, "max_length", None)
    if limit is None or not len(lengths) or int(lengths.max()) <= limit:
        return
    longest = int(lengths.max())
    raise PlanError(
        f"max_length={limit} truncates rows, but the store holds rows of up to {longest} tokens, which "
        f"dflash_batch trains whole; build the store from the dataset truncated when tokenizing, build a "
        f"packed sampler with max_tokens={limit} and oversize='truncate', or pass max_length=None"
    )


def check_dataset(dataset: Any, store: Any, args: Any) -> None:
    """``train_dataset`` holds the store's rows, and carries no loss mask the Loader would drop."""
    if dataset is None:
        return
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        return
    if len(dataset) != len(store):
        raise ValueError(
            f"train_dataset has {len(dataset)} rows but the store has {len(store)}; BucketTrainer trains the "
            "store's rows: build the store (and the sampler) from the train_dataset you pass"
        )
    columns = list(getattr(dataset, "column_names", None) or [])
    if "input_ids" in columns and len(dataset):
        for row in np.unique(np.linspace(0, len(dataset) - 1, SAMPLED_ROWS).astype(np.int64)):
            theirs = np.asarray(dataset[int(row)]["input_ids"])
            if not np.array_equal(theirs, np.asarray(store[int(row)])):
                raise ValueError(
                    f"train_dataset row {row} holds {len(theirs)} tokens that differ from the store's "
                    f"{len(store[int(row)])}: the store was built from other data (or TRL re-tokenized, truncated "
                    "or packed it); build the store from the train_dataset the Trainer trains"
                )
    applied = store.mask
    if applied is not None and not _wanted(applied, args):
        flag = "completion_only_loss" if applied == "completion_mask" else "assistant_only_loss"
        raise PlanError(
            f"{flag}={getattr(args, flag)!r} says the loss counts every token, but the store applies its "
            f"{applied!r} mask; build the store with mask=None, or leave {flag} at its default"
        )
    for column in MASK_COLUMNS:
        if column != applied and column in columns and _wanted(column, args) and _masks(dataset, column):
            raise PlanError(
                f"train_dataset has a {column!r} column that masks the loss, but the store applies "
                f"{'no mask' if applied is None else repr(applied)}: training would count other tokens; build "
                f"the store with mask={column!r} (or mask='auto')"
            )


def _wanted(column: str, args: Any) -> bool:
    """Whether the trainer's arguments want ``column`` applied (TRL can be told to train every token)."""
    if column == "completion_mask":
        return getattr(args, "completion_only_loss", None) is not False
    if column == "assistant_masks" and hasattr(args, "assistant_only_loss"):
        return bool(args.assistant_only_loss)
    return True


def _masks(dataset: Any, column: str) -> bool:
    """Whether the sampled rows of ``column`` mask any position."""
    for row in np.unique(np.linspace(0, len(dataset) - 1, SAMPLED_ROWS).astype(np.int64)):
        item = dataset[int(row)]
        values = np.asarray(item[column])
        if column == "labels":
            if not np.array_equal(values, np.asarray(item.get("input_ids", values))):
                return True
        elif len(values) and not values.all():
            return True
    return False


def _warn(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=4)

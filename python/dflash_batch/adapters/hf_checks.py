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

from .._core import DataError, PlanError
from ..base.errors import retold
from ..data.reading import MASK_COLUMNS, TokenStore
from ..loading.collate import collate

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


def check_ranks(sampler: Any, args: Any) -> None:
    """The sampler (a ``BucketSampler`` or a ``Windows``) plans for this process's rank of the Trainer's."""
    if (sampler.world_size, sampler.rank) != (args.world_size, args.process_index):
        raise PlanError(
            f"the sampler plans for world_size={sampler.world_size}, rank={sampler.rank}, but this Trainer runs "
            f"process {args.process_index} of {args.world_size}; build the sampler after torch.distributed "
            "starts (or under torchrun, which sets WORLD_SIZE and RANK), or pass those values"
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
    _check_mask(dataset, store, args, columns)


def store_of(dataset: Any, args: Any, collator: Any = None) -> Any:
    """The store of ``train_dataset`` as the Trainer holds it (TRL has tokenized it by now), applying the
    mask column the dataset and arguments say: the first wanted one that masks a sampled row. A dataset
    with no token column, given with a ``data_collator``, is refused naming ``use_data_collator=True``."""
    if dataset is None:
        raise TypeError("BucketTrainer needs store= or a train_dataset to read the store from")
    if collator is not None:
        try:
            return store_of(dataset, args)
        except DataError as error:
            raise retold(
                error,
                f"{error}. BucketTrainer reads the tokens of train_dataset into a store, and this one has none; "
                "to make batches with your data_collator from rows as they are, pass use_data_collator=True "
                "(and a sampler built from the lengths it makes: db.measure_lengths)",
            ) from None
    columns = list(getattr(dataset, "column_names", None) or [])
    wanted = [c for c in MASK_COLUMNS if c in columns and _wanted(c, args)] if len(dataset) else []
    masking = [c for c in wanted if any(not _keeps(dataset[row], [c]).all() for row in _sampled(dataset))]
    return TokenStore(dataset, mask=masking[0] if masking else None)


def _check_mask(dataset: Any, store: Any, args: Any, columns: list[str]) -> None:
    """The tokens the dataset says the loss counts (its ``labels`` and the 0/1 masks the arguments want,
    as TRL combines them) are the ones the store's mask keeps, on the sampled rows."""
    wanted = [column for column in MASK_COLUMNS if column in columns and _wanted(column, args)]
    applied = store.mask
    for row in _sampled(dataset):
        item = dataset[row]
        theirs = _keeps(item, wanted)
        ours = collate(store, np.array([row]))["labels"][0, : len(store[row])] != -100
        if np.array_equal(theirs, ours):
            continue
        masking = [c for c in wanted if not _keeps(item, [c]).all()]
        if applied is not None and not masking and getattr(args, "completion_only_loss", None) is False:
            raise PlanError(
                f"completion_only_loss=False says the loss counts every token, but the store applies its "
                f"{applied!r} mask; build the store with mask=None, or leave completion_only_loss at its default"
            )
        said = " and ".join(repr(c) for c in masking) or "no mask"
        fix = f"mask={masking[0]!r} (or mask='auto')" if masking else "mask=None"
        raise PlanError(
            f"train_dataset has a {said} column that masks the loss (row {row} keeps {int(theirs.sum())} of "
            f"{len(theirs)} tokens), but the store applies {'no mask' if applied is None else repr(applied)} "
            f"(keeps {int(ours.sum())}): training would count other tokens; build the store with {fix}"
            if masking
            else f"train_dataset row {row} has no loss mask, but the store applies {applied!r} (keeps "
            f"{int(ours.sum())} of {len(ours)} tokens): build the store with {fix}, or from the dataset that has it"
        )


def _sampled(dataset: Any) -> list[int]:
    return [int(r) for r in np.unique(np.linspace(0, len(dataset) - 1, SAMPLED_ROWS).astype(np.int64))]


def _wanted(column: str, args: Any) -> bool:
    """Whether the trainer's arguments want ``column`` applied: TRL can be told to train every token of a
    prompt-completion row; it applies ``assistant_masks`` (which it tokenizes under assistant_only_loss)
    and ``labels`` whenever they are there."""
    if column == "completion_mask":
        return getattr(args, "completion_only_loss", None) is not False
    return True


def _keeps(item: Any, columns: list[str]) -> np.ndarray:
    """Which positions of ``item`` carry a label under ``columns`` (all of them when none)."""
    keep = np.ones(len(item["input_ids"]), dtype=bool)
    for column in columns:
        values = np.asarray(item[column])
        keep &= values != -100 if column == "labels" else values.astype(bool)
    return keep


def _warn(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=4)

"""``checked``: your dataset and collator, with every batch compared against the lengths it was planned from.

A plan trusts its lengths: rows × the longest row's planned length fit the budget. When the lengths come
from a function of your own (``measure_lengths(length=...)``, a template the collator renders differently, a
special token forgotten) and the collator makes a row longer than planned, the batch holds more than the
budget — more memory than planned, and no error anywhere. ``checked`` makes that an error at the first such
batch, naming the example and both lengths. A row collated shorter than planned only pads more than it
needs: a ``RuntimeWarning``, once a process.

The collator sees examples, not indices, so the dataset is wrapped to hand each example with its index, and
the collator is wrapped to take them apart again: ``DataLoader(dataset, batch_sampler=sampler,
collate_fn=collate)`` with both from ``checked``. Worker processes (``num_workers``) check their own batches;
the error reaches the training loop as the ``DataLoader`` re-raises it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import dflash_batch._core as _core


def checked(
    dataset: Any,
    collate_fn: Callable[[list[Any]], Any],
    lengths: Any,
    *,
    lengths_of: Callable[[Any], Any] | None = None,
) -> tuple[Indexed, CheckedCollate]:
    """``(dataset, collate_fn)`` to hand a ``DataLoader`` with the sampler: the same batches, each checked.

    Args:
        dataset: your map-style dataset (``len`` and ``[i]``), the one the lengths were measured from.
        collate_fn: your collator: a list of examples in, a batch out.
        lengths: what the sampler planned from (``measure_lengths``'s result).
        lengths_of: each example's real tokens in a collated batch. Default: the sum of each row of its
            ``"attention_mask"`` (a dict-like batch), or the documents of a flattened row (its
            ``cu_seq_lens_q``, else its ``position_ids`` restarting at 0); pass one for any other batch.

    Raises (at a batch):
        DataError: a row collated longer than its planned length (the budget would not hold).
        TypeError: a batch ``lengths_of`` cannot read (no ``attention_mask``), or rows that do not match the
            examples given.
    """
    planned = np.asarray(lengths)
    if planned.ndim != 1 or planned.dtype.kind not in "iu":
        raise TypeError(f"lengths must be a 1-D integer array (measure_lengths's), got {planned.dtype} {planned.shape}")
    if len(planned) != len(dataset):
        raise ValueError(f"{len(planned)} lengths for a dataset of {len(dataset)} examples: measure this dataset")
    return Indexed(dataset), CheckedCollate(collate_fn, planned, lengths_of or collated_lengths)


class Indexed:
    """A dataset whose ``[i]`` is ``(i, dataset[i])``."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> tuple[int, Any]:
        row = int(index)  # the sampler's numpy integer, as a plain int for any dataset's [i]
        return row, self.dataset[row]


class CheckedCollate:
    """Your collator over the examples of ``Indexed`` pairs, each row's real tokens checked against its plan."""

    def __init__(self, collate_fn: Callable[[list[Any]], Any], lengths: np.ndarray, lengths_of: Callable) -> None:
        self.collate_fn, self.lengths, self.lengths_of = collate_fn, lengths, lengths_of
        self._warned = False

    def __call__(self, pairs: list[tuple[int, Any]]) -> Any:
        if not all(isinstance(p, tuple) and len(p) == 2 for p in pairs):
            raise TypeError("checked's collator takes the (index, example) pairs of checked's dataset: pass both")
        indices = np.fromiter((i for i, _ in pairs), dtype=np.int64, count=len(pairs))
        batch = self.collate_fn([example for _, example in pairs])
        real = np.asarray(_numpy(self.lengths_of(batch)), dtype=np.int64).reshape(-1)
        if len(real) != len(indices):
            raise TypeError(f"the batch has {len(real)} rows for {len(indices)} examples: lengths_of gives one a row")
        planned = self.lengths[indices].astype(np.int64)
        longer = np.flatnonzero(real > planned)
        if len(longer):
            k = int(longer[0])
            raise _core.DataError(
                f"example {indices[k]} was collated to {real[k]} tokens but planned at {planned[k]} "
                f"({len(longer)} of this batch's {len(indices)} rows are longer than planned): the batch would "
                "exceed the budget. The lengths disagree with the collator: measure them with the function the "
                "collator uses (its template, its special tokens), and change version= so the cache is measured "
                "again"
            )
        if not self._warned and (real < planned).any():
            self._warned = True
            warnings.warn(
                f"example {indices[np.argmax(real < planned)]} was collated shorter than planned: batches pad more "
                "than they need (the budget holds). The lengths disagree with the collator; measure them with its "
                "function",
                RuntimeWarning,
                stacklevel=2,
            )
        return batch


def collated_lengths(batch: Any) -> Any:
    """Each example's real tokens: the rows of the batch's ``attention_mask`` (padded rows); or, for a flattened
    (padding-free) batch of one row, its documents — from ``cu_seq_lens_q``, else from ``position_ids``, which
    restart at 0 for every example (``transformers.DataCollatorWithFlattening``)."""
    if isinstance(batch, Mapping):
        if "attention_mask" in batch:
            mask = _numpy(batch["attention_mask"])
            return np.asarray(mask).reshape(len(mask), -1).sum(axis=1)
        if "cu_seq_lens_q" in batch:
            return np.diff(np.asarray(_numpy(batch["cu_seq_lens_q"])).reshape(-1))
        if "position_ids" in batch:
            positions = np.asarray(_numpy(batch["position_ids"])).reshape(-1)
            return np.diff(np.append(np.flatnonzero(positions == 0), len(positions)))
    kind = f"keys {sorted(batch)}" if isinstance(batch, Mapping) else type(batch).__name__
    raise TypeError(
        f"checked cannot read each row's tokens from this batch ({kind}): it reads an 'attention_mask' (padded "
        "rows) or the 'position_ids' of a flattened row; pass lengths_of=lambda batch: … (for example "
        "(batch['input_ids'] != pad_id).sum(-1))"
    )


def _numpy(value: Any) -> Any:
    return value.detach().cpu().numpy() if hasattr(value, "detach") else value

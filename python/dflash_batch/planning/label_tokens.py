"""Label tokens per optimizer step, from the plan alone: what exact loss normalization under gradient
accumulation divides by, known on every rank without communication.

A causal LM predicts every token of a sample but its first (labels are shifted by one inside the
model, and the Loader's labels mask each packed sample's first token), so a sample of ``L`` tokens
holds ``L - 1`` label tokens — or, when its store has a loss mask, the positions after the first that
the mask keeps (:meth:`TokenStore.label_counts`). An optimizer step is a window of
``accumulation × world_size`` consecutive batches of the plan (``accumulation`` micro-batches on each
rank); the last window of an epoch may be shorter, exactly as the trainer's last accumulation step is.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def per_entry(schedule: Any, store: Any = None) -> np.ndarray:
    """Label tokens of every entry the schedule plans (rows, then the pieces of long samples), int64."""
    lengths = np.asarray(schedule.lengths(), dtype=np.int64)
    if store is None or store.mask is None:
        return np.maximum(lengths - 1, 0)
    if not schedule.truncated:
        return store.label_counts().astype(np.int64)
    rows, starts, windows = schedule.locate(np.arange(len(lengths), dtype=np.int64))
    return store.label_counts(rows, starts, windows).astype(np.int64)


def per_batch(plan, counts: np.ndarray) -> np.ndarray:
    """Label tokens of every batch of ``plan`` (int64), ``counts`` being each planned entry's."""
    offsets = np.asarray(plan.offsets, dtype=np.int64)
    sums = np.concatenate([[0], np.cumsum(counts[np.asarray(plan.indices)])])
    return sums[offsets[1:]] - sums[offsets[:-1]]


def per_step(plan, counts: np.ndarray, accumulation: int) -> np.ndarray:
    """Label tokens of every optimizer step of ``plan``, all ranks and micro-batches together (int64)."""
    window = accumulation * plan.world_size
    batches = per_batch(plan, counts)
    return np.add.reduceat(batches, np.arange(0, len(batches), window)) if len(batches) else batches


def per_step_by_source(plan, counts: np.ndarray, accumulation: int, sources_of, sources: int) -> np.ndarray:
    """Label tokens of every optimizer step of ``plan`` per source (int64, steps × ``sources``):
    ``sources_of(rows)`` gives each planned row's source."""
    window = accumulation * plan.world_size
    offsets = np.asarray(plan.offsets, dtype=np.int64)
    indices = np.asarray(plan.indices)
    batches = len(offsets) - 1
    steps = -(-batches // window) if batches else 0
    batch_of = np.repeat(np.arange(batches), np.diff(offsets))
    cell = (batch_of // window) * sources + sources_of(indices)
    sums = np.bincount(cell, weights=counts[indices], minlength=steps * sources)
    return sums.astype(np.int64).reshape(steps, sources)

"""Label tokens per optimizer step, from the plan alone: what exact loss normalization under gradient
accumulation divides by, known on every rank without communication.

A causal LM predicts every token of a sample but its first (labels are shifted by one inside the
model, and the Loader's labels mask each packed sample's first token), so a sample of ``L`` tokens
holds ``L - 1`` label tokens. An optimizer step is a window of ``accumulation × world_size``
consecutive batches of the plan (``accumulation`` micro-batches on each rank); the last window of an
epoch may be shorter, exactly as the trainer's last accumulation step is.
"""

from __future__ import annotations

import numpy as np


def per_batch(plan, lengths: np.ndarray) -> np.ndarray:
    """Label tokens of every batch of ``plan`` (int64), ``lengths`` being the planned entries' lengths."""
    offsets = np.asarray(plan.offsets, dtype=np.int64)
    labels = lengths[np.asarray(plan.indices)].astype(np.int64) - 1
    sums = np.concatenate([[0], np.cumsum(labels)])
    return sums[offsets[1:]] - sums[offsets[:-1]]


def per_step(plan, lengths: np.ndarray, accumulation: int) -> np.ndarray:
    """Label tokens of every optimizer step of ``plan``, all ranks and micro-batches together (int64)."""
    window = accumulation * plan.world_size
    batches = per_batch(plan, lengths)
    return np.add.reduceat(batches, np.arange(0, len(batches), window)) if len(batches) else batches

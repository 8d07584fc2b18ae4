"""Reference batching strategies in numpy, for side-by-side comparisons (benchmarks, the demo).

Each returns ``(order, offsets)`` in the same CSR form as a :class:`~dflash_batch.Plan`, so one
function, :func:`efficiency`, scores them all. These are the strategies of ``shared/CONTEXT.md``:
sorted static batches (the seed's first version), a full random shuffle, and the seed's bucketed
shuffle, written as a user would in numpy.
"""

from __future__ import annotations

import time

import numpy as np

from . import metrics

#: The seed's hand-picked bucket boundaries.
SEED_EDGES = (0, 770, 1216, 1728, 2432, 3296, 8192)


def efficiency(lengths: np.ndarray, order: np.ndarray, offsets: np.ndarray) -> float | None:
    """Real tokens / padded tokens (rows × longest row per batch), by the code that scores plans (None for
    no batches)."""
    return metrics.efficiency(lengths, order, offsets)


def _fixed(order: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.append(np.arange(0, len(order), batch_size), len(order))
    return order, offsets


def sorted_static(lengths: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Sort once by length and cut fixed batches (reused every epoch)."""
    return _fixed(np.argsort(lengths, kind="stable"), batch_size)


def random_shuffle(lengths: np.ndarray, batch_size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A full random shuffle cut into fixed batches."""
    return _fixed(np.random.default_rng(seed).permutation(len(lengths)), batch_size)


def seed_bucketed(
    lengths: np.ndarray,
    *,
    edges=SEED_EDGES,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """The seed's bucketed shuffle: shuffle inside each length bucket, cut batches inside buckets
    (fixed rows, or greedily under a padded-token budget), then shuffle the batch order."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    bucket = np.searchsorted(np.asarray(edges), lengths, side="left") - 1
    batches: list[np.ndarray] = []
    for b in range(len(edges) - 1):
        members = rng.permutation(np.flatnonzero(bucket == b))
        if batch_size is not None:
            batches.extend(np.array_split(members, np.arange(batch_size, len(members), batch_size)))
            continue
        start, longest = 0, 0
        for i, length in enumerate(lengths[members].tolist()):
            longest = max(longest, length)
            if (i - start + 1) * longest > max_tokens:
                batches.append(members[start:i])
                start, longest = i, length
        batches.append(members[start:])
    batches = [b for b in batches if len(b)]
    order = rng.permutation(len(batches))
    sizes = np.array([len(batches[i]) for i in order])
    return np.concatenate([batches[i] for i in order]), np.concatenate([[0], np.cumsum(sizes)])


def cut(lengths: np.ndarray, order: np.ndarray, *, batch_size: int | None = None, max_tokens: int | None = None):
    """``order`` cut into consecutive batches: fixed rows, or greedily under a padded-token budget."""
    if batch_size is not None:
        return _fixed(order, batch_size)
    lengths = np.asarray(lengths, dtype=np.int64)
    ends, longest, start = [], 0, 0
    for i, length in enumerate(lengths[order].tolist()):
        longest = max(longest, length)
        if (i - start + 1) * longest > max_tokens and i > start:
            ends.append(i)
            start, longest = i, length
    ends.append(len(order))
    return order, np.concatenate([[0], ends])


def megabatch_sorted(lengths: np.ndarray, batch_size: int = 8, seed: int = 0) -> np.ndarray:
    """HF transformers' ``LengthGroupedSampler`` order, in numpy: a random permutation cut into
    mega-batches of 50 batches, each sorted longest first (the result is an order; cut it)."""
    order = np.random.default_rng(seed).permutation(len(lengths))
    size = 50 * batch_size
    lengths = np.asarray(lengths)
    parts = [m[np.argsort(-lengths[m], kind="stable")] for m in np.split(order, np.arange(size, len(order), size))]
    return np.concatenate(parts)


def batch_rebalance(
    lengths: np.ndarray,
    *,
    world_size: int,
    accumulation: int,
    max_tokens: int,
    coefficient: float | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, float] | None:
    """HF transformers' ``BatchRebalanceSampler`` (≥ 5.24; ``train_sampling_strategy="batch_rebalance"``):
    every rank's micro-batches of one epoch in plan layout (batch ``step × world_size + rank``) and the
    seconds a rank takes to plan its epoch; ``None`` without it. It has no token cap: its samples per
    optimizer step are set so that a micro-batch holds ``max_tokens`` tokens on average. ``coefficient``
    replaces its attention weight (``QUADRATIC_COST_COEF``, 0.001 by default). Every rank runs the same
    assignment of each step's samples and keeps its own; this runs it once and keeps them all, as its
    ``__iter__`` does (``tests/tools/test_end_to_end.py`` checks rank 0 against the sampler's own iteration)."""
    try:
        import torch
        from transformers.trainer_pt_utils import BatchRebalanceSampler
    except ImportError:
        return None
    lengths = np.asarray(lengths)
    per_micro = max(1, round(max_tokens / float(lengths.mean())))
    effective = per_micro * world_size * accumulation
    peer = BatchRebalanceSampler(lengths.tolist(), effective, world_size, accumulation, seed=seed, rank=0)
    if coefficient is not None:
        peer.QUADRATIC_COST_COEF = coefficient
    start = time.perf_counter()
    generator = torch.Generator()
    generator.manual_seed(peer.seed + peer.epoch)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    batches: list[list[int]] = []
    for step in range(peer.num_global_batches):
        members = order[step * effective : (step + 1) * effective]
        # The peer's own assignment of one step (a benchmark baseline, not an integration).
        groups = peer._assign(members, [int(lengths[i]) for i in members])
        batches.extend(groups[rank][slot] for slot in range(accumulation) for rank in range(world_size))
    seconds = time.perf_counter() - start
    offsets = np.zeros(len(batches) + 1, dtype=np.uint32)
    np.cumsum([len(b) for b in batches], out=offsets[1:])
    return np.concatenate([np.asarray(b, dtype=np.uint32) for b in batches]), offsets, seconds

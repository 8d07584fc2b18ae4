"""``split_step``: one optimizer step's sequences — an RL step's rollouts, whose lengths are known only when
they end — split into every rank's micro-batches under a token budget, the same number on every rank, ranks
balanced by a cost model. No state; the same arguments give the same split (the core's ``online.rs``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import dflash_batch._core as _core

from ..base.arguments import _length_chunks


@dataclass(frozen=True)
class StepSplit:
    """Every rank's micro-batches of one step: ``split[rank][j]`` is rank ``rank``'s ``j``-th micro-batch (the
    indices of its sequences, read-only); every rank has ``micro_batches`` of them, costliest first, so the
    ``j``-th micro-batches of the ranks are alike. ``loads[rank]`` is the rank's total cost."""

    ranks: tuple[tuple[np.ndarray, ...], ...]
    micro_batches: int
    loads: tuple[float, ...]

    def __getitem__(self, rank: int) -> tuple[np.ndarray, ...]:
        return self.ranks[rank]

    def __len__(self) -> int:
        return len(self.ranks)

    @property
    def imbalance(self) -> float:
        """The most loaded rank's cost over the mean rank's (1.0: balanced)."""
        mean = sum(self.loads) / len(self.loads)
        return max(self.loads) / mean if mean > 0 else 1.0


def split_step(
    lengths: Any,
    *,
    world_size: int,
    max_tokens: int,
    mode: str = "padded",
    cost: str | tuple[float, float] = "tokens",
    seed: int = 0,
) -> StepSplit:
    """Splits one step's sequences into ``world_size`` ranks' micro-batches.

    Args:
        lengths: every sequence's token count (a 1-D integer array or list), in the order your batch holds them.
        world_size: the data-parallel ranks that train the step.
        max_tokens: what one micro-batch may hold: padded tokens (``rows × longest``), or with
            ``mode="packed"`` the sum of its lengths (one packed row). A sequence is never split.
        mode: ``"padded"`` or ``"packed"``.
        cost: what a row costs, for rank balance: ``"tokens"``, or ``(a, b)`` for ``a·L + b·L²`` (attention).
        seed: orders sequences of equal length.

    Returns:
        A :class:`StepSplit`: ``split[rank]`` is that rank's micro-batches.

    Raises:
        PlanError: no sequences, a zero length or one above ``max_tokens`` (kind ``sequence_over_budget``,
            ``row`` naming it), sequences that cannot give every rank as many micro-batches within the budget
            (kind ``step_too_small``), a bad setting.
        TypeError: a non-integer argument.
    """
    chunks = _length_chunks(lengths)
    values = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    offsets, indices, per_rank, loads = _core.split_step(
        values, world_size=world_size, max_tokens=max_tokens, mode=mode, cost=cost, seed=seed
    )
    indices.flags.writeable = False  # the split is a value: its micro-batches are read-only views
    world = len(loads)
    ranks = tuple(
        tuple(indices[offsets[j * world + r] : offsets[j * world + r + 1]] for j in range(per_rank))
        for r in range(world)
    )
    return StepSplit(ranks, int(per_rank), tuple(loads))

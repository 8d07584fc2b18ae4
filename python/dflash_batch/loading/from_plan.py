"""What a :class:`~dflash_batch.Loader` batch carries from the plan besides its tensors: the label tokens
of its optimizer step (``num_items_in_batch``), and for a mixture each row's source (``source``) and
each source's label tokens in the step (``num_items_per_source``). All are read from the epoch's plan —
the same on every rank, without communication."""

from __future__ import annotations

from typing import Any

import numpy as np


class FromPlan:
    """The per-step counts of one iteration's plan, and the sources of its batches' rows.

    Args:
        entries: how the plan's entries are read (:class:`~dflash_batch.planning.entries.Entries`).
        plan: the iteration's plan; ``shape``: its ``(accumulation, rank)``.
        store: the token store (its loss mask decides which tokens count).
        num_items: whether to add the label counts.
        device: where the small tensors go (the batch's device).
    """

    def __init__(
        self, entries: Any, plan: Any, shape: tuple[int, int], store: Any, num_items: bool, device: Any
    ) -> None:
        self._entries, self._plan, self._device = entries, plan, device
        (self._accumulation, self._rank), self._world = shape, plan.world_size
        self._mixed = entries.mixed
        self._counts = entries.label_tokens(plan, self._accumulation, store) if num_items else None
        by_source = num_items and self._mixed
        self._by_source = entries.label_tokens(plan, self._accumulation, store, by_source=True) if by_source else None

    def add(self, batch: dict[str, Any], step: int) -> None:
        """Adds to ``batch`` — step ``step`` of this rank in the plan — what it carries from the plan."""
        window = step // self._accumulation
        if self._counts is not None:
            batch["num_items_in_batch"] = int(self._counts[window])
        if self._mixed:
            rows = self._plan[step * self._world + self._rank]
            batch["source"] = self._on_device(self._entries.sources_of(rows))
        if self._by_source is not None:
            batch["num_items_per_source"] = self._on_device(self._by_source[window].copy())

    def _on_device(self, array: np.ndarray) -> Any:
        import torch

        tensor = torch.from_numpy(array)
        return tensor if self._device.type == "cpu" else tensor.to(self._device)

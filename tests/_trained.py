"""What a rank trains from a sampler, for the resume tests (tests/planning/test_elastic.py,
tests/data/test_mixture_schedule.py)."""

from __future__ import annotations

from typing import Any


def run(sampler: Any, steps: int | None = None) -> list[int]:
    """Samples of this rank's next `steps` batches (all of the epoch's rest when None)."""
    seen: list[int] = []
    if steps == 0:
        return seen
    for k, batch in enumerate(sampler):
        seen.extend(batch.tolist())
        if steps is not None and k + 1 == steps:
            break
    return seen

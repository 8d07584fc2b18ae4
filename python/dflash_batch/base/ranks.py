"""Where ranks come from (:func:`discover`, :func:`process_group_size`: the one place the package asks), and
ranks agree on the plan, or every rank says why not.

Every rank computes the same global plan from its own copy of the lengths and settings; nothing is
communicated. If one rank loads a different dataset, seed or setting, the ranks silently train on
overlapping or missing samples — or wait forever in a collective when their step counts differ. So at the
start of each epoch (when a process group exists) the ranks exchange what identifies the plan — one small
``all_gather_object`` — and all of them raise the same error naming what differs.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .._core import PlanError


def process_group_size() -> int | None:
    """The default process group's size when ``torch.distributed`` is initialized, else ``None``. Never
    imports torch."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return None


def discover() -> tuple[int, int]:
    """(world_size, rank) from torch.distributed when initialized, else from the ``WORLD_SIZE`` and ``RANK``
    variables that torchrun sets (a sampler built before ``init_process_group``), else (1, 0). Never
    imports torch."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    world, rank = os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
    if world is None or rank is None:
        return 1, 0
    try:
        return int(world), int(rank)
    except ValueError:
        raise PlanError(
            f"WORLD_SIZE={world!r} and RANK={rank!r} from the environment are not integers; "
            "pass world_size= and rank= explicitly"
        ) from None


def check_ranks_agree(identity: dict[str, Any]) -> None:
    """All-gathers ``identity`` (what determines the plan, without the rank) and raises :class:`PlanError`
    on every rank when any rank's differs. A collective: every rank must call it at the same point."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, identity)
    if all(other == gathered[0] for other in gathered):
        return
    differing = [key for key in identity if len({repr(g.get(key)) for g in gathered}) > 1]
    details = "; ".join(
        f"{key}: " + ", ".join(f"rank {r} {g.get(key)!r}" for r, g in enumerate(gathered)) for key in differing
    )
    raise PlanError(
        f"ranks disagree on the plan ({details}); every rank must build the sampler from the same lengths and "
        "settings (a different dataset, seed or setting would train on overlapping or missing samples, or hang "
        "a collective). Pass check_ranks=False to skip this check."
    )


def agree(schedule: Any, epoch: int) -> bool:
    """When a process group of the schedule's ``world_size`` ranks exists, the ranks agree on ``epoch``'s plan
    (a collective); returns whether they were asked. The sampler asks once per epoch."""
    if process_group_size() != schedule.world_size:
        return False
    check_ranks_agree(schedule.identity(epoch))
    return True

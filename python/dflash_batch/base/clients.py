"""Who iterates a sampler, as the clients themselves publish it: each adapter that knows a client
registers a finder here (``adapters/clients.py`` for accelerate), and the planning wing asks
:func:`reader_of` when an iteration starts, without knowing any client. The finder returns the client
that iterates the sampler and the reason its loop cannot say what was trained, or ``None``; it may
raise ``PlanError`` for a use of the client that would lose samples."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class Reader(NamedTuple):
    """The client iterating a sampler that reads ahead of the training loop."""

    client: str
    #: Why the sampler's own ``state_dict()`` refuses while the client iterates, and what to do instead.
    reads_ahead: str


Finder = Callable[[Any, type], "Reader | None"]
#: The finders the adapters registered, asked in order.
_FINDERS: list[Finder] = []


def register(finder: Finder) -> None:
    """Adds ``finder(sampler, global_view_type) -> Reader | None`` (once)."""
    if finder not in _FINDERS:
        _FINDERS.append(finder)


def reader_of(sampler: Any, global_view: type) -> Reader | None:
    """The client that iterates ``sampler`` (or a ``global_view`` of it) and reads ahead, if any."""
    for finder in _FINDERS:
        reader = finder(sampler, global_view)
        if reader is not None:
            return reader
    return None

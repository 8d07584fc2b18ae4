"""``Keys``: every epoch's plan key, derived from one immutable value.

A plan is a pure function of its key: the lengths and settings (a :class:`~dflash_batch.planning.schedule.Schedule`,
whose fingerprint covers a mixture's sources, weights and cycle), the seed, the epoch — and the rank price
in force for that epoch, which a :class:`~dflash_batch.StepTimer` may refit during a run. ``Keys`` is the
schedule plus the run's prices by epoch (``((first epoch, (a, b)), ...)``): :meth:`Keys.at` gives the
schedule that plans any epoch, so decoding a checkpoint, re-planning the origin of an elastic resume and the
epoch carrying its rest, pickling and the running position all call the same function on the same value.
There is no "current price": an epoch is planned by the price recorded for it, whatever happened since.

A changed price is a new ``Keys`` (:meth:`Keys.with_price_from`); the position (``cursor.py``) swaps it
whole, and checkpoints record the prices (:func:`encode_prices`), so a resume derives every epoch's key
from the checkpoint alone.
"""

from __future__ import annotations

from typing import Any

from .._core import PlanError
from ..base.arguments import _is_int
from .schedule import Schedule

#: A run's rank prices: ``(first epoch, (a, b))`` in increasing epochs, each balancing the ranks of its epochs
#: on until the next (``Cursor.price_from``; written by :class:`~dflash_batch.StepTimer`).
Prices = tuple[tuple[int, tuple[float, float]], ...]


def price_at(prices: Prices, epoch: int) -> tuple[float, float] | None:
    """The rank price of ``epoch`` (``None``: the schedule's own)."""
    chosen = None
    for first, price in prices:
        if first <= epoch:
            chosen = price
    return chosen


class Keys:
    """The schedule and the rank prices of a run: every epoch's plan key (module docs). Immutable."""

    __slots__ = ("_priced", "prices", "schedule")
    schedule: Schedule
    prices: Prices
    _priced: dict[Any, Schedule]

    def __init__(self, schedule: Schedule, prices: Prices = (), priced: dict[Any, Schedule] | None = None) -> None:
        object.__setattr__(self, "schedule", schedule)
        object.__setattr__(self, "prices", prices)
        # Priced schedules built so far (building one is a planner's construction), shared by the Keys
        # derived from this one: a memo of a pure function, not state.
        object.__setattr__(self, "_priced", {} if priced is None else priced)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Keys are read-only ({name!r}); derive new ones with with_price_from/with_prices")

    def at(self, epoch: int) -> Schedule:
        """The schedule that plans ``epoch``: the schedule, with the rank price of ``epoch`` when one is set."""
        return self.priced(price_at(self.prices, epoch))

    def priced(self, price: tuple[float, float] | None) -> Schedule:
        """The schedule balancing its ranks by ``price`` (``None``: its own); checked by the planner."""
        if price is None:
            return self.schedule
        schedule = self._priced.get(price)
        if schedule is None:
            schedule = self.schedule.replace(rank_cost=price)
            self._priced.clear()  # one priced planner kept: a run changes price rarely, and each holds a plan
            self._priced[price] = schedule
        return schedule

    def with_price_from(self, epoch: int, price: tuple[float, float]) -> Keys:
        """These keys with ``price`` from ``epoch`` on (later prices dropped); the price checked first."""
        price = (float(price[0]), float(price[1]))
        self.priced(price)
        return Keys(self.schedule, (*(p for p in self.prices if p[0] < epoch), (epoch, price)), self._priced)

    def with_prices(self, prices: Prices) -> Keys:
        """These keys with ``prices`` instead, each checked against the settings first (a ``PlanError``
        naming it); a price's planner is built when an epoch it prices is planned (a run refitted every
        epoch records one price an epoch: building them all at a resume would cost a planner each)."""
        config = self.schedule.config
        for _, price in prices:
            config.replace(rank_cost=price)
        return Keys(self.schedule, prices, self._priced)

    def same_from(self, epoch: int) -> bool:
        """Whether ``epoch`` and the one after it are planned by the same price."""
        return price_at(self.prices, epoch + 1) == price_at(self.prices, epoch)


def encode_prices(prices: Prices) -> list[list[float]]:
    """``[[first epoch, a, b], ...]``: plain values a checkpoint may carry through JSON."""
    return [[first, a, b] for first, (a, b) in prices]


def decode_prices(value: Any) -> Prices:
    """What :func:`encode_prices` wrote, checked (``PlanError`` naming what is wrong)."""
    if value is None:
        return ()
    bad = PlanError(
        f"state rank_costs={value!r} is not what state_dict() writes (a list of [first epoch, a, b] in increasing "
        "epochs); pass the checkpoint's state unedited"
    )
    if not isinstance(value, list | tuple):
        raise bad
    prices: list[tuple[int, tuple[float, float]]] = []
    for entry in value:
        if not (isinstance(entry, list | tuple) and len(entry) == 3):
            raise bad
        first, a, b = entry
        numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))
        if not _is_int(first) or first < 0 or not numbers:
            raise bad
        if prices and first <= prices[-1][0]:
            raise bad
        prices.append((int(first), (float(a), float(b))))
    return tuple(prices)


def state_prices(state: Any) -> Prices:
    """The rank prices a checkpoint's ``state`` records (none: the schedule's own), checked."""
    return decode_prices(state.get("rank_costs") if isinstance(state, dict) else None)

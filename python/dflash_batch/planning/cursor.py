"""``Cursor``: where training is in a :class:`~dflash_batch.planning.schedule.Schedule` — the one object that owns the
position — and ``Run``, one iteration of an epoch.

The position is the epoch, the steps of it handed to the training loop, whether the next iteration
resumes at that step (after ``load_state_dict`` or ``skip``), and, after a resume on another number of
ranks, where that epoch came from (a typed :class:`~dflash_batch.planning.checkpoint.Origin`). The sampler's
iterator, the :class:`~dflash_batch.Loader` and every adapter drive the same protocol; none keeps a copy:

* ``begin()`` starts an iteration of the current epoch — at the resumed step, else at 0 — as a
  :class:`Run`. A newer run supersedes an older one of the same thread; a run started while another
  live thread's run is going raises ``RuntimeError`` (two threads would each train the whole epoch);
* ``Run.advance(step)`` says the batch completing ``step`` steps was handed to the loop;
  ``Run.finish(exhausted)`` that the iteration ended;
* ``set_epoch``, ``skip`` and ``load_state_dict`` move the position **at once**. A run that was going
  is superseded: its next batch raises ``RuntimeError`` naming what happened — an iteration never ends
  early in silence. A load that is refused (any ``PlanError``) changes nothing, the running run included;
* ``state_dict(step=None)`` records the steps handed out (or ``step``, what the loop says it trained);
* ``price_from(epoch, (a, b))`` balances the ranks of epochs from ``epoch`` on by that price (a cost refitted
  from step times: :class:`~dflash_batch.StepTimer`), never an epoch already begun. The prices are part of
  every epoch's plan key (:class:`~dflash_batch.planning.plan_key.Keys`, held whole and swapped whole): an epoch is
  planned by ``schedule_at(epoch)``, and checkpoints, copies and resumes carry the prices, so every epoch —
  an elastic origin and the epoch carrying its rest included — is planned as it was trained.

Every method takes one lock, so a checkpoint written from another thread sees one consistent position.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import Any

from .._core import Plan, PlanError
from ..base.clients import Reader
from ..base.errors import invalid_setting
from . import checkpoint
from .checkpoint import Origin
from .plan_key import Keys, Prices, encode_prices, state_prices
from .schedule import Schedule

SUPERSEDED = (
    "this iteration was superseded: {why} moved the position while it was running, and continuing it would "
    "hand out batches the position no longer counts; start a new iteration (iter(loader) or iter(sampler) "
    "again), which begins where the position now is"
)

_LIVE, _SUPERSEDED, _FINISHED = "live", "superseded", "finished"


class Run:
    """One iteration of an epoch: ``plan``, its ``steps`` and the ``start`` step; it hands out batches only
    while it owns the position (see the module docs)."""

    __slots__ = ("_cursor", "_state", "_why", "plan", "reader", "start", "steps", "token")

    def __init__(self, cursor: Cursor, plan: Plan, start: int, token: int, reader: Reader | None) -> None:
        self._cursor, self.plan, self.start, self.steps, self.token = cursor, plan, start, plan.steps, token
        # A client that reads batches ahead of the training loop (it takes more than were trained).
        self.reader = reader
        self._state, self._why = _LIVE, ""

    @property
    def live(self) -> bool:
        return self._state == _LIVE

    @property
    def superseded(self) -> bool:
        return self._state == _SUPERSEDED

    def advance(self, step: int) -> None:
        """The batch that completes ``step`` steps was handed out; raises when superseded."""
        self._cursor._advance(self, step)

    def check(self) -> None:
        """Raises ``RuntimeError`` when another call took over the position."""
        if self._state == _SUPERSEDED:
            raise RuntimeError(SUPERSEDED.format(why=self._why))

    def finish(self, exhausted: bool) -> None:
        """The iteration ended: ran out (``exhausted``), was closed or was collected."""
        self._cursor._finish(self, exhausted)

    def batches(self, shares: tuple[int, ...] | range) -> Iterator[tuple[int, Any]]:
        """``(step, batch)`` for the plan batches of ``shares`` (rank numbers) of every step from
        :attr:`start`, in plan order: reading the plan only, the position untouched."""
        plan, world = self.plan, self.plan.world_size
        for step in range(self.start, self.steps):
            for share in shares:
                yield step, plan[step * world + share]


class Cursor:
    """The training position in ``schedule`` (see the module docs)."""

    def __init__(self, schedule: Schedule) -> None:
        self._schedule = schedule
        self._lock = threading.RLock()
        self._epoch, self._step, self._resume = 0, 0, False
        self._origin: Origin | None = None
        self._tokens = itertools.count(1)
        self._live: Run | None = None
        self._owner: threading.Thread | None = None
        # The current epoch's plan: (epoch, origin it was planned from, plan).
        self._cached: tuple[int, Origin | None, Plan] | None = None
        # Every epoch's plan key: the schedule and the rank prices by epoch.
        self._keys = Keys(schedule)

    # -- reading --------------------------------------------------------------------------------------

    @property
    def schedule(self) -> Schedule:
        return self._schedule

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def step(self) -> int:
        """Batches of the epoch handed out (or resumed past)."""
        return self._step

    @property
    def resume_pending(self) -> bool:
        """Whether the next iteration starts at :attr:`step` rather than at 0."""
        return self._resume

    @property
    def prices(self) -> Prices:
        """The rank prices set so far: ``(first epoch, (a, b))`` in increasing epochs."""
        return self._keys.prices

    @property
    def keys(self) -> Keys:
        """Every epoch's plan key (:mod:`dflash_batch.planning.plan_key`): the schedule and the prices by epoch."""
        return self._keys

    def schedule_at(self, epoch: int) -> Schedule:
        """The schedule ``epoch`` is planned by: the schedule, with the rank price of ``epoch`` when one is set."""
        return self._keys.at(epoch)

    @property
    def origin(self) -> Origin | None:
        """Where the current (or the previous) epoch came from after a resume on another number of ranks."""
        return self._origin

    @property
    def running(self) -> bool:
        """Whether an iteration is going (begun and neither finished nor superseded)."""
        return self._live is not None

    def plan(self, epoch: int | None = None) -> Plan:
        """Epoch ``epoch``'s plan as this position trains it (default: the current epoch): the re-planned
        rest of an elastically resumed epoch, an epoch carrying that rest's leftovers, or the schedule's."""
        with self._lock:
            epoch = self._epoch if epoch is None else epoch
            origin = self._origin
            if origin is not None and origin.epoch == epoch:
                return origin.plan
            cached = self._cached
            if cached is not None and cached[0] == epoch and cached[1] is origin:
                return cached[2]
            del cached  # a local reference would keep the old plan alive while the next is planned
            current = epoch == self._epoch
            if current:  # released before planning its successor: one epoch's plan at a time
                self._cached = None
            keys = self._keys
            schedule = keys.at(epoch)
            if origin is not None and epoch == origin.epoch + 1 and len(origin.carried):
                plan = schedule.plan_carrying(epoch, origin.carried)
            else:
                plan = schedule.plan(epoch)
            if current:
                self._cached = (epoch, origin, plan)
                # With a plan_dir, the next epoch is made while this one trains — when it is planned by
                # the same schedule: another price would build (and cache, evicting this one's) a planner.
                if schedule.plan_dir is not None and keys.same_from(epoch):
                    schedule.plan_ahead(epoch + 1)
            return plan

    def state_dict(self, step: int | None = None) -> dict[str, Any]:
        """The position as a plain dict: the steps handed out, or ``step`` of them when the caller says how
        many the loop trained (checked against what was handed out). Without ``step``, refused while a
        client that reads ahead of the loop iterates (it cannot be told what was trained)."""
        with self._lock:
            epoch, handed_out, origin, live, keys = self._epoch, self._step, self._origin, self._live, self._keys
        if step is None and live is not None and live.reader is not None:
            raise PlanError(live.reader.reads_ahead)
        trained = handed_out if step is None else checkpoint.trained_step(step, handed_out, epoch)
        return checkpoint.encode(keys, epoch, trained, origin)

    def load_prices(self, state: Any) -> None:
        """Takes the rank prices of a checkpoint's ``state`` (its ``rank_costs``; none: the schedule's own)
        without resuming its position — for a trainer that fast-forwards the epoch itself, before it
        iterates. Refused while an iteration runs (nothing changes then)."""
        prices = state_prices(state)
        with self._lock:
            if self._live is not None:
                raise PlanError(
                    "a checkpoint's rank prices cannot be taken while an iteration runs (its batches would change "
                    "under it); finish or close the iteration first, or load the whole state with load_state_dict"
                )
            self._keys, self._cached = self._keys.with_prices(prices), None  # each checked first

    def price_from(self, epoch: int, price: tuple[float, float]) -> None:
        """Balances the ranks of epochs from ``epoch`` on by ``price`` (``(a, b)``: a row of ``L`` tokens takes
        ``a·L + b·L²``), leaving every batch and the step count as they are. Refused for an epoch already
        begun (its batches are being trained) and for a price the planner refuses; nothing changes then."""
        with self._lock:
            begun = self._step > 0 or self._live is not None or self._resume
            if epoch < self._epoch or (epoch == self._epoch and begun):
                raise PlanError(
                    f"epoch {epoch} has begun (the position is at step {self._step} of epoch {self._epoch}): its "
                    f"plan cannot change while it trains; set a price from epoch {self._epoch + 1} on"
                )
            self._keys = self._keys.with_price_from(epoch, price)  # checked (and built) before anything changes
            if epoch <= self._epoch:
                self._cached = None

    def price_after(self, epoch: int, price: tuple[float, float]) -> int:
        """Balances the ranks by ``price`` from the first epoch after ``epoch`` that has not begun (the one
        after the current epoch when that has begun since: a fit of epoch ``epoch``'s timings made late);
        returns that epoch. Refused like :meth:`price_from`."""
        with self._lock:
            begun = self._step > 0 or self._live is not None or self._resume
            start = max(epoch + 1, self._epoch + 1 if begun else self._epoch)
            self.price_from(start, price)
            return start

    # -- moving the position --------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> int | None:
        """Moves to ``epoch`` at step 0 (the same epoch changes nothing); returns the step of a pending
        resume this discards, if any."""
        with self._lock:
            if epoch == self._epoch:
                return None
            discarded = self._step if self._resume and self._step > 0 else None
            self._epoch, self._step, self._resume = epoch, 0, False
            self._supersede(f"set_epoch({epoch})")
            return discarded

    def skip(self, step: Any) -> None:
        """The next iteration of the current epoch starts at ``step``, as a resume would."""
        total = self.plan().steps
        if isinstance(step, bool) or not hasattr(step, "__index__") or not 0 <= step <= total:
            raise invalid_setting(
                "steps", f"steps={step!r} is invalid; pass 0 ≤ steps ≤ {total}, the steps of epoch {self._epoch}"
            )
        with self._lock:
            self._step, self._resume = int(step), True
            self._supersede(f"skip({int(step)})")

    def load_state_dict(self, state: Any) -> None:
        """Resumes at ``state``: checked completely (an elastic resume planned) before anything changes."""
        resume, keys = checkpoint.decode(self._keys, state)
        with self._lock:
            self._epoch, self._step, self._resume, self._origin = resume.epoch, resume.step, True, resume.origin
            self._keys, self._cached = keys, None
            self._supersede("load_state_dict")

    def _supersede(self, why: str) -> None:
        run = self._live
        if run is not None:
            run._state, run._why = _SUPERSEDED, why
        self._live = self._owner = None

    # -- iterations -----------------------------------------------------------------------------------

    def begin(self, reader: Reader | None = None) -> Run:
        """Starts an iteration of the current epoch (see the module docs); ``reader`` names a client that
        takes its batches ahead of the training loop."""
        with self._lock:
            me, owner = threading.current_thread(), self._owner
            if self._live is not None and owner is not None and owner is not me and owner.is_alive():
                raise RuntimeError(
                    f"this sampler is already being iterated by thread {owner.name!r} (epoch {self._epoch}, "
                    f"{self._step} steps handed out); two iterations at once would each train the whole epoch. "
                    "Iterate one sampler or Loader from one thread at a time: finish or close() the other "
                    "iteration first, or give each thread its own sampler"
                )
            plan = self.plan()
            start = min(self._step, plan.steps) if self._resume else 0
            self._supersede("a newer iteration")
            run = Run(self, plan, start, next(self._tokens), reader)
            self._live, self._owner, self._step = run, me, start
            return run

    def _advance(self, run: Run, step: int) -> None:
        with self._lock:
            if run is not self._live:
                run.check()
                raise RuntimeError("this iteration has ended; start a new one (iter(loader) or iter(sampler))")
            self._step, self._resume = step, False

    def _finish(self, run: Run, exhausted: bool) -> None:
        with self._lock:
            if run is not self._live:
                return
            run._state = _FINISHED
            self._live = self._owner = None
            if exhausted:
                self._resume = False

    # -- copies (pickling: a DataLoader worker's sampler; the lock and the live run stay behind) --------

    def snapshot(self) -> dict[str, Any]:
        """Plain values: the epoch, step, pending resume and the elastic origin (without its plan)."""
        with self._lock:
            origin = self._origin
            where = (
                None
                if origin is None
                else {"epoch": origin.epoch, "world_size": origin.world_size, "step": origin.step}
            )
            return {
                "epoch": self._epoch,
                "step": self._step,
                "resume": self._resume,
                "elastic": where,
                "rank_costs": encode_prices(self._keys.prices),
            }

    @classmethod
    def from_snapshot(cls, schedule: Schedule, snapshot: dict[str, Any]) -> Cursor:
        """The position a :meth:`snapshot` describes, on ``schedule`` (its origin planned again, quietly:
        the original warned once about carried samples)."""
        cursor = cls(schedule)
        cursor._keys = cursor._keys.with_prices(state_prices(snapshot))
        where = snapshot["elastic"]
        if where is not None:
            cursor._origin = checkpoint.replanned(
                cursor._keys.at(where["epoch"]), where["epoch"], where["world_size"], where["step"], warn=False
            )
        cursor._epoch, cursor._step, cursor._resume = snapshot["epoch"], snapshot["step"], snapshot["resume"]
        return cursor

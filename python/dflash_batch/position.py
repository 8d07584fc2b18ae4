"""Where training is in the plan: the one object that owns a sampler's position.

A sampler's position is its epoch, the steps of that epoch handed to the training loop, whether the next
iteration resumes at that step (after ``load_state_dict`` or ``Loader.skip``) and, after a resume on
another number of ranks, where that epoch's plan came from. The sampler, the :class:`Loader`,
accelerate's shard, the Trainer and the checkpoint code all go through this small protocol; none of them
keeps a copy, so what a checkpoint records is what the loop was handed — at the moment it is asked.

The protocol:

* ``set_epoch(e)`` — a new epoch starts at step 0 (the same epoch again changes nothing);
* ``begin(steps)`` — an iteration of the current epoch starts, at the resumed step or at 0; it gets a
  token, and only the newest iteration may hand out batches (an older one raises ``RuntimeError``);
  beginning while an iteration in *another* live thread is running raises ``RuntimeError`` (two threads
  each training the whole epoch would train every sample twice);
* ``advance(token, step)`` — the batch that completes ``step`` steps was handed out;
* ``finish(token, exhausted)`` — the iteration ended (ran out, was closed or collected);
* ``skip(step)`` / ``restore(...)`` — the next iteration resumes at ``step`` (a checkpoint's, all checked
  before anything changes);
* ``state()`` — the epoch, the steps the loop has trained on (handed out, less those a consumer such as a
  torch ``DataLoader`` or accelerate's shard has fetched ahead: :mod:`dflash_batch._in_flight`) and the
  elastic origin.

Every method takes a lock, so a checkpoint written from another thread sees one consistent position.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

SUPERSEDED = (
    "this iteration of the sampler was superseded: a newer iteration, set_epoch, load_state_dict or skip took "
    "over its position, and continuing it would hand out batches the position no longer counts; iterate the "
    "newest iterator (iter(loader) again starts the epoch where the position says)"
)


class Position:
    """Epoch, steps handed out, a pending resume and the elastic origin of one sampler (see module docs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epoch = 0
        self._step = 0
        self._resume = False
        # After a resume on another number of ranks: {"epoch", "plan", "world_size", "step", "carried"}.
        self._elastic: dict[str, Any] | None = None
        # Bumped by every restore: plans cached under an older one may be another origin's.
        self._generation = 0
        self._tokens = itertools.count(1)
        self._live: int | None = None
        self._owner: threading.Thread | None = None
        self._consumer: Any = None

    # -- reading --------------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def step(self) -> int:
        """Batches of the epoch handed out (or resumed past), counting those a consumer fetched ahead."""
        return self._step

    @property
    def resume_pending(self) -> bool:
        """Whether the next iteration starts at :attr:`step` rather than at 0."""
        return self._resume

    @property
    def elastic(self) -> dict[str, Any] | None:
        return self._elastic

    @property
    def generation(self) -> int:
        return self._generation

    def state(self) -> tuple[int, int, dict[str, Any] | None]:
        """``(epoch, steps trained, elastic origin)``: batches handed out less those a consumer holds
        un-trained (fetched ahead of the loop)."""
        with self._lock:
            ahead = self._consumer.in_flight() if self._consumer is not None else 0
            return self._epoch, max(self._step - ahead, 0), self._elastic

    # -- the protocol ---------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> int | None:
        """Moves to ``epoch`` at step 0; returns the step of a pending resume this discards, if any."""
        with self._lock:
            if epoch == self._epoch:
                return None
            discarded = self._step if self._resume and self._step > 0 else None
            self._epoch, self._step, self._resume = epoch, 0, False
            self._end_live()
            return discarded

    def begin(self, steps: int) -> tuple[int, int]:
        """Starts an iteration of the current epoch (``steps`` steps): ``(token, first step)``."""
        with self._lock:
            me = threading.current_thread()
            owner = self._owner
            if self._live is not None and owner is not None and owner is not me and owner.is_alive():
                raise RuntimeError(
                    f"this sampler is already being iterated by thread {owner.name!r} (epoch {self._epoch}, "
                    f"{self._step} of {steps} steps handed out); two iterations at once would each train the "
                    "whole epoch. Iterate one sampler or Loader from one thread at a time: finish or close() "
                    "the other iteration first, or give each thread its own sampler"
                )
            start = min(self._step, steps) if self._resume else 0
            token = next(self._tokens)
            self._live, self._owner, self._step, self._consumer = token, me, start, None
            return token, start

    def advance(self, token: int, step: int, consumer: Any = None) -> None:
        """The batch completing ``step`` steps was handed out by iteration ``token``; ``consumer`` (at the
        first hand-out) reports batches it fetched ahead of the loop."""
        with self._lock:
            if token != self._live:
                raise RuntimeError(SUPERSEDED)
            self._step, self._resume = step, False
            if consumer is not None:
                self._consumer = consumer

    def finish(self, token: int, exhausted: bool) -> None:
        """Iteration ``token`` ended; an exhausted one used up the resume (a pending one that handed out
        nothing is kept for the next iteration)."""
        with self._lock:
            if token != self._live:
                return
            self._live = self._owner = None
            if exhausted:
                self._resume = False

    def check(self, token: int) -> None:
        """Raises when iteration ``token`` is no longer the live one."""
        if token != self._live:
            raise RuntimeError(SUPERSEDED)

    def skip(self, step: int) -> None:
        """The next iteration of the current epoch starts at ``step`` (checked by the caller)."""
        with self._lock:
            self._step, self._resume = step, True
            self._end_live()

    def restore(self, epoch: int, step: int, elastic: dict[str, Any] | None) -> None:
        """Commits a checked checkpoint at once: the next iteration starts at ``step`` of ``epoch``."""
        with self._lock:
            self._epoch, self._step, self._resume, self._elastic = epoch, step, True, elastic
            self._generation += 1
            self._end_live()

    def _end_live(self) -> None:
        self._live = self._owner = self._consumer = None

    # -- copies (pickling: a DataLoader worker's sampler; the lock and live iteration stay behind) ------

    def snapshot(self) -> dict[str, Any]:
        """Plain values: the epoch, step, pending resume and the elastic origin (without its plan)."""
        with self._lock:
            elastic = self._elastic
            origin = None if elastic is None else {k: elastic[k] for k in ("epoch", "world_size", "step")}
            return {"epoch": self._epoch, "step": self._step, "resume": self._resume, "elastic": origin}

    @classmethod
    def from_snapshot(cls, snapshot: dict[str, Any], elastic: dict[str, Any] | None) -> Position:
        """The position a :meth:`snapshot` describes, ``elastic`` being its origin planned again."""
        position = cls()
        position._epoch, position._step = snapshot["epoch"], snapshot["step"]
        position._resume, position._elastic = snapshot["resume"], elastic
        return position

"""``Schedule``: what never changes during a run — the lengths, the planning settings, the Rust planner
and the fingerprint of both — as one read-only object.

A schedule answers questions and plans epochs; it holds no position. Everything that moves (the epoch,
the steps handed out, a pending resume, where an elastic resume came from) lives in one
:class:`~dflash_batch.planning.cursor.Cursor`, which asks its schedule and never writes it. Plans are pure
functions of ``(lengths, settings, epoch)``: every rank builds the same schedule and plans the same
epochs without talking to the others.

A changed setting is a new schedule (:meth:`Schedule.replace`), never an edit, so a checkpoint, a
pickled copy in a ``DataLoader`` worker and the running sampler can never disagree on what they plan.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

import numpy as np

import dflash_batch._core as _core

from .._core import DataError, Plan
from ..base import runtime
from . import plan_files


class Schedule:
    """The planner of one dataset under one configuration (see the module docs).

    Args:
        chunks: 1-D integer numpy arrays whose concatenation is every sample's length (one chunk per
            Arrow record batch needs no copy).
        config: the checked settings (:class:`dflash_batch._core.Config`).
        mixture: the sources the lengths are, concatenated, with their weights (``_core.Mixture``).
        plan_dir: a directory every process of a machine can write (``/dev/shm/...``): epochs are then
            planned once per machine there and mapped by the others (:meth:`plan`); ``None`` plans on
            every process.
    """

    __slots__ = (
        "_ahead", "_ahead_lock", "_any_ranks", "_bounds", "_config", "_fingerprint", "_mapped", "_mapped_identity",
        "_mixture", "_on_ranks", "_plan_dir", "_planner",
    )  # fmt: skip
    _config: _core.Config
    _planner: _core.Planner
    _mixture: _core.Mixture | None
    _bounds: np.ndarray | None
    _fingerprint: str | None
    _any_ranks: str | None
    _on_ranks: dict[int, str]
    _plan_dir: str | None
    _ahead: dict[int, Future[Plan]]
    _ahead_lock: threading.Lock
    _mapped: np.ndarray | None
    _mapped_identity: tuple[int, int] | None

    def __init__(
        self,
        chunks: Iterable[np.ndarray],
        config: _core.Config,
        mixture: _core.Mixture | None = None,
        plan_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        plan_dir = _plan_dir(plan_dir)
        chunks = list(chunks)
        planner = _core.Planner(chunks, config, mixture)
        # The caller's read-only map the planner borrows: changed schedules and copies map it again.
        object.__setattr__(self, "_mapped", chunks[0] if planner.lengths_borrowed else None)
        # Which file that is (device, inode): a copy maps it again by name only while the name is still it.
        object.__setattr__(
            self, "_mapped_identity", _identity(_mapped_file(chunks[0])[0]) if self._mapped is not None else None
        )
        object.__setattr__(self, "_plan_dir", plan_dir)
        # Plans of later epochs being made in the background (`plan_ahead`): a memo of a pure function.
        object.__setattr__(self, "_ahead", {})
        object.__setattr__(self, "_ahead_lock", threading.Lock())
        object.__setattr__(self, "_mixture", mixture)
        bounds = None if mixture is None else np.concatenate([[0], np.cumsum(mixture.rows)]).astype(np.int64)
        object.__setattr__(self, "_bounds", bounds)
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "_planner", planner)
        # Hashing every length costs a pass over them: done once, on first use.
        object.__setattr__(self, "_fingerprint", None)
        object.__setattr__(self, "_any_ranks", None)
        object.__setattr__(self, "_on_ranks", {})

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a Schedule is read-only ({name!r}); make a changed one with replace(...)")

    # -- what it is -----------------------------------------------------------------------------------

    @property
    def config(self) -> _core.Config:
        """The checked settings, frozen."""
        return self._config

    def settings(self) -> dict[str, Any]:
        """Every planning setting as plain values, ``world_size`` included (what checkpoints record), and a
        mixture's sources and weights under ``"mixture"``."""
        return Schedule.settings_of(self._config, self._mixture)

    @staticmethod
    def settings_of(config: _core.Config, mixture: _core.Mixture | None) -> dict[str, Any]:
        """:meth:`settings` of ``config`` and ``mixture``."""
        settings = dict(config.settings())
        if mixture is not None:
            settings["mixture"] = dict(mixture.settings())
        return settings

    @property
    def mixture(self) -> _core.Mixture | None:
        """The sources and weights the lengths are, when they are a mixture's."""
        return self._mixture

    def sources_of(self, rows: Any) -> np.ndarray:
        """The source number (int64) of each of ``rows``: all 0 without a mixture."""
        rows = np.asarray(rows, dtype=np.int64)
        if self._bounds is None:
            return np.zeros(rows.shape, dtype=np.int64)
        return np.searchsorted(self._bounds, rows, side="right") - 1

    @property
    def world_size(self) -> int:
        return int(self._config.world_size)

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimizer step the plans are arranged for."""
        return int(self._config.accumulation)

    @property
    def mode(self) -> str:
        return str(self._config.mode)

    @property
    def max_tokens(self) -> int | None:
        return self._config.max_tokens

    @property
    def pad_to_multiple_of(self) -> int:
        """What padded lengths are rounded up to: the plan's budgets count the padding, so this is the one
        value every collation of these plans pads with."""
        return int(self._config.get("pad_to_multiple_of"))

    @property
    def num_samples(self) -> int:
        """Rows of the dataset (with ``oversize="truncate"``, not counting the extra pieces)."""
        return int(self._planner.num_samples)

    @property
    def entries(self) -> int:
        """Entries a plan indexes: the rows, then the later pieces of split samples."""
        return len(self._planner)

    @property
    def truncated(self) -> int:
        """Samples longer than ``max_tokens`` split into pieces (``oversize="truncate"``; else 0)."""
        return int(self._planner.truncated)

    @property
    def lengths_borrowed(self) -> bool:
        """Whether the planner borrows the caller's read-only ``numpy.memmap`` of the lengths instead of
        copying them (``docs/billion.md``: the ranks of a machine then share one copy)."""
        return bool(self._planner.lengths_borrowed)

    @property
    def edges(self) -> list[int]:
        return list(self._planner.edges)

    @property
    def predicted_efficiency(self) -> float:
        return float(self._planner.predicted_efficiency)

    @property
    def steps(self) -> int:
        """Steps per rank of every epoch planned from the start (the same for every epoch)."""
        return int(self._planner.steps)

    @property
    def fingerprint(self) -> str:
        """Lengths and settings hashed (16 hex digits): equal schedules plan equal epochs."""
        if self._fingerprint is None:
            object.__setattr__(self, "_fingerprint", self._planner.fingerprint)
        return str(self._fingerprint)

    @property
    def fingerprint_any_ranks(self) -> str:
        """The fingerprint as if for one rank: equal for schedules that differ only in ``world_size``."""
        if self._any_ranks is None:
            object.__setattr__(self, "_any_ranks", self._planner.fingerprint_any_ranks)
        return str(self._any_ranks)

    def fingerprint_on(self, world_size: int) -> str:
        """The fingerprint these lengths and settings have on ``world_size`` ranks (a default target that
        depends on the step shape resolved there): what a checkpoint taken there recorded."""
        if world_size == self.world_size:
            return self.fingerprint
        if world_size not in self._on_ranks:  # a pass over every length; a resume asks more than once
            self._on_ranks[world_size] = str(self._planner.fingerprint_on(world_size))
        return self._on_ranks[world_size]

    def settings_on(self, world_size: int) -> dict[str, Any]:
        """:meth:`settings` as they are on ``world_size`` ranks (the default target resolved there)."""
        if world_size == self.world_size:
            return self.settings()
        return Schedule.settings_of(self._config.replace(world_size=world_size), self._mixture)

    def identity(self, epoch: int) -> dict[str, Any]:
        """What every rank of a run must agree on to train disjoint shares of ``epoch``."""
        return {"fingerprint": self.fingerprint, "num_samples": self.num_samples, "epoch": epoch, **self.settings()}

    def lengths(self) -> np.ndarray:
        """A copy of every planned entry's length (rows, then the later pieces of split samples)."""
        return np.asarray(self._planner.lengths())

    def dataset_lengths(self) -> np.ndarray:
        """A copy of every dataset row's length: what this schedule was built from."""
        return np.asarray(self._planner.dataset_lengths())

    def locate(self, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(rows, starts, lengths)`` of plan ``entries`` (int64): the token window each one trains."""
        return self._planner.locate(entries)

    def plans_changed_since(self, revision: int, world_size: int) -> bool:
        """Whether plans of these settings on ``world_size`` ranks changed since planning rules ``revision``."""
        return bool(self._planner.plans_changed_since(revision, world_size))

    # -- planning -------------------------------------------------------------------------------------

    @property
    def plan_dir(self) -> str | None:
        """Where epochs are planned once per machine and shared (``None``: every process plans)."""
        return self._plan_dir

    def plan(self, epoch: int) -> Plan:
        """Epoch ``epoch`` from its start, every rank's batches in training order. With a ``plan_dir`` the
        first process of the machine to ask plans it into a file there and every other maps it, checked
        (the arrays are read-only maps; a file there that is not this plan raises ``DataError``)."""
        if self._plan_dir is None:
            return self._planner.plan(epoch)
        plan_files.use(self._plan_dir, self.fingerprint)
        with self._ahead_lock:
            ahead = self._ahead.pop(epoch, None)
            for stale in [e for e in self._ahead if e < epoch]:
                del self._ahead[stale]
        if ahead is not None:
            try:
                return ahead.result()
            except MemoryError:
                pass  # it was made beside the plan of the epoch before, which may be gone now: again, alone
        return self._planner.plan_shared(self._plan_dir, epoch)

    def plan_ahead(self, epoch: int) -> None:
        """Starts making ``epoch``'s shared plan in the background, so that the epoch boundary finds it made
        (only with a ``plan_dir``; :meth:`plan` then returns it, or raises what making it raised). A fork
        waits for it first: a child must not inherit a planner holding the directory's lock."""
        plan_dir = self._plan_dir
        if plan_dir is None:
            return
        plan_files.use(plan_dir, self.fingerprint)
        with self._ahead_lock:
            if epoch in self._ahead:
                return
            planner = self._planner
            future = runtime.background(lambda: planner.plan_shared(plan_dir, epoch), f"dflash-plan-ahead-{epoch}")
            if future is not None:  # None: the interpreter exits
                self._ahead[epoch] = future

    def plan_resumed(self, epoch: int, old_world: int, step: int) -> tuple[Plan, np.ndarray]:
        """The samples ``epoch`` had left after ``step`` steps on ``old_world`` ranks, planned on these ranks,
        and the rows carried into the next epoch when they cannot fill whole steps (``resume.rs``)."""
        return self._planner.plan_resumed(epoch, old_world, step)

    def plan_carrying(self, epoch: int, carried: np.ndarray) -> Plan:
        """Epoch ``epoch`` over every row plus the rows ``carried`` from the epoch before."""
        return self._planner.plan_carrying(epoch, carried)

    # -- changes and copies ---------------------------------------------------------------------------

    def replace(self, **changes: Any) -> Schedule:
        """The schedule with ``changes`` to its settings (same lengths); itself when nothing changes."""
        if all(self._config.get(key) == value for key, value in changes.items()):
            return self
        if self._mapped is not None:
            # The file still as mapped (a DataError naming it if not): a new planner would read the map
            # as it is now, and a truncated one with a signal.
            self._planner.check_lengths()
        mapped = self._map_again()
        lengths = mapped if mapped is not None else self.dataset_lengths()
        return Schedule([lengths], self._config.replace(**changes), self._mixture, self._plan_dir)

    def _map_again(self) -> np.ndarray | None:
        """The borrowed map, for a changed schedule or a copy to map again by its file's name; ``None`` when
        there is none, or when the name is no longer that file (deleted or replaced since: this map still holds
        the lengths planned from, which they then carry, with a warning)."""
        if self._mapped is None:
            return None
        where = _mapped_file(self._mapped)
        if _identity(where[0]) == self._mapped_identity:
            return self._mapped
        warnings.warn(
            f"{where[0]} was deleted or replaced since this sampler mapped it: copies of the sampler (a "
            f"DataLoader worker, a pickle) and changed settings carry its {where[3]:,} lengths instead of "
            "mapping the file",
            stacklevel=3,
        )
        return None

    def __reduce__(self) -> tuple[Any, ...]:
        # The configuration and the lengths, never Rust memory: a copy rebuilds its planner. Borrowed
        # lengths travel as where they lie in their file (a spawned worker maps it too, instead of
        # receiving a copy of every length), with the fingerprint the file must still give.
        mapped = self._map_again()
        if mapped is not None:
            where = _mapped_file(mapped)
            return (_rebuild_mapped, (*where, self.fingerprint, self._config, self._mixture, self._plan_dir))
        return (_rebuild, (self.dataset_lengths(), self._config, self._mixture, self._plan_dir))

    def __repr__(self) -> str:
        return (
            f"Schedule(num_samples={self.num_samples}, buckets={len(self.edges) - 1}, "
            f"world_size={self.world_size}, fingerprint={self.fingerprint})"
        )


def _rebuild(
    lengths: np.ndarray, config: _core.Config, mixture: _core.Mixture | None = None, plan_dir: str | None = None
) -> Schedule:
    return Schedule([lengths], config, mixture, plan_dir)


def _identity(filename: str) -> tuple[int, int] | None:
    """``(device, inode)`` of the file at ``filename`` now; ``None`` where there is none."""
    try:
        stat = os.stat(filename)
    except OSError:
        return None
    return (stat.st_dev, stat.st_ino)


def _mapped_file(array: np.ndarray) -> tuple[str, int, str, int]:
    """``(file, offset, dtype, count)`` of a read-only contiguous view of a ``numpy.memmap``: the memmap
    nearest the buffer (whose ``offset`` is where its own first element lies in the file) places it."""
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not isinstance(root, np.memmap) or root.filename is None:  # the binding borrowed it as one
        raise AssertionError("borrowed lengths are not a view of a numpy.memmap")
    start = array.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return str(root.filename), int(root.offset) + start, array.dtype.str, len(array)


def _rebuild_mapped(
    filename: str,
    offset: int,
    dtype: str,
    count: int,
    fingerprint: str,
    config: _core.Config,
    mixture: _core.Mixture | None = None,
    plan_dir: str | None = None,
) -> Schedule:
    lengths = np.memmap(filename, dtype=np.dtype(dtype), mode="r", offset=offset, shape=(count,))
    schedule = Schedule([lengths], config, mixture, plan_dir)
    if schedule.fingerprint != fingerprint:
        raise DataError(
            f"{filename} changed since this sampler was pickled (its lengths give fingerprint "
            f"{schedule.fingerprint}, the sampler's was {fingerprint}); a mapped file must not change while "
            "it is in use: write new files and make the sampler again"
        )
    return schedule


def _plan_dir(plan_dir: Any) -> str | None:
    """``plan_dir`` checked: ``None``, or a non-empty path."""
    if plan_dir is None:
        return None
    if not isinstance(plan_dir, (str, os.PathLike)):
        raise TypeError(f"plan_dir must be a directory path or None, not {type(plan_dir).__name__}")
    path = os.fspath(plan_dir)
    if not isinstance(path, str) or not path:
        raise ValueError(f"plan_dir must name a directory (got {plan_dir!r}); pass None to plan on every process")
    return path

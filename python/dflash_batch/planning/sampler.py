"""`BucketSampler`: the per-epoch plan as a torch-style batch sampler — a thin façade over two objects.

* :attr:`BucketSampler.schedule` (:class:`~dflash_batch.planning.schedule.Schedule`): what never changes — the
  lengths, the settings, the Rust planner, the fingerprint. Read-only; every rank builds the same one.
* :attr:`BucketSampler.position` (:class:`~dflash_batch.planning.cursor.Cursor`): what moves — the epoch, the steps
  handed out, a pending resume, an elastic origin — with an all-or-nothing ``load_state_dict``.

The sampler hands this rank its batches as numpy index arrays through one iterator
(:class:`~dflash_batch.planning.batches.Batches`), drops into ``DataLoader(dataset, batch_sampler=sampler)``
(torchdata's ``StatefulDataLoader`` included), and pickles as its configuration, position and lengths, so
workers and spawned processes rebuild the planner instead of copying Rust memory."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

import dflash_batch._core as _core

from .._core import Plan, PlanError
from ..base.arguments import _bool, _check_context_parallel_ranks, _check_rank, _default_ranks, _epoch, _length_chunks
from ..base.clients import reader_of
from ..base.ranks import agree
from ..data.mixture import Mixture
from ..data.reading import read_lengths
from ..data.sources import is_source
from . import groups, settings
from .batches import Batches, GlobalBatches
from .cursor import Cursor, Run
from .entries import Entries
from .groups import Balance, Packed, Padded, World
from .schedule import Schedule

#: The planning settings' names (the keywords the signature's written block declares).
_PLANNING = frozenset(settings.names())


class BucketSampler:
    """Length-bucketed batches, reshuffled every epoch, with equal step counts on every rank.

        Args:
            lengths: token count of every sample: a 1-D numpy integer array (any width), a list of ints, a
                pyarrow ``Array``/``ChunkedArray`` of integers (read without a copy where possible), a
                dataset to read them from with :func:`read_lengths` — an Arrow file, a ``save_to_disk``
                directory, a glob, a list of paths, or a ``datasets.Dataset`` — or a :class:`Mixture`:
                its sources' rows, each epoch selecting every source's share and spreading the sources
                through every optimizer step (batch indices are the mixture's rows).
            rank: this process's rank (default: ``torch.distributed``'s, else torchrun's ``RANK``, else 0).
            column: the lengths column when ``lengths`` is a dataset: an integer column, or a list column
                such as ``"input_ids"`` (lengths from its offsets); default ``"seq_len"`` when the data has it,
                else ``"input_ids"`` (:func:`read_lengths`).
            check_ranks: when ``torch.distributed`` is initialized with ``world_size`` ranks, the ranks
                exchange the plan's fingerprint, seed and settings when an epoch's iteration starts and
                all raise :class:`PlanError` naming what differs, instead of training on overlapping
                samples or hanging (default ``True``; a collective: every rank iterates).
            batching, balance, world: the planning settings in typed groups (:mod:`dflash_batch.planning.groups`):
                ``db.Padded(...)`` or ``db.Packed(max_tokens, ...)``, ``db.Balance(...)``, ``db.World(...)`` —
                the same settings as the flat keywords below (``db.Packed(4096, bucketed=True)`` is
                ``mode="packed", max_tokens=4096, bucketed=True``), with the rules between them held by the
                types. A setting given both ways with two different values raises ``TypeError``.
            plan_dir: a directory every process of the machine can write, such as ``"/dev/shm/plans"``:
                each epoch is then planned once per machine — by the first process to ask, under a file
                lock — into a file there that the others map read-only after checking it is that plan
                (no process group needed; a killed planner leaves nothing another accepts; earlier
                epochs' files are deleted). Default ``None``: every process plans (see
                ``docs/billion.md``).

        The planning settings (declared once, in :mod:`dflash_batch.planning.settings`):

    {settings}
    """

    def __init__(
        self,
        lengths: Any,
        *,
        batching: Padded | Packed | None = None,
        balance: Balance | None = None,
        world: World | None = None,
        # <settings> written from _core.SETTINGS: python -m dflash_batch.tools.docs
        batch_size: int | None = None,
        max_tokens: int | None = None,
        boundaries: str | int | Sequence[int] = "auto",
        seed: int = 0,
        shuffle: bool = True,
        world_size: int | None = None,
        drop_last: bool = False,
        oversize: str = "error",
        pad_to_multiple_of: int = 1,
        threads: int | None = None,
        accumulation: int | None = None,
        target_efficiency: float | None = None,
        order: str = "stratified",
        cost: str | tuple[float, float] = "tokens",
        balance_tolerance: float | None = None,
        mode: str = "padded",
        bucketed: bool = False,
        trim_steps: bool = False,
        context_parallel: int = 1,
        rank_cost: tuple[float, float] | None = None,
        whole_steps: bool = False,
        max_docs_per_row: int | None = None,
        # </settings>
        rank: int | None = None,
        column: str | None = None,
        check_ranks: bool = True,
        plan_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        # Every declared planning setting, by name, checked once in the core's binding into the one object
        # the schedule holds, pickles and fingerprints.
        # The typed groups, when given, are read into the same flat settings here.
        given = {name: value for name, value in locals().items() if name in _PLANNING}
        given = groups.flatten(given, batching=batching, balance=balance, world=world)
        _check_context_parallel_ranks(given["context_parallel"], given["world_size"], rank)
        given["world_size"], rank = _default_ranks(given["world_size"], rank)
        config = _core.Config(**given)
        rank = _check_rank(rank, config.world_size)
        check_ranks = _bool("check_ranks", check_ranks)
        # The Rust planner keeps the only copy of the lengths (with oversize="truncate", cut into the
        # pieces it plans); nothing here holds on to the input.
        if isinstance(lengths, Mixture):
            schedule = Schedule(lengths.chunks(), config, lengths.spec, plan_dir)
        else:
            if is_source(lengths):
                lengths = read_lengths(lengths, column)
            schedule = Schedule(_length_chunks(lengths), config, plan_dir=plan_dir)
        self._attach(schedule, rank, given["accumulation"] is not None, check_ranks)

    def _attach(self, schedule: Schedule, rank: int, accumulation_given: bool, check_ranks: bool) -> None:
        self._schedule, self._rank = schedule, rank
        # Read once: what it answers never changes with the schedule's price or accumulation.
        self._entries = Entries(schedule)
        self._accumulation_given, self._check_ranks = accumulation_given, check_ranks
        self._cursor = Cursor(schedule)
        self._checked_epoch: int | None = None

    # -- the two halves --------------------------------------------------------------------------------

    @property
    def schedule(self) -> Schedule:
        """What never changes during a run: lengths, settings, planner, fingerprint (read-only)."""
        return self._schedule

    @property
    def position(self) -> Cursor:
        """Where training is: the one object the Loader, the adapters and checkpoints ask and tell
        (:mod:`dflash_batch.planning.cursor`)."""
        return self._cursor

    # -- the plan -------------------------------------------------------------------------------------

    def plan(self, epoch: int | None = None) -> Plan:
        """The whole epoch for every rank, in training order (default: the current epoch), as this
        position trains it (an elastically resumed epoch is its re-planned rest)."""
        return self._cursor.plan(None if epoch is None else _epoch(epoch))

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next iteration runs (call it at the start of every epoch). Moving to
        another epoch while an iteration runs supersedes it: its next batch raises ``RuntimeError``."""
        epoch, before = _epoch(epoch), self._cursor.epoch
        discarded = self._cursor.set_epoch(epoch)
        if discarded is not None:
            warnings.warn(
                f"set_epoch({epoch}) discards the resume at step {discarded} of epoch {before} that "
                f"load_state_dict prepared; call set_epoch({before}) (or an accelerate DataLoader's "
                f"set_epoch({before})) before iterating to resume it",
                stacklevel=2,
            )

    @property
    def epoch(self) -> int:
        return self._cursor.epoch

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._schedule.world_size

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimizer step the plans are arranged for."""
        return self._schedule.accumulation

    @property
    def accumulation_given(self) -> bool:
        """Whether ``accumulation`` was passed (else a trainer may bind its own: :meth:`bind_accumulation`)."""
        return self._accumulation_given

    def bind_accumulation(self, accumulation: int) -> None:
        """Plans for ``accumulation`` micro-batches per step from now on — what a trainer that knows its
        gradient accumulation does with a sampler built without one. Refused when the sampler was built
        with another value, or once its position has moved (the plans it counted would change)."""
        if accumulation == self.accumulation:
            return
        if self._accumulation_given:
            raise PlanError(
                f"the sampler was built with accumulation={self.accumulation} but the trainer accumulates "
                f"{accumulation} micro-batches per step; build the sampler with accumulation={accumulation}, "
                "or leave it unset"
            )
        cursor = self._cursor
        if cursor.running or cursor.step or cursor.epoch or cursor.resume_pending or cursor.origin is not None:
            raise PlanError(
                f"accumulation={accumulation} cannot be bound once the sampler's position has moved (epoch "
                f"{cursor.epoch}, step {cursor.step}): build the sampler with accumulation={accumulation}"
            )
        self._attach(self._schedule.replace(accumulation=accumulation), self._rank, False, self._check_ranks)

    @property
    def sampler(self) -> BucketSampler:
        """This sampler: where accelerate's ``DataLoaderShard.set_epoch`` looks for the sampler of a batch
        sampler it wraps, so that preparing ``DataLoader(batch_sampler=sampler)`` advances its epoch."""
        return self

    def label_tokens(self, epoch: int | None = None, *, store: Any = None, by_source: bool = False) -> np.ndarray:
        """Label tokens of every optimizer step of ``epoch`` (default: the current one), all ranks and
        micro-batches together (int64): the ``num_items_in_batch`` that makes a summed loss the step's
        token mean. Each sample counts its tokens after the first, or with a ``store`` that has a loss
        mask, those the mask keeps (see :mod:`dflash_batch.planning.label_tokens`). ``by_source``: a mixture's
        steps × sources array instead — each source's label tokens in each step, the denominators of
        per-source losses."""
        if isinstance(store, Mixture):
            store = store.store
        by_source = _bool("by_source", by_source)
        return self.entries.label_tokens(self.plan(epoch), self.accumulation, store, by_source)

    def rank_price(self, epoch: int | None = None) -> tuple[float, float]:
        """The price ``(a, b)`` the ranks of ``epoch`` (default: the current one) are balanced by: ``rank_cost``,
        else ``cost`` (``(1, 0)`` for tokens), or what a :class:`~dflash_batch.StepTimer` set from then on."""
        epoch = self.epoch if epoch is None else _epoch(epoch)
        return tuple(self._cursor.schedule_at(epoch).config.balance_price)  # type: ignore[return-value]

    @property
    def mixture(self) -> _core.Mixture | None:
        """The sources and weights of a sampler built from a :class:`Mixture` (names, rows, weights,
        unit, ...), else ``None``."""
        return self._schedule.mixture

    def sources_of(self, batch: Any) -> np.ndarray:
        """The source number (int64; ``mixture.names[i]``) of each row of ``batch`` (all 0 without a
        mixture)."""
        return self.entries.sources_of(batch)

    @property
    def entries(self) -> Entries:
        """What a consumer of this sampler's plans needs to read them (rows and token windows of entries,
        sources, label tokens), without the position: the :class:`~dflash_batch.Loader` reads through it."""
        return self._entries

    @property
    def predicted_efficiency(self) -> float:
        """The padding efficiency the plans are predicted to have with the chosen edges."""
        return self._schedule.predicted_efficiency

    @property
    def edges(self) -> list[int]:
        """The bucket edges in use."""
        return self._schedule.edges

    @property
    def mode(self) -> str:
        """``"padded"`` or ``"packed"``."""
        return self._schedule.mode

    @property
    def max_tokens(self) -> int | None:
        """The token budget per batch (the row capacity when packed), or ``None`` with ``batch_size``."""
        return self._schedule.max_tokens

    @property
    def pad_to_multiple_of(self) -> int:
        """What padded lengths are rounded up to: the budgets count it, so the Loader pads with it."""
        return self._schedule.pad_to_multiple_of

    @property
    def num_samples(self) -> int:
        """Rows of the dataset (with ``oversize="truncate"``, not counting the extra pieces)."""
        return self._schedule.num_samples

    @property
    def truncated(self) -> int:
        """Samples longer than ``max_tokens`` split into pieces (``oversize="truncate"``; else 0)."""
        return self._schedule.truncated

    def pieces(self, batch: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The token windows of a batch's entries: ``(rows, starts, lengths)`` as uint32 arrays, entry
        ``s`` being tokens ``starts[s] : starts[s] + lengths[s]`` of dataset row ``rows[s]``.

        With ``oversize="truncate"`` a sample of ``L > max_tokens`` tokens is planned as ``⌈L / max_tokens⌉``
        pieces — ``[0, C)``, ``[C, 2C)``, … — each packed like a sample of its own (its own ``cu_seqlens``
        entry, positions from 0, no attention across pieces). Its first piece keeps the row's index; the
        others have entries ``num_samples, num_samples + 1, …`` in ``plan.indices`` and in the batches the
        sampler yields, which is why a batch goes through this method (the :class:`Loader` and
        :func:`collate_packed` with ``starts``/``lengths`` do it for you). Without pieces, ``rows`` is the
        batch and every window is a whole sample.
        """
        return self.entries.pieces(batch)

    def __len__(self) -> int:
        """Steps (batches) of an epoch on this rank: every epoch planned from its start has the same
        number, and trainers read it once as every epoch's length. (The rest of an epoch resumed on another
        number of ranks may be shorter: ``plan().steps`` says.)"""
        return self._schedule.steps

    def __iter__(self) -> Batches:
        """This rank's batches of the current epoch as read-only uint32 index arrays, from a pending
        resume's step (:class:`~dflash_batch.planning.batches.Batches`). With ``oversize="truncate"``, entries from
        ``num_samples`` on are pieces, not rows (a warning says so: map a batch with :meth:`pieces`, or
        use the :class:`Loader`)."""
        if self.truncated:
            warnings.warn(
                f"this sampler split {self.truncated} long sample(s) into pieces: batch entries ≥ "
                f"{self.num_samples} are pieces, not dataset rows; map a batch with sampler.pieces(batch) "
                "(rows, token starts, lengths) or iterate a dflash_batch.Loader, which does it",
                stacklevel=2,
            )
        return Batches(self._cursor, (self._rank,), begin=self.begin)

    def begin(self) -> Run:
        """Starts an iteration of the current epoch (:meth:`Cursor.begin`) — what the sampler's iterator,
        the :class:`Loader` and the adapters call — after the ranks agree on the plan (once an epoch,
        when ``torch.distributed`` has this many ranks and ``check_ranks`` is on)."""
        schedule = self._cursor.schedule_at(self.epoch)
        if self._check_ranks and self._checked_epoch != self.epoch and agree(schedule, self.epoch):
            self._checked_epoch = self.epoch
        return self._cursor.begin(reader=reader_of(self, GlobalBatches))

    # -- checkpoints ----------------------------------------------------------------------------------

    def state_dict(self, step: int | None = None) -> dict[str, Any]:
        """Epoch and steps, plus what identifies the plan (to refuse a mismatched resume).

        ``step``: batches of the current epoch the training loop has trained on. By default, the
        batches this sampler handed out — exact when whoever iterates it trains each batch it takes: your
        own loop, a ``DataLoader`` without workers, the :class:`Loader` (whose own count excludes what it
        prefetched) and torchdata's ``StatefulDataLoader`` (which snapshots this state as it takes each
        batch). **A plain torch ``DataLoader`` with workers takes batches ahead of the loop**: pass how
        many the loop trained, or use ``StatefulDataLoader``'s ``state_dict()``."""
        return self._cursor.state_dict(step)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes at ``state``: the next iteration yields exactly the rest of its epoch. Checked
        completely first — a refused state changes nothing; an accepted one supersedes a running
        iteration (its next batch raises ``RuntimeError``)."""
        self._cursor.load_state_dict(state)

    # -- pickling: configuration, position and lengths, never Rust memory -----------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {
            "schedule": self._schedule,
            "rank": self._rank,
            "accumulation_given": self._accumulation_given,
            "check_ranks": self._check_ranks,
            "position": self._cursor.snapshot(),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._attach(state["schedule"], state["rank"], state["accumulation_given"], state["check_ranks"])
        self._cursor = Cursor.from_snapshot(self._schedule, state["position"])

    def __repr__(self) -> str:
        if not hasattr(self, "_schedule"):  # construction failed part way (a debugger, a traceback)
            return "BucketSampler(<not built>)"
        c = self._schedule.config
        size = f"max_tokens={c.max_tokens}" if c.max_tokens is not None else f"batch_size={c.get('batch_size')}"
        return (
            f"BucketSampler(num_samples={self.num_samples}, {size}, buckets={len(self.edges) - 1}, "
            f"seed={c.seed}, epoch={self.epoch}, rank={self._rank}/{self.world_size})"
        )


BucketSampler.__doc__ = (BucketSampler.__doc__ or "").replace("{settings}", settings.docstring())

"""`BucketSampler`: the per-epoch plan as a torch-style batch sampler.

The Rust planner computes the whole epoch for every rank at once (milliseconds for a million samples);
this class hands this rank its batches as numpy index arrays, its :class:`Position` saying how far
training is. It drops into ``DataLoader(dataset, batch_sampler=sampler)`` and pickles as its
configuration, so workers and spawned processes rebuild the planner instead of copying Rust memory."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

import dflash_batch._core as _core

from . import _in_flight, checkpoint, label_tokens
from ._accelerate import iter_for_shard, wrapping_shard
from ._arguments import _bool, _check_rank, _default_ranks, _epoch, _length_chunks
from ._core import Plan, PlanError
from .distributed import agree
from .position import Position
from .reading import read_lengths
from .sources import is_source


class BucketSampler:
    """Length-bucketed batches, reshuffled every epoch, with equal step counts on every rank.

    Args:
        lengths: token count of every sample: a 1-D numpy integer array (any width), a list of ints, a
            pyarrow ``Array``/``ChunkedArray`` of integers (read without a copy where possible), or a
            dataset to read them from with :func:`read_lengths` — an Arrow file, a ``save_to_disk``
            directory, a glob, a list of paths, or a ``datasets.Dataset``.
        batch_size: fixed rows per batch. Exactly one of ``batch_size`` and ``max_tokens``.
        max_tokens: padded-token budget per batch: ``rows × round_up(longest row) ≤ max_tokens``; with a
            ``cost`` model, a budget in its units: ``rows × cost(round_up(longest row)) ≤ max_tokens``.
        boundaries: ``"auto"``: the fewest buckets whose predicted padding efficiency reaches
            ``target_efficiency``, placed by an exact dynamic program over the length histogram; a bucket
            count K (K optimized buckets); or explicit edges ``e_0 < … < e_K``, bucket ``i`` holding lengths
            in ``(e_i, e_{i+1}]``. ``sampler.predicted_efficiency`` reports the prediction.
        seed: seed of every random stream (``0 ≤ seed < 2**64``).
        shuffle: reshuffle every epoch (training); ``False`` gives a deterministic length-sorted plan.
        world_size, rank: default to ``torch.distributed`` when it is initialized, else 1 and 0.
        drop_last: drop the last ``batches mod world_size`` batches instead of splitting batches so that
            every rank gets the same number of steps.
        oversize: for samples longer than ``max_tokens``: ``"error"`` (default) raises naming the row,
            ``"skip"`` leaves them out (counted in ``plan.stats()["skipped"]``), and ``"truncate"``
            (``mode="packed"``) splits each into ``max_tokens``-token pieces packed as separate
            sequences — see :meth:`pieces`; ``sampler.truncated`` counts the samples split.
        pad_to_multiple_of: padded lengths are rounded up to a multiple of this.
        threads: planner threads (default: up to 8). The plan is identical for any value.
        column: the lengths column when ``lengths`` is a dataset: an integer column, or a list column
            such as ``"input_ids"`` (lengths from its offsets).
        target_efficiency: the padding efficiency ``boundaries="auto"`` aims for (default 0.98).
        accumulation: micro-batches per optimizer step (default ``None``: 1, or under
            :class:`~dflash_batch.hf.BucketTrainer` its ``gradient_accumulation_steps``). Windows of
            ``accumulation × world_size`` consecutive batches are what one optimizer step sees:
            ``plan.stats()`` measures mixing over them, and rank balance matches each step's batches
            by cost inside them without changing any window's contents. Pass your real value.
        cost: ``"tokens"`` (default: a batch costs its padded tokens) or ``(a, b)``: a row of padded
            length ``L`` costs ``a·L + b·L²`` (attention grows with the square of the length). The
            budget (``max_tokens``) and rank balance use it, so long-sequence batches take fewer
            tokens and ranks are matched on compute. Example: ``cost=(1, 1/4096)``.
        balance_tolerance: ``None`` (default) keeps mixing first: steps are matched by cost only
            inside each optimizer window. A number ``t`` (e.g. ``0.1``) forms every step, where the
            data allows, from batches whose costs are within a factor ``1 + t``: lower rank imbalance,
            less mixing (seed workload, 8 ranks × 4: p99 1.30 → 1.10, window_tv 0.069 → 0.15).
        trim_steps: ``True`` trims each step's batches to a common cost and re-forms the rows trimmed
            into extra steps spread through the epoch: ranks wait less (``accumulation=1``, attention
            prices) for a few percent more steps and some mixing (docs/ranks.md).
            Needs ``max_tokens``, padded rows, ``balance_tolerance=None``; epochs ≤ 16.7M samples.
        mode: ``"padded"`` (default): rows padded to the batch's longest. ``"packed"``: samples
            concatenated into rows of ``max_tokens`` tokens for varlen attention (FlashAttention
            ``cu_seqlens``, SDPA document masks): each epoch the shuffled samples are packed best-fit
            over a window of 255 open rows, so which samples share a row is random and rows are
            ~99% real tokens; a batch is one row. ``plan.stats()["utilization"]`` is real tokens /
            (rows × max_tokens). Collate with :func:`collate_packed` or the :class:`Loader`.
        bucketed: with ``mode="packed"``, pack only samples of one length bucket together
            (``boundaries``; ``"auto"``: 2 optimized buckets), which bounds each row's longest
            sample (the kernel's ``max_seqlen``) at some cost in fill.
        check_ranks: when ``torch.distributed`` is initialized with ``world_size`` ranks, the ranks
            exchange the plan's fingerprint, seed and settings when an epoch's iteration starts and
            all raise :class:`PlanError` naming what differs, instead of training on overlapping
            samples or hanging (default ``True``; a collective: every rank iterates).
        order: ``"stratified"`` (default): consecutive batches draw from the length buckets in proportion
            to the data (a low-discrepancy interleaving, randomized every epoch), so every accumulation
            window sees the dataset's length mix. ``"random"``: a seeded shuffle of the batches within
            each of the epoch's (at most 16) groups. Shuffled epochs of up to 16.7M samples; larger ones
            keep the order in which batches form (window_tv ≈ 0.15), which costs no extra pass.
    """

    def __init__(
        self,
        lengths: Any,
        *,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        boundaries: str | int | Sequence[int] = "auto",
        seed: int = 0,
        shuffle: bool = True,
        world_size: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
        oversize: str = "error",
        pad_to_multiple_of: int = 1,
        threads: int | None = None,
        column: str = "seq_len",
        accumulation: int | None = None,
        target_efficiency: float = 0.98,
        order: str = "stratified",
        cost: str | tuple[float, float] = "tokens",
        balance_tolerance: float | None = None,
        mode: str = "padded",
        bucketed: bool = False,
        check_ranks: bool = True,
        trim_steps: bool = False,
    ) -> None:
        world_size, rank = _default_ranks(world_size, rank)
        # Every planning setting is checked once, in the core's binding; the sampler holds, pickles
        # and fingerprints this one object.
        self._config = _core.Config(
            batch_size=batch_size, max_tokens=max_tokens, boundaries=boundaries, seed=seed, shuffle=shuffle,
            world_size=world_size, drop_last=drop_last, oversize=oversize, pad_to_multiple_of=pad_to_multiple_of,
            threads=threads, accumulation=accumulation, target_efficiency=target_efficiency, order=order, cost=cost,
            balance_tolerance=balance_tolerance, mode=mode, bucketed=bucketed, trim_steps=trim_steps,
        )  # fmt: skip
        self._rank = _check_rank(rank, self._config.world_size)
        self._accumulation_given = accumulation is not None
        self._check_ranks = _bool("check_ranks", check_ranks)
        self._checked_epoch: int | None = None
        self._position = Position()
        # The Rust planner keeps the only copy of the lengths (with oversize="truncate", cut into the
        # pieces it plans); nothing here holds on to the input.
        if is_source(lengths):
            lengths = read_lengths(lengths, column)
        self._build(_length_chunks(lengths))

    def _build(self, chunks: list[np.ndarray]) -> None:
        self._planner = _core.Planner(chunks, self._config)
        self._plan: Plan | None = None
        self._plan_key: tuple[int, int] | None = None
        self._fingerprint_cache: str | None = None

    # -- the plan -------------------------------------------------------------------------------------

    def plan(self, epoch: int | None = None) -> Plan:
        """The whole epoch for every rank, in training order (default: the current epoch)."""
        position = self._position
        epoch = position.epoch if epoch is None else _epoch(epoch)
        elastic = position.elastic
        if elastic is not None and elastic["epoch"] == epoch:  # the re-planned rest of a resumed epoch
            return elastic["plan"]
        key = (epoch, position.generation)  # a restore may change what the epoch carries
        if self._plan is not None and self._plan_key == key:
            return self._plan
        if epoch == position.epoch:  # released before planning its successor: one epoch's plan at a time
            self._plan = self._plan_key = None
        plan = checkpoint.carried_plan(self, epoch)
        if plan is None:
            plan = self._planner.plan(epoch)
        if epoch == position.epoch:
            self._plan, self._plan_key = plan, key
        return plan

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch that the next iteration plans (call it at the start of every epoch)."""
        epoch, before = _epoch(epoch), self._position.epoch
        discarded = self._position.set_epoch(epoch)
        if discarded is not None:
            warnings.warn(
                f"set_epoch({epoch}) discards the resume at step {discarded} of epoch {before} that "
                f"load_state_dict prepared; call set_epoch({before}) (or an accelerate DataLoader's "
                f"set_epoch({before})) before iterating to resume it",
                stacklevel=2,
            )

    @property
    def epoch(self) -> int:
        return self._position.epoch

    @property
    def position(self) -> Position:
        """Where training is: the one object every client reads and advances (:mod:`dflash_batch.position`)."""
        return self._position

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._config.world_size

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimizer step the plans are arranged for."""
        return self._config.accumulation

    @property
    def sampler(self) -> BucketSampler:
        """This sampler: where accelerate's ``DataLoaderShard.set_epoch`` looks for the sampler of a batch
        sampler it wraps, so that preparing ``DataLoader(batch_sampler=sampler)`` advances its epoch."""
        return self

    def _reconfigure(self, **changes: Any) -> None:
        """Plans with ``changes`` to the configuration from now on (same lengths, epoch and position)."""
        if all(self._config.get(key) == value for key, value in changes.items()):
            return
        lengths = self._planner.dataset_lengths()
        self._config = self._config.replace(**changes)
        self._build([lengths])

    def label_tokens(self, epoch: int | None = None, *, store: Any = None) -> np.ndarray:
        """Label tokens of every optimizer step of ``epoch`` (default: the current one), all ranks and
        micro-batches together (int64): the ``num_items_in_batch`` that makes a summed loss the step's
        token mean. Each sample counts its tokens after the first, or with a ``store`` that has a loss
        mask, those the mask keeps (see :mod:`dflash_batch.label_tokens`)."""
        counts = label_tokens.per_entry(self, store)
        return label_tokens.per_step(self.plan(epoch), counts, self.accumulation)

    @property
    def predicted_efficiency(self) -> float:
        """The padding efficiency the plans are predicted to have with the chosen edges."""
        return self._planner.predicted_efficiency

    @property
    def edges(self) -> list[int]:
        """The bucket edges in use."""
        return self._planner.edges

    @property
    def mode(self) -> str:
        """``"padded"`` or ``"packed"``."""
        return self._config.mode

    @property
    def max_tokens(self) -> int | None:
        """The token budget per batch (the row capacity when packed), or ``None`` with ``batch_size``."""
        return self._config.max_tokens

    @property
    def num_samples(self) -> int:
        """Rows of the dataset (with ``oversize="truncate"``, not counting the extra pieces)."""
        return self._planner.num_samples

    @property
    def truncated(self) -> int:
        """Samples longer than ``max_tokens`` split into pieces (``oversize="truncate"``; else 0)."""
        return self._planner.truncated

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
        given = np.asarray(batch)
        if given.size and given.dtype.kind not in "iu":  # 0.5 would have been read as entry 0
            raise TypeError(f"batch must hold integer entries, got dtype {given.dtype}")
        entries = np.ascontiguousarray(given, dtype=np.int64)
        if entries.ndim != 1:
            raise PlanError(
                f"batch must be a 1-D array of entries of this sampler's plans (0 ≤ entry < {len(self._planner)})"
            )
        return self._planner.locate(entries)

    def __len__(self) -> int:
        """Steps (batches) of an epoch on this rank, the same in every epoch (``plan().steps``) and after a
        resume too: trainers read it once as every epoch's length. Measured by accelerate's
        ``BatchSamplerShard``, every rank's batches (see ``__iter__``)."""
        steps = self.plan().steps
        return steps * self.world_size if wrapping_shard(self) is not None else steps

    def __iter__(self) -> Iterator[Any]:
        """This rank's batches of the current epoch as read-only uint32 index arrays, from a pending
        resume's step. With ``oversize="truncate"``, entries from ``num_samples`` on are pieces, not rows
        (a warning says so: map a batch with :meth:`pieces`, or use the :class:`Loader`). Under
        accelerate's ``BatchSamplerShard``, every rank's batches as lists (:mod:`dflash_batch._accelerate`)."""
        shard = wrapping_shard(self)
        if shard is not None:
            return iter_for_shard(self)
        return self._iter_rank()

    def _iter_rank(self) -> Iterator[np.ndarray]:
        if self.truncated:
            warnings.warn(
                f"this sampler split {self.truncated} long sample(s) into pieces: batch entries ≥ "
                f"{self.num_samples} are pieces, not dataset rows; map a batch with sampler.pieces(batch) "
                "(rows, token starts, lengths) or iterate a dflash_batch.Loader, which does it",
                stacklevel=2,
            )
        plan, start, token = self._begin()
        world, rank, position = self.world_size, self._rank, self._position
        consumers, exhausted = _in_flight.find(sys._getframe()), False
        try:
            for step in range(start, plan.steps):
                position.advance(token, step + 1, consumers)
                yield plan[step * world + rank]
            position.check(token)  # a superseded iteration must not end as if it had finished the epoch
            exhausted = True
        finally:
            position.finish(token, exhausted)

    def _begin(self) -> tuple[Plan, int, int]:
        """Starts an iteration of the current epoch: its plan, its first step (a pending resume's, else
        0) and its token for the position (see :mod:`dflash_batch.position`)."""
        plan = self.plan()
        if self._check_ranks and self._checked_epoch != self.epoch and agree(self):
            self._checked_epoch = self.epoch
        token, start = self._position.begin(plan.steps)
        return plan, start, token

    # -- checkpoints ----------------------------------------------------------------------------------

    def state_dict(self, step: int | None = None) -> dict[str, Any]:
        """Epoch and consumed steps, plus what identifies the plan (to refuse a mismatched resume).

        ``step``: batches of the current epoch the training loop has trained on. By default, those
        handed out less those fetched ahead of the loop by a torch ``DataLoader``'s workers or an
        accelerate-prepared ``DataLoader`` (found when iteration starts); pass it when another layer
        fetches ahead, or a resume skips the batches it held."""
        return checkpoint.state_of(self, step)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes at ``state``: the next iteration yields exactly the rest of its epoch (see
        :mod:`dflash_batch.checkpoint`)."""
        checkpoint.load(self, state)

    def _fingerprint(self) -> str:
        """Lengths and configuration (not the rank), hashed in Rust once: neither ever changes."""
        if self._fingerprint_cache is None:
            self._fingerprint_cache = self._planner.fingerprint
        return self._fingerprint_cache

    # -- pickling: configuration and lengths, never Rust memory ---------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return checkpoint.pickled(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        lengths, snapshot = state.pop("_lengths"), state.pop("_position")
        self.__dict__.update(state)
        self._build([lengths])
        self._position = checkpoint.unpickled_position(self, snapshot)

    def __repr__(self) -> str:
        if not hasattr(self, "_planner"):  # construction failed part way (a debugger, a traceback)
            return "BucketSampler(<not built>)"
        c = self._config
        size = f"max_tokens={c.max_tokens}" if c.max_tokens is not None else f"batch_size={c.get('batch_size')}"
        return (
            f"BucketSampler(num_samples={self.num_samples}, {size}, buckets={len(self.edges) - 1}, "
            f"seed={c.seed}, epoch={self.epoch}, rank={self._rank}/{self.world_size})"
        )

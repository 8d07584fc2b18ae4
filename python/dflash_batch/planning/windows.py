"""`Windows`: length-bucketed (or packed) batches of a stream, planned a window of examples at a time.

A stream too long to hold, or whose lengths are not known up front (Parquet shards, a ``datasets``
``IterableDataset``, your own generator), is cut into windows of ``window`` consecutive examples; each window
is planned by the same planner as a whole dataset — its lengths measured as it is read — with a seed of its own
(``_core.window_seed``), so a window's batches are a pure function of ``(seed, pass, window index, the
window's examples, settings)``. Every rank reads the same windows and plans them alike, and takes the
window's batches of its rank: every rank takes the same number of steps in every window, and no rank waits
on another for data. From Parquet shards with a length column, a window is planned from that column alone and
each rank makes Python examples of its own rows only. A window's size is the trade between memory (its
examples are held while it trains) and mixing (a batch mixes examples of one window); ``docs/raw_data.md`` has
the table.

Window ``k`` holds examples ``k * window`` to ``(k + 1) * window - 1``; the last one also takes a tail shorter than
half a window, so no window is a sliver. A checkpoint is the pass, the window and the steps of it taken: a
resume reads the stream from the window's first example (Parquet files skip whole row groups by their
metadata), plans that window again, and goes on after the steps taken — no example twice, none skipped.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import dflash_batch._core as _core

from .._core import PlanError
from ..base.arguments import _bool, _check_context_parallel_ranks, _check_rank, _default_ranks, _epoch
from ..base.ranks import check_ranks_agree, process_group_size
from ..data.measured import _measure_of, _validated
from ..data.streams import Stream, column_lengths, held, length_in, taken
from . import windows_resume


class Windows:
    """Batches of a stream of examples, planned a window at a time; iterate it for this rank's batches, each
    a list of examples for your collator.

    Args:
        source: a Parquet file, a list of them, a glob or a directory of them; a ``datasets.IterableDataset``
            (not shuffled: it must give the same examples every time it is iterated); a list; or a function
            returning a fresh iterator of examples. A one-shot iterator is refused.
        window: examples per window (default 65,536; at least 1). Larger windows mix batches over more of the
            stream and hold more examples in memory.
        column: the example's field that holds its length (an integer, such as ``"seq_len"``), or its tokens
            (a list, such as ``"input_ids"``: its length is counted). Exactly one of ``column``, ``length``
            and ``tokenizer``.
        length: ``fn(example) -> int``, your preprocessing's length of an example.
        tokenizer, text, add_special_tokens: a length is the number of tokens ``tokenizer`` encodes
            ``text(example)`` to (as :func:`~dflash_batch.measure_lengths`).
        rank: this process's rank (default: ``torch.distributed``'s, else torchrun's ``RANK``, else 0).
        check_ranks: with a process group of ``world_size`` ranks, the ranks compare every window's lengths
            and settings before training it and all raise :class:`PlanError` when any differs (a collective
            per window; default ``True``).
        settings: the planning settings of :class:`~dflash_batch.BucketSampler` as keywords
            (``max_tokens=``, ``batch_size=``, ``mode=``, ``accumulation=``, ``seed=``, ``world_size=`` ...).

    Raises:
        TypeError: a source that cannot be read again, not one of ``column`` / ``length`` / ``tokenizer``, an
            unknown setting.
        PlanError: a bad setting; a window whose examples cannot give every rank a batch.
        FileNotFoundError, DataError: a missing or unreadable shard (named).
    """

    def __init__(
        self,
        source: Any,
        *,
        window: int = 65_536,
        column: str | None = None,
        length: Callable[[Any], int] | None = None,
        tokenizer: Any = None,
        text: Callable[[Any], str] | None = None,
        add_special_tokens: bool = True,
        rank: int | None = None,
        check_ranks: bool = True,
        **settings: Any,
    ) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an integer ≥ 1 (examples per window), got {window!r}")
        if sum(x is not None for x in (column, length, tokenizer)) != 1:
            raise TypeError(
                "pass exactly one of column= (the field holding an example's length or tokens), length= "
                "(fn(example) -> int) and tokenizer= (with text= if needed)"
            )
        if column is not None and not isinstance(column, str):
            raise TypeError(f"column must be a field name, got {type(column).__name__}")
        self._measure = None if column is not None else _measure_of(tokenizer, text, length, add_special_tokens)
        self._column = column
        self._stream = Stream(source)
        self._window = window
        _check_context_parallel_ranks(settings.get("context_parallel", 1), settings.get("world_size"), rank)
        settings["world_size"], rank = _default_ranks(settings.get("world_size"), rank)
        # Each window's plan ends on a whole optimizer step: windows are trained one after another, and a
        # step split across two windows would mix the end of one plan's order with the start of another's.
        settings.setdefault("whole_steps", True)
        self._config = _core.Config(**settings)
        self._rank = _check_rank(rank, self._config.world_size)
        self._check_ranks = _bool("check_ranks", check_ranks)
        self._lock = threading.Lock()
        self._pass = 0
        # Where the next iteration starts: (window, steps of it taken, its first example in the stream).
        self._at = (0, 0, 0)
        self._origin: windows_resume.Origin | None = None  # a window resumed on other ranks
        self._resume = False
        self._live = 0  # the running iteration's token; a newer one supersedes it
        # The windows of the current pass this process planned: (window, first step of this iteration, its
        # steps, its first example, its examples).
        self._seen: list[tuple[int, int, int, int, int]] = []
        self._handed = 0  # steps handed out since the iteration began
        # DataLoader workers iterate copies (`workers.py`): this object sees none of their steps, so a
        # checkpoint must be told the steps trained.
        self._in_workers = False
        self._iterations = 0  # iterations begun by this object in this process (a worker's copy counts its own)

    def __reduce__(self) -> Any:
        # Copies would each read the stream and hold a position of their own, while checkpoints are taken
        # from this one: refused, rather than a worker training windows the checkpoint never sees.
        raise TypeError(
            "a Windows is not copied (a copy would read the stream on its own, and checkpoints would miss what it "
            "trained): iterate it in the loop, or give DataLoader workers windows.iterable(), which splits the "
            "batches among them (fork start method; checkpoint with state_dict(step=n))"
        )

    def iterable(self) -> Any:
        """A torch ``IterableDataset`` of this rank's batches for ``DataLoader(it, batch_size=None,
        num_workers=k, collate_fn=...)``: the workers split the batches and the loop gets them in order
        (``windows_workers.py``). Checkpoints then take ``state_dict(step=n)``, ``n`` the batches the loop
        trained since the iteration began. Needs torch and the ``fork`` start method."""
        from .windows_workers import WorkerBatches  # imports torch, which the rest of Windows does not need

        with self._lock:
            self._in_workers = True
        return WorkerBatches(self)

    # -- the position ---------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The pass over the stream (the plans' epoch)."""
        return self._pass

    @property
    def world_size(self) -> int:
        return int(self._config.world_size)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def max_tokens(self) -> int | None:
        """The token budget of a batch (padded: rows × the longest; packed: a row's tokens), or ``None``."""
        return self._config.max_tokens

    @property
    def mode(self) -> str:
        return str(self._config.mode)

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimizer step: every window's plan ends on a whole step of them."""
        return int(self._config.accumulation)

    def set_epoch(self, epoch: int) -> None:
        """Starts pass ``epoch`` (every window reshuffled) at its first window."""
        epoch = _epoch(epoch)
        with self._lock:
            self._pass, self._at, self._resume, self._seen, self._handed = epoch, (0, 0, 0), False, [], 0
            self._origin = None
            self._live += 1

    def state_dict(self, step: int | None = None) -> dict[str, Any]:
        """Where this rank is: the pass, the window and its steps taken, with what the windows' plans depend
        on. ``step``: the steps of this pass your loop has trained, when it is behind the batches handed out
        (a loader that reads ahead); default, every step handed out."""
        with self._lock:
            at = self._where(step)
            origin = self._origin if self._resume else None
            return windows_resume.state(self._pass, at, origin, self._window, self._config.settings())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes where ``state`` was taken: the next iteration starts at its window, after its steps; a state
        of another ``world_size`` plans the rest of its window on these ranks (``windows_resume.py``). Raises
        PlanError for a state of other settings, another window size or plan revision (named), one that
        cannot resume on these ranks (named), or that is not a state of ``Windows``; a refused state changes
        nothing."""
        resume = windows_resume.read(state, self._config, self._window)
        with self._lock:
            self._pass, self._at, self._origin, self._resume = resume.epoch, resume.at, resume.origin, True
            self._seen, self._handed = [], 0
            self._live += 1

    def _where(self, step: int | None) -> tuple[int, int, int]:
        if self._in_workers and not self._seen:
            if step is None:
                raise ValueError(
                    "this Windows is iterated by DataLoader workers (iterable()), so it cannot see what was trained: "
                    "pass state_dict(step=n), n the batches your loop trained since the iteration began"
                )
            return self._position_after(step)
        if not self._seen:
            if step not in (None, 0):
                raise ValueError(f"step={step}: no batch of this pass was handed out yet")
            return self._at
        if step is None:
            step = self._handed
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= self._handed:
            raise ValueError(
                f"step must be the steps trained since this iteration began, from 0 to {self._handed}, got {step!r}"
            )
        # The first window's entry starts at minus the steps resumed past, so one always holds `step`.
        window, first, steps, start, examples = next(entry for entry in reversed(self._seen) if step >= entry[1])
        # After a window's last step, the next starts after its examples (past the end after the last window,
        # which may hold more than `window` examples: a resume there reads nothing).
        return (window + 1, 0, start + examples) if step == first + steps else (window, step - first, start)

    def _position_after(self, step: int) -> tuple[int, int, int]:
        """Where the pass stands ``step`` batches after the iteration began, found by planning the windows from
        its start again (reading their lengths: a length column only, for Parquet shards with one). No rank
        check: only this rank asks."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be the batches trained since the iteration began (an int ≥ 0), got {step!r}")
        window, skip, start = self._at if self._resume else (0, 0, 0)
        origin = self._origin if self._resume else None
        left = step
        for lengths, _ in self._windows_from(start):
            if left == 0:
                break
            steps = self.plan_lengths(lengths, window, self._pass, check=False, origin=origin).steps - skip
            if left < steps:
                return (window, skip + left, start)
            left -= steps
            window, skip, start = window + 1, 0, start + len(lengths)
        if left:
            raise ValueError(f"step={step} is past the end of pass {self._pass} ({step - left} batches from its start)")
        return (window, skip, start)

    # -- iterating ------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[list[Any]]:
        return self._iterate(None)

    def _iterate(self, split: tuple[int, int] | None) -> Iterator[list[Any]]:
        """This rank's batches; with ``split = (worker, workers)`` only every ``workers``-th from ``worker`` on
        (a DataLoader worker's share, `workers.py`)."""
        with self._lock:
            self._live += 1
            self._iterations += 1
            token, epoch = self._live, self._pass
            window, skip, start = self._at if self._resume else (0, 0, 0)
            origin = self._origin if self._resume else None
            self._seen, self._handed = [], 0
        return self._batches(token, epoch, (window, skip, start, origin), split)

    def _batches(
        self,
        token: int,
        epoch: int,
        at: tuple[int, int, int, windows_resume.Origin | None],
        split: tuple[int, int] | None,
    ) -> Iterator[list[Any]]:
        window, skip, start, origin = at
        worker, workers = split or (0, 1)
        for lengths, fetch in self._windows_from(start):
            # In a worker, no collective: the process group is the training process's (`windows_workers.py`).
            plan = self.plan_lengths(lengths, window, epoch, check=split is None, origin=origin)
            with self._lock:
                self._check(token)
                self._seen.append((window, self._handed - skip, plan.steps, start, len(lengths)))
                first = self._handed
            mine = [plan[step * plan.world_size + self._rank] for step in range(skip, plan.steps)]
            # The k-th batch of the window is handed out as batch `first + k` of the iteration.
            ours = [(first + k) % workers == worker for k in range(len(mine))]
            owned = [batch for batch, own in zip(mine, ours, strict=True) if own]
            rows = np.unique(np.concatenate(owned)) if owned else np.zeros(0, np.uint32)
            examples = dict(zip(rows.tolist(), fetch(rows), strict=True))  # this rank's examples only
            for step, (batch, own) in enumerate(zip(mine, ours, strict=True), start=skip):
                with self._lock:
                    self._check(token)
                    self._handed += 1
                    self._at = (window, step + 1, start)
                if own:
                    yield [examples[i] for i in batch.tolist()]
            skip, window, start = 0, window + 1, start + len(lengths)
        with self._lock:
            if token == self._live:
                self._resume = False

    def _windows_from(self, start: int) -> Iterator[tuple[np.ndarray, Callable[[np.ndarray], list[Any]]]]:
        """Every window from example ``start`` on: its lengths, and a function giving its examples at some rows.
        Parquet shards with a length column are planned from that column alone, and only this rank's rows
        are made Python examples; other streams are read whole, a window at a time."""
        shards = self._stream.shards() if self._column is not None else None
        if shards is None:
            for examples in self.cut(self._stream.examples(start)):
                yield self.lengths_of(examples, start), functools.partial(held, examples)
                start += len(examples)
            return
        assert self._column is not None
        for lo, hi in bounds(shards.rows, self._window, start):
            lengths = column_lengths(shards.column(self._column, lo, hi), self._column, lo)
            yield lengths, functools.partial(taken, shards, lo)

    def _check(self, token: int) -> None:
        if token != self._live:
            raise RuntimeError(
                "this iteration was superseded (a newer iteration, set_epoch or load_state_dict); start a new one"
            )

    def cut(self, examples: Iterator[Any]) -> Iterator[list[Any]]:
        """Windows of ``window`` examples; the last takes a tail shorter than half a window."""
        size, extra = self._window, self._window // 2
        held: list[Any] = []
        for example in examples:
            held.append(example)
            if len(held) == size + extra:
                yield held[:size]
                held = held[size:]
        if held:
            yield held

    def lengths_of(self, examples: list[Any], start: int = 0) -> np.ndarray:
        """The lengths the windows are planned by, of ``examples`` (the stream's from example ``start``, which
        errors name)."""
        if self._column is not None:
            values = _validated([length_in(example, self._column) for example in examples], start)
        else:
            assert self._measure is not None  # one of the two, checked when built
            values = _validated(self._measure.lengths_of(examples), start)
        return values.astype(np.uint32)

    def plan_window(self, examples: list[Any], window: int, epoch: int | None = None) -> _core.Plan:
        """The plan of window ``window`` of pass ``epoch`` (default: the current pass), holding ``examples``
        (its batches index them)."""
        return self.plan_lengths(self.lengths_of(examples, window * self._window), window, epoch)

    def plan_lengths(
        self,
        lengths: np.ndarray,
        window: int,
        epoch: int | None = None,
        *,
        check: bool = True,
        origin: windows_resume.Origin | None = None,
    ) -> _core.Plan:
        """The plan of window ``window`` of pass ``epoch`` (default: the current pass), whose examples have
        ``lengths`` (``uint32``): the rest after the origin's steps when it is the window resumed on other
        ranks. ``check=False`` skips comparing the window across ranks."""
        origin = origin if origin is not None and origin.window == window else None
        epoch = self._pass if epoch is None else _epoch(epoch)
        config = self._config.replace(seed=_core.window_seed(self._config.seed, window))
        if check and self._check_ranks and process_group_size() == self.world_size:
            check_ranks_agree(
                {
                    "epoch": epoch,
                    "window": window,
                    "examples": len(lengths),
                    "lengths": hashlib.sha256(lengths.tobytes()).hexdigest(),
                    "settings": self._config.settings(),
                    "origin": origin,
                }
            )
        try:
            planner = _core.Planner([lengths], config)
            if origin is not None:
                return windows_resume.plan_rest(planner, epoch, origin, window * self._window, len(lengths))
            return planner.plan(epoch)
        except PlanError as error:  # the same error (kind, setting), told which window and where it starts
            start = window * self._window
            hint = "; a larger window gives every rank a batch" if error.kind == "too_few_samples_for_ranks" else ""
            error.args = (
                f"window {window} ({len(lengths)} examples from example {start} of the stream; rows "
                f"counted from there): {error}{hint}",
            )
            raise


def bounds(total: int, size: int, start: int = 0) -> Iterator[tuple[int, int]]:
    """The windows of a stream of ``total`` examples as :meth:`Windows.cut` makes them, from example ``start``
    (a window's first example) on."""
    lo = 0
    while total - lo >= size + size // 2:
        if lo >= start:
            yield lo, lo + size
        lo += size
    if total > lo >= start:
        yield lo, total

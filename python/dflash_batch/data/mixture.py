"""``Mixture``: several sources with weights, planned, batched and trained as one dataset.

    mix = db.Mixture({"chat": (chat_store, 0.6), "code": (code_store, 0.4)})
    sampler = db.BucketSampler(mix, max_tokens=16384)   # each epoch: every source its share, in every step
    loader = db.Loader(mix, sampler)                     # batches carry a "source" id per row (per packed sample)

The mixture's rows are its sources' rows, source after source: source ``s`` holds rows
``bounds[s]:bounds[s + 1]``, and a plan's indices are those rows — repeated where a source is
up-sampled. Choosing each epoch's rows and spreading the sources through every optimizer step is the
Rust planner's work (``rust/core/src/plan/mixture``); this module holds what needs Python: the sources'
data, one store over all of them, and rows mapped back to their sources.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

import dflash_batch._core as _core

from ..base.arguments import _length_chunks
from ..base.errors import invalid_setting
from .reading import TokenStore
from .sources import is_source

#: What the weights count unless told: tokens, what the loss (a token mean) and the compute see.
DEFAULT_UNIT = "tokens"


class Mixture:
    """Sources with weights (see the module docs).

    Args:
        sources: ``{name: (data, weight)}``, in the order the sources' rows follow each other. ``data``
            is a :class:`TokenStore` (what a :class:`Loader` reads), a dataset :class:`TokenStore`
            opens (a path, a glob, a ``datasets.Dataset``: opened with ``column``), or the source's
            lengths (an integer array or list) to plan without a store. ``weight``: the source's share
            of every epoch (≥ 0; the weights sum to 1).
        unit: ``"tokens"`` (default) — each source's tokens per epoch are within one sample of its
            share, which is what the loss, a token mean, and the compute see — or ``"samples"``: each
            source's sample count per epoch is exact.
        max_repeat: the most times a source's rows are trained per epoch (≥ 1, default 4): a source
            whose weight asks for more is refused, naming it. Up-sampled rows repeat as evenly as can be
            (``k`` or ``k + 1`` times).
        epoch_size: samples or tokens (in ``unit``) of every epoch; default the sources' total, so an
            epoch is as long as the data and each source is up- or down-sampled to its weight. A
            down-sampled source walks through its rows over successive epochs before repeating any.
        schedule: weights that change during the run, declared up front: ``{epoch: {name: weight}}``,
            every source's weight from that epoch on (epochs ≥ 1; the sources' own weights are epoch
            0's). Each epoch's shares are exact for its weights, and a down-sampled source's cycle
            carries on across a change (no row twice within a cycle). See ``docs/mixtures.md``.
        interpolation: how the weights move between the schedule's points: ``"constant"`` (default; a
            point's weights hold until the next) or ``"linear"`` (a straight line, epoch by epoch).
        column: the token column of sources given as datasets.
    """

    def __init__(
        self,
        sources: Mapping[str, tuple[Any, float]],
        *,
        unit: str = DEFAULT_UNIT,
        max_repeat: float = 4.0,
        epoch_size: int | None = None,
        schedule: Mapping[int, Mapping[str, float]] | None = None,
        interpolation: str = "constant",
        column: str = "input_ids",
    ) -> None:
        if not isinstance(sources, Mapping):
            raise TypeError(
                f"sources must be a dict of name -> (data, weight), e.g. {{'chat': (store, 0.6), ...}}; got "
                f"{type(sources).__name__}"
            )
        names, data, weights = [], [], []
        for name, entry in sources.items():
            if not isinstance(name, str):
                raise TypeError(f"source names must be strings, got {type(name).__name__} {name!r}")
            if not isinstance(entry, tuple) or len(entry) != 2:
                raise TypeError(f"source {name!r} must be a (data, weight) pair, got {type(entry).__name__}")
            names.append(name)
            data.append(entry[0])
            weights.append(_weight(name, entry[1]))
        if not isinstance(unit, str):
            raise TypeError(f"unit must be 'tokens' or 'samples', got {type(unit).__name__}")
        self._stores: list[TokenStore | None] = [_store(d, column) for d in data]
        self._lengths = [_lengths(name, d, s) for name, d, s in zip(names, data, self._stores, strict=True)]
        rows = [len(lengths) for lengths in self._lengths]
        if not isinstance(interpolation, str):
            raise TypeError(f"interpolation must be 'constant' or 'linear', got {type(interpolation).__name__}")
        self._spec = _core.Mixture(
            names,
            rows,
            weights,
            unit=unit,
            max_repeat=_max_repeat(max_repeat),
            epoch_size=_epoch_size(epoch_size),
            schedule=_schedule(names, schedule),
            interpolation=interpolation,
        )
        self._bounds = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        self._joined: TokenStore | None = None

    # -- what it is --------------------------------------------------------------------------------------

    @property
    def spec(self) -> _core.Mixture:
        """The sources and settings as the planner takes them (names, rows, weights, unit, ...)."""
        return self._spec

    @property
    def names(self) -> list[str]:
        return list(self._spec.names)

    @property
    def weights(self) -> dict[str, float]:
        return dict(zip(self._spec.names, self._spec.weights, strict=True))

    def weights_at(self, epoch: int) -> dict[str, float]:
        """Every source's weight in epoch ``epoch``: the schedule's, or the sources' own."""
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral) or not 0 <= epoch < 1 << 64:
            raise TypeError(f"epoch must be an int ≥ 0, got {type(epoch).__name__} {epoch!r}")
        return dict(zip(self._spec.names, self._spec.weights_at(int(epoch)), strict=True))

    @property
    def schedule(self) -> dict[int, dict[str, float]] | None:
        """The schedule's points, ``{epoch: {name: weight}}``, or ``None`` for fixed weights."""
        points = self._spec.schedule
        if points is None:
            return None
        return {epoch: dict(zip(self._spec.names, weights, strict=True)) for epoch, weights in points}

    @property
    def interpolation(self) -> str:
        return str(self._spec.interpolation)

    @property
    def unit(self) -> str:
        return str(self._spec.unit)

    @property
    def bounds(self) -> np.ndarray:
        """Row bounds: source ``s`` holds rows ``bounds[s]:bounds[s + 1]`` (int64, a copy)."""
        return self._bounds.copy()

    def __len__(self) -> int:
        """Rows of all sources together."""
        return int(self._bounds[-1])

    def chunks(self) -> list[np.ndarray]:
        """The sources' lengths, one array each, in order (what the planner concatenates)."""
        return list(self._lengths)

    def lengths(self) -> np.ndarray:
        """Every row's length, source after source (a new uint32 array)."""
        return np.concatenate([np.asarray(chunk, dtype=np.uint32) for chunk in self._lengths])

    def source_of(self, rows: Any) -> np.ndarray:
        """The source number (``0 … len(names) - 1``, int64) of each row of ``rows``."""
        return sources_of(self._bounds, rows)

    @property
    def store(self) -> TokenStore:
        """One :class:`TokenStore` over every source's store, rows source after source (no tokens copied):
        what a :class:`Loader` and collation read. The sources must share a token type and a loss mask."""
        if self._joined is None:
            missing = [n for n, s in zip(self._spec.names, self._stores, strict=True) if s is None]
            if missing:
                raise TypeError(
                    f"source {missing[0]!r} was given as lengths, so the mixture can plan but has no tokens to "
                    "read; give it a dflash_batch.TokenStore (or a dataset path) to load batches"
                )
            self._joined = JoinedStore(self._spec.names, [s for s in self._stores if s is not None])
        return self._joined

    def __getitem__(self, row: int) -> np.ndarray:
        return self.store[row]

    # -- copies ----------------------------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        data = [s if s is not None else lengths for s, lengths in zip(self._stores, self._lengths, strict=True)]
        return {"spec": self._spec, "data": data}

    def __setstate__(self, state: dict[str, Any]) -> None:
        spec = state["spec"]
        self._spec, self._joined = spec, None
        self._stores = [d if isinstance(d, TokenStore) else None for d in state["data"]]
        self._lengths = [_lengths(n, d, s) for n, d, s in zip(spec.names, state["data"], self._stores, strict=True)]
        self._bounds = np.concatenate([[0], np.cumsum(spec.rows)]).astype(np.int64)

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{name!r}: ({rows} rows, {weight:g})"
            for name, rows, weight in zip(self._spec.names, self._spec.rows, self._spec.weights, strict=True)
        )
        schedule = (
            "" if self.schedule is None else f", schedule={self.schedule!r}, interpolation={self.interpolation!r}"
        )
        return f"Mixture({{{parts}}}, unit={self.unit!r}, max_repeat={self._spec.max_repeat:g}{schedule})"


def sources_of(bounds: np.ndarray, rows: Any) -> np.ndarray:
    """Source numbers (int64) of ``rows`` for sources holding rows ``bounds[s]:bounds[s + 1]``."""
    return np.searchsorted(bounds, np.asarray(rows, dtype=np.int64), side="right") - 1


class JoinedStore(TokenStore):
    """Several stores read as one (:meth:`Mixture.store`): the Rust store concatenates theirs, sharing
    their mapped files; it pickles as its parts."""

    def __init__(self, names: list[str], stores: list[TokenStore]) -> None:
        self._join(list(names), list(stores))

    def _join(self, names: list[str], stores: list[TokenStore]) -> None:
        self._names, self._parts = names, stores
        self._inner = _core.TokenStore.concat(names, [s.native for s in stores])
        self._column, self._mask = stores[0].column, stores[0].mask

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(path for store in self._parts for path in store.paths)

    def __getstate__(self) -> dict[str, Any]:
        return {"names": self._names, "parts": self._parts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._join(state["names"], state["parts"])

    def __repr__(self) -> str:
        return f"JoinedStore({len(self._parts)} sources, rows={len(self)}, dtype={self.dtype})"


def _weight(name: str, weight: Any) -> float:
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
        raise TypeError(f"source {name!r} has weight {weight!r} ({type(weight).__name__}); pass a number")
    return float(weight)


def _max_repeat(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"max_repeat must be a number ≥ 1, got {type(value).__name__} {value!r}")
    return float(value)


def _epoch_size(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"epoch_size must be a positive int or None, got {type(value).__name__} {value!r}")
    size = int(value)
    if not 0 < size < 1 << 64:
        raise invalid_setting("epoch_size", f"epoch_size={value!r} is invalid; pass a positive size, or None")
    return size


def _schedule(names: list[str], schedule: Any) -> list[tuple[int, list[float]]] | None:
    """``{epoch: {name: weight}}`` as the planner takes it: ``(epoch, weights)`` in epoch order, each
    naming every source once."""
    if schedule is None:
        return None
    if not isinstance(schedule, Mapping):
        raise TypeError(
            f"schedule must be a dict of epoch -> {{name: weight}}, e.g. {{3: {{'chat': 0.4, 'code': 0.6}}}}; "
            f"got {type(schedule).__name__}"
        )
    points = []
    for epoch, weights in schedule.items():
        if isinstance(epoch, bool) or not isinstance(epoch, numbers.Integral):
            raise TypeError(f"schedule epochs must be ints, got {type(epoch).__name__} {epoch!r}")
        if not 0 <= int(epoch) < 1 << 64:
            raise invalid_setting("schedule", f"the schedule's epoch {epoch!r} is invalid; give epochs ≥ 1")
        if not isinstance(weights, Mapping):
            raise TypeError(
                f"the schedule's point at epoch {epoch} must be a dict of name -> weight, got {type(weights).__name__}"
            )
        unknown = [name for name in weights if name not in names]
        if unknown:
            raise invalid_setting(
                "schedule", f"the point at epoch {epoch} names {unknown[0]!r}, which is not a source (sources: {names})"
            )
        missing = [name for name in names if name not in weights]
        if missing:
            raise invalid_setting(
                "schedule",
                f"the point at epoch {epoch} gives no weight for source {missing[0]!r}; give every source's weight "
                "(0 leaves it out)",
            )
        points.append((int(epoch), [_weight(name, weights[name]) for name in names]))
    return sorted(points, key=lambda point: point[0])


def _store(data: Any, column: str) -> TokenStore | None:
    if isinstance(data, TokenStore):
        return data
    if is_source(data):
        return TokenStore(data, column)
    return None


def _lengths(name: str, data: Any, store: TokenStore | None) -> np.ndarray:
    if store is not None:
        return store.lengths()
    try:
        chunks = _length_chunks(data)
    except TypeError as error:
        raise TypeError(f"source {name!r}: {error} (or pass a dflash_batch.TokenStore)") from None
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)

"""What users pass to a :class:`~dflash_batch.BucketSampler` besides its planning settings (those are
checked once, by ``_core.Config``): the lengths as 1-D integer arrays (zero-copy where possible), the
ranks' torch.distributed defaults, and the epoch, step and state values of its methods."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .._core import PlanError
from .errors import invalid_setting
from .ranks import discover

_U64 = 1 << 64
_U32_MAX = (1 << 32) - 1


def _is_hex(text: str) -> bool:
    """Lowercase hex digits only, as the Rust fingerprint is written (``int(text, 16)`` also took
    prefixes, signs, underscores and spaces)."""
    return set(text) <= set("0123456789abcdef")


def _length_chunks(lengths: Any) -> list[np.ndarray]:
    """Normalizes the accepted length inputs to 1-D integer numpy arrays (zero-copy where possible)."""
    if isinstance(lengths, (str, bytes)) or lengths is None or np.isscalar(lengths):
        raise TypeError(f"lengths must be an array of integers, got {type(lengths).__name__} {lengths!r:.40}")
    if isinstance(lengths, (set, frozenset, dict)):  # numpy makes a 0-d object array of them
        raise TypeError(
            f"lengths must be an ordered sequence of integers (one per row), got a {type(lengths).__name__}; "
            "pass a list or a numpy array in row order"
        )
    if _is_arrow(lengths):
        return _arrow_chunks(lengths)
    if isinstance(lengths, Iterator):  # np.asarray makes a 0-d object array of it
        raise TypeError(
            f"lengths must be an array of integers, got a {type(lengths).__name__}; "
            "pass a list or np.fromiter(lengths, dtype=np.int64)"
        )
    array = np.asarray(lengths)
    if array.size == 0:
        return [np.zeros(0, dtype=np.uint32)]
    if isinstance(lengths, (list, tuple)) and any(isinstance(v, (bool, np.bool_)) for v in lengths):
        _first_non_length(lengths)  # a bool among integers is not a token count: [1, True] is not [1, 1]
    if array.ndim != 1:
        raise PlanError(f"lengths must be 1-D, got an array of shape {array.shape}; pass one length per sample")
    if array.dtype.kind not in "iu":
        if array.dtype.kind != "b":  # a missing or out-of-range value made numpy fall back: name it
            _first_non_length(lengths if isinstance(lengths, (list, tuple)) else array)
        raise TypeError(f"lengths must be integers, got dtype {array.dtype}; convert with .astype(np.int64)")
    if not array.dtype.isnative:
        raise TypeError(
            f"lengths are in non-native byte order (dtype {array.dtype.str}); convert with "
            f"lengths.astype({array.dtype.newbyteorder('=').name!r})"
        )
    return [np.ascontiguousarray(array)]


def _first_non_length(values: Any) -> None:
    """Numpy made no integer array of ``values``: the first row that is missing (None, NA, NaN), or an
    integer out of range (which is why numpy fell back to floats or objects) raises, naming it; only
    non-integral values are left to the caller's ``TypeError``."""
    for row, value in enumerate(values):
        if isinstance(value, (bool, np.bool_)):
            raise TypeError(f"lengths row {row} is the bool {value!r}, not a token count; pass integers")
        if isinstance(value, (int, np.integer)):
            value = int(value)
            if value <= 0:
                raise PlanError(
                    f"length {value} at row {row} is not positive; every sample needs at least one token "
                    "(filter empty samples out of the dataset first)"
                )
            if value > _U32_MAX:
                raise PlanError(
                    f"length {value} at row {row} exceeds the largest supported length {_U32_MAX}; check the column"
                )
            continue
        if value is None or (isinstance(value, (float, np.floating)) and np.isnan(value)) or _is_na(value):
            raise PlanError(
                f"lengths row {row} is missing ({value!r}); drop or fill those samples first "
                "(e.g. dataset.filter, or Series.dropna())"
            )


def _is_na(value: Any) -> bool:
    """pandas' ``NA`` (and ``NaT``) without importing pandas."""
    return type(value).__name__ in ("NAType", "NaTType")


def _is_arrow(value: Any) -> bool:
    return type(value).__module__.startswith("pyarrow") and hasattr(value, "null_count")


def _arrow_chunks(array: Any) -> list[np.ndarray]:
    import pyarrow as pa

    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    if not pa.types.is_integer(array.type):
        raise TypeError(f"lengths must be integers, got arrow type {array.type}")
    out, row = [], 0
    for chunk in chunks:
        if chunk.null_count:
            first = row + chunk.is_null().to_numpy(zero_copy_only=False).argmax()
            raise PlanError(
                f"lengths contain {array.null_count} null(s), the first at row {first}; "
                "drop or fill those samples first"
            )
        out.append(chunk.to_numpy(zero_copy_only=True))
        row += len(chunk)
    return out or [np.zeros(0, dtype=np.uint32)]


def _default_ranks(world_size: Any, rank: Any) -> tuple[Any, Any]:
    """``world_size`` and ``rank`` with ``None`` taken from torch.distributed (or torchrun's variables);
    the sampler's ``Config`` checks ``world_size``, :func:`_check_rank` the rank against it."""
    if world_size is None or rank is None:
        default_world, default_rank = discover()
        world_size = default_world if world_size is None else world_size
        rank = default_rank if rank is None else rank
    return world_size, rank


def _check_context_parallel_ranks(context_parallel: Any, world_size: Any, rank: Any) -> None:
    """Under context parallelism the ``cp`` ranks of a group train on the same rows, so the sampler's ranks
    are the data-parallel ones — which torch.distributed cannot tell apart from the CP ones. Refuses to
    guess them from the process count (every process would get its own rows: the CP shards of different
    rows would be trained as one)."""
    if not _is_int(context_parallel):
        return  # a bad value the Config names
    if context_parallel <= 1:
        return
    if world_size is not None and rank is not None:
        return
    processes, _ = discover()
    if processes > 1:
        raise invalid_setting(
            "world_size",
            f"context_parallel={context_parallel} splits each row over {context_parallel} ranks that must read "
            f"the same batches, so the sampler's ranks are the data-parallel ones, not the {processes} "
            "processes: pass world_size=<data-parallel size> and rank=<data-parallel rank> (e.g. "
            "mesh['dp'].size() and mesh['dp'].get_local_rank())",
        )


def _check_rank(rank: Any, world_size: int) -> int:
    rank = _int("rank", rank)
    if not 0 <= rank < world_size:
        raise invalid_setting("rank", f"rank={rank} is invalid for world_size={world_size}; use 0 <= rank < world_size")
    return rank


def _is_int(value: Any) -> bool:
    """Whether ``value`` is an integer as users hand them over: Python's or numpy's, never a bool (numpy
    integers are integers everywhere: ``np.int64(2)`` from an array is the 2 the user meant)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _int(name: str, value: Any) -> int:
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def _epoch(value: Any) -> int:
    value = _int("epoch", value)
    if not 0 <= value < _U64:
        raise invalid_setting("epoch", f"epoch={value} is invalid; epoch must be in [0, 2**64)")
    return value


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def _state_count(name: str, value: Any, low: int) -> None:
    """A count in a checkpoint's state: an int from ``low`` to 2**32 - 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"state {name} must be an int, got {type(value).__name__} {value!r}")
    if not low <= value <= 2**32 - 1:
        raise PlanError(f"state {name}={value!r} is invalid (≥ {low} expected); pass the checkpoint's state unedited")

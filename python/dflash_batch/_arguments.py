"""What users pass to a :class:`~dflash_batch.BucketSampler`, checked and made plain: the lengths as 1-D
integer arrays (zero-copy where possible), the ranks, and every setting with an error naming the value
and the fix."""

from __future__ import annotations

import operator
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._core import PlanError
from ._errors import invalid_setting

_U64 = 1 << 64
_U32_MAX = (1 << 32) - 1


def _settings(*, oversize: str, accumulation: int | None, world_size: int, **given: Any) -> dict[str, Any]:
    """A :class:`BucketSampler`'s planning settings, each checked, as the sampler keeps, pickles and
    hands to the Rust planner (``world_size`` already resolved)."""
    if oversize not in ("error", "skip", "truncate"):
        raise invalid_setting("oversize", f"oversize={oversize!r} is invalid; use 'error', 'skip' or 'truncate'")
    config = {
        "batch_size": _optional_int("batch_size", given["batch_size"]),
        "max_tokens": _optional_int("max_tokens", given["max_tokens"]),
        "boundaries": _boundaries(given["boundaries"]),
        "seed": _seed(given["seed"]),
        "shuffle": _bool("shuffle", given["shuffle"]),
        "world_size": world_size,
        "drop_last": _bool("drop_last", given["drop_last"]),
        "skip_oversize": oversize == "skip",
        "pad_to_multiple_of": _positive_int("pad_to_multiple_of", given["pad_to_multiple_of"]),
        "threads": _threads(given["threads"]),
        "accumulation": 1 if accumulation is None else _positive_int("accumulation", accumulation),
        "target_efficiency": _fraction("target_efficiency", given["target_efficiency"]),
        "order": given["order"],
        "cost": _cost(given["cost"]),
        "balance_tolerance": _tolerance(given["balance_tolerance"]),
        "mode": given["mode"],
        "bucketed": _bool("bucketed", given["bucketed"]),
        "trim_steps": _bool("trim_steps", given["trim_steps"]),
        # Python-side: long samples become pieces before the Rust planner sees the lengths.
        "truncate": oversize == "truncate",
    }
    if config["truncate"] and config["mode"] != "packed":
        raise PlanError(
            "oversize='truncate' splits long samples into max_tokens pieces for packed rows; pass "
            "mode='packed', or oversize='skip' to leave long samples out"
        )
    return config


def _is_hex(text: str) -> bool:
    """Lowercase hex digits only, as the Rust fingerprint is written (``int(text, 16)`` also took
    prefixes, signs, underscores and spaces)."""
    return set(text) <= set("0123456789abcdef")


def _length_chunks(lengths: Any) -> list[np.ndarray]:
    """Normalizes the accepted length inputs to 1-D integer numpy arrays (zero-copy where possible)."""
    if isinstance(lengths, (str, bytes)) or lengths is None or np.isscalar(lengths):
        raise TypeError(f"lengths must be an array of integers, got {type(lengths).__name__} {lengths!r:.40}")
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
    if array.ndim != 1:
        raise PlanError(f"lengths must be 1-D, got an array of shape {array.shape}; pass one length per sample")
    if array.dtype.kind not in "iu":
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
            continue
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


def _resolve_ranks(world_size: int | None, rank: int | None) -> tuple[int, int]:
    if world_size is None or rank is None:
        default_world, default_rank = _distributed()
        world_size = default_world if world_size is None else world_size
        rank = default_rank if rank is None else rank
    world_size = _positive_int("world_size", world_size)
    rank = _int("rank", rank)
    if not 0 <= rank < world_size:
        raise invalid_setting("rank", f"rank={rank} is invalid for world_size={world_size}; use 0 <= rank < world_size")
    return world_size, rank


def _distributed() -> tuple[int, int]:
    """(world_size, rank) from torch.distributed when initialized, else from the ``WORLD_SIZE`` and ``RANK``
    variables that torchrun sets (a sampler built before ``init_process_group``), else (1, 0). Never
    imports torch."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    world, rank = os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
    if world is None or rank is None:
        return 1, 0
    try:
        return int(world), int(rank)
    except ValueError:
        raise PlanError(
            f"WORLD_SIZE={world!r} and RANK={rank!r} from the environment are not integers; "
            "pass world_size= and rank= explicitly"
        ) from None


def _boundaries(value: Any) -> int | list[int] | None:
    """``None`` for ``"auto"``; a count or edges as ints (their limits are the core's to check)."""
    if isinstance(value, str):
        if value != "auto":
            raise invalid_setting(
                "boundaries", f"boundaries={value!r} is invalid; use 'auto', a bucket count or a list of edges"
            )
        return None
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    try:
        edges = [operator.index(e) for e in value]
    except TypeError:
        raise TypeError(f"boundaries must be 'auto', a bucket count or a list of int edges, got {value!r}") from None
    bad = [e for e in edges if not 0 <= e < 2**32]
    if bad:
        raise PlanError(f"boundary edge {bad[0]} is out of range; edges must be in [0, 2**32)")
    return edges


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def _positive_int(name: str, value: Any) -> int:
    value = _int(name, value)
    if value < 1 or value >= 2**32:
        raise invalid_setting(name, f"{name}={value} is invalid; {name} must be between 1 and 4294967295")
    return value


def _optional_int(name: str, value: Any) -> int | None:
    if value is None:
        return None
    value = _int(name, value)
    if not -(2**63) <= value < 2**63:
        raise PlanError(f"{name}={value} is out of range")
    return value


def _threads(value: Any) -> int | None:
    """``None`` or 1 ≤ threads ≤ 4 × cores: every planner thread is an OS thread (10**6 spawned a million)."""
    if value is None:
        return None
    value = _int("threads", value)
    most = 4 * (os.cpu_count() or 1)
    if not 1 <= value <= most:
        raise PlanError(
            f"threads={value} is invalid; pass 1 to {most} (4 × this machine's cores), or None for the default"
        )
    return value


def _number(name: str, value: Any, what: str) -> float:
    """A float from a Python or numpy number (not a bool); its range is the core's to check."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")
    return float(value)


def _fraction(name: str, value: Any) -> float:
    return _number(name, value, "a number in (0, 1]")


def _cost(value: Any) -> str | tuple[float, float]:
    if isinstance(value, str):
        return value
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return (_number("cost's a", value[0], "a number"), _number("cost's b", value[1], "a number"))
    raise TypeError(f"cost must be 'tokens' or a pair (a, b) of numbers, got {type(value).__name__} {value!r}")


def _tolerance(value: Any) -> float | None:
    return None if value is None else _number("balance_tolerance", value, "None or a number")


def _seed(value: Any) -> int:
    value = _int("seed", value)
    if not 0 <= value < _U64:
        raise invalid_setting("seed", f"seed={value} is invalid; seed must be in [0, 2**64)")
    return value


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

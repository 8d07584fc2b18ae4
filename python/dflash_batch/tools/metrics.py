"""Mixing and balance figures for any batching in CSR form (``order``, ``offsets``), computed by the same
Rust code as ``Plan.stats()``, so baselines and plans are scored alike. Definitions: see ``Plan.stats``
and ``rust/core/src/metrics.rs``."""

from __future__ import annotations

from typing import Any

import numpy as np

import dflash_batch._core as _core


def _csr(order: Any, offsets: Any) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.asarray(offsets)
    # Plans' offsets are uint32 (a plan holds at most 2**32 - 1 entries); a larger value must not wrap.
    if offsets.size and offsets.dtype.kind in "iu" and int(offsets.max()) > np.iinfo(np.uint32).max:
        raise ValueError(
            f"offsets reach {int(offsets.max()):,}, past the {np.iinfo(np.uint32).max:,} entries a batching "
            "can hold; score it in parts"
        )
    return np.ascontiguousarray(offsets, dtype=np.uint32), np.ascontiguousarray(order, dtype=np.uint32)


def efficiency(lengths: Any, order: Any, offsets: Any, pad_to_multiple_of: int = 1) -> float | None:
    """Real tokens over padded tokens (rows × longest row per batch, rounded up to ``pad_to_multiple_of``)."""
    offsets, order = _csr(order, offsets)
    return _core.efficiency(offsets, order, np.ascontiguousarray(lengths, dtype=np.uint32), pad_to_multiple_of)


def window_tv(lengths: Any, order: Any, offsets: Any, window: int) -> float | None:
    """Mean total-variation distance of windows of ``window`` batches from the token deciles."""
    offsets, order = _csr(order, offsets)
    return _core.window_tv(offsets, order, np.ascontiguousarray(lengths, dtype=np.uint32), window)


def mixing(lengths: Any, order: Any, offsets: Any, window: int) -> dict[str, float] | None:
    """``window_tv`` and ``length_gap`` over windows of ``window`` batches, each with its ``_tail`` over the
    last tenth of the windows (``Plan.stats()``'s mixing figures)."""
    offsets, order = _csr(order, offsets)
    return _core.mixing(offsets, order, np.ascontiguousarray(lengths, dtype=np.uint32), window)


def rank_imbalance(lengths: Any, order: Any, offsets: Any, world_size: int, pad_to_multiple_of: int = 1):
    """``(p50, p99, max)`` over steps of the most over the least padded tokens among the ranks."""
    offsets, order = _csr(order, offsets)
    lengths = np.ascontiguousarray(lengths, dtype=np.uint32)
    return _core.rank_imbalance(offsets, order, lengths, world_size, pad_to_multiple_of)


def churn(samples: int, first: tuple[Any, Any], second: tuple[Any, Any]) -> float | None:
    """Share of sample pairs batched together in ``first`` (order, offsets) that are again in ``second``."""
    a_offsets, a_order = _csr(*first)
    b_offsets, b_order = _csr(*second)
    return _core.churn(a_offsets, a_order, b_offsets, b_order, samples)


def sync_efficiency(
    lengths: Any,
    order: Any,
    offsets: Any,
    world_size: int,
    accumulation: int = 1,
    *,
    pad_to_multiple_of: int = 1,
    cost: tuple[float, float] = (1.0, 0.0),
) -> tuple[float, float] | None:
    """``(per micro-batch, per optimizer step)`` synchronous efficiency: the batches' cost over
    ``world_size ×`` the time ranks take waiting for the slowest one, every step or every
    ``accumulation`` steps. A row of padded length ``L`` costs ``a·L + b·L²`` (``cost=(a, b)``)."""
    offsets, order = _csr(order, offsets)
    lengths = np.ascontiguousarray(lengths, dtype=np.uint32)
    return _core.sync_efficiency(offsets, order, lengths, world_size, accumulation, pad_to_multiple_of, cost)


def end_to_end(
    lengths: Any,
    order: Any,
    offsets: Any,
    world_size: int,
    accumulation: int = 1,
    *,
    pad_to_multiple_of: int = 1,
    cost: tuple[float, float] = (1.0, 0.0),
    capacity: int | None = None,
) -> tuple[float, float] | None:
    """``(per micro-batch, per optimizer step)`` end-to-end efficiency: every sample's own ``a·l + b·l²``
    over ``world_size ×`` the time the ranks take, waiting for the slowest and padding included — the
    share of the GPUs' time that trains real tokens (synchronous efficiency × the useful share of the
    work). Padded batches take ``rows × (a·L + b·L²)``; with ``capacity``, packed rows take
    ``a·capacity + b·Σl²``."""
    offsets, order = _csr(order, offsets)
    lengths = np.ascontiguousarray(lengths, dtype=np.uint32)
    return _core.end_to_end(offsets, order, lengths, world_size, accumulation, pad_to_multiple_of, cost, capacity)

"""``measure_cost``: what a row of ``L`` tokens costs on *your* model and device, as the ``cost=(a, b)`` the
sampler takes.

A training step on a padded batch of ``rows × L`` tokens takes about ``c + rows · (a·L + b·L²)`` seconds:
``a·L`` for the parts that grow with tokens (MLPs, projections), ``b·L²`` for attention's scores, and ``c``
for what every step pays whatever its size (kernel launches, the optimizer's share is not in it). The ratio
``b / a`` is what shapes a plan: it says how much more a long row costs than two half as long, so the
sampler's token budget and rank balance price batches the way the GPU does. ``measure_cost`` times the
user's own forward and backward on a small grid of shapes and fits the three numbers by least squares
over relative errors (a 0.1 s step and a 1 ms step count alike), with none negative.

The fit is plain numpy: the core plans with whatever ``cost`` it is given, so nothing here is planning.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..base.arguments import _is_int
from ..base.errors import invalid_setting

#: Lengths and rows timed by default: long enough for attention to show, small enough for any GPU.
LENGTHS = (256, 512, 1024, 2048, 4096)
ROWS = (1, 2, 4)
#: A fit off by more than this on some timed shape is reported with a warning (it may mislead a plan).
MAX_ERROR = 0.2


@dataclass(frozen=True)
class CostFit:
    """A fitted step time ``c + rows · (a·L + b·L²)`` seconds, and how well it fits the timings.

    ``cost`` is what ``BucketSampler(cost=...)`` takes: ``(1, b / a)``, the same prices in units of one
    token's linear cost (only the ratio shapes a plan). ``error`` is the largest relative difference
    between a timed shape and the fit, ``median_error`` the median; ``timings`` holds every shape timed
    as ``(rows, length, seconds)`` (the median of ``repeats``), and ``skipped`` the shapes that did not
    fit in the device's memory.
    """

    a: float
    b: float
    c: float
    error: float
    median_error: float
    timings: tuple[tuple[int, int, float], ...]
    skipped: tuple[tuple[int, int], ...] = field(default=())

    @property
    def cost(self) -> tuple[float, float]:
        """``(1, b/a)`` for a sampler's ``cost=`` (only the ratio shapes a plan); a ratio below 1e-12, the
        smallest coefficient a sampler takes, is no attention price at all."""
        if self.a > 0 and self.b / self.a <= 1e12:
            ratio = self.b / self.a
            return (1.0, ratio if ratio >= 1e-12 else 0.0)
        return (0.0, 1.0)

    def budget(self, tokens: int, length: int) -> int:
        """``max_tokens`` in the units of ``cost``: the price of a batch of ``tokens // length`` rows of
        ``length`` tokens — e.g. ``fit.budget(16384, 8192)`` keeps batches of the longest samples as they
        are under ``max_tokens=16384``, and lets shorter rows fill in what they cost on this model."""
        if not (_is_int(tokens) and _is_int(length) and 0 < length <= tokens):
            raise ValueError(f"budget({tokens!r}, {length!r}) needs ints with 0 < length <= tokens")
        a, b = self.cost
        tokens, length = int(tokens), int(length)
        return max(1, math.ceil((tokens // length) * (a * length + b * length * length)))

    def seconds(self, rows: int, length: int) -> float:
        """The fitted time of one step on ``rows × length`` tokens."""
        return self.c + rows * (self.a * length + self.b * length * length)

    def __repr__(self) -> str:
        a, b = self.cost
        return (
            f"CostFit(cost=({a:g}, {b:.3g}), c={self.c:.3g} s, error={self.error:.1%} max / "
            f"{self.median_error:.1%} median over {len(self.timings)} shapes)"
        )


def fit_cost(timings: Sequence[tuple[int, int, float]]) -> CostFit:
    """Fits ``c + rows · (a·L + b·L²)`` to ``(rows, length, seconds)`` timings (at least three distinct
    shapes, two of them of different lengths): non-negative least squares over relative errors."""
    data = np.asarray([(r, n, s) for r, n, s in timings], dtype=np.float64).reshape(-1, 3)
    if len(data) < 3 or len(np.unique(data[:, 1])) < 2:
        raise ValueError(f"fitting a cost needs at least 3 shapes over 2 lengths, got {len(data)}; time more shapes")
    rows, lengths, seconds = data.T
    if not (np.all(np.isfinite(seconds)) and np.all(seconds > 0)):
        raise ValueError("every timing must be a positive number of seconds")
    columns = np.stack([rows * lengths, rows * lengths**2, np.ones_like(rows)], axis=1)
    a, b, c = _nonnegative_fit(columns / seconds[:, None], np.ones_like(seconds))
    fitted = columns @ np.array([a, b, c])
    relative = np.abs(fitted - seconds) / seconds
    shapes = tuple((int(r), int(n), float(s)) for r, n, s in data)
    return CostFit(a, b, c, float(relative.max()), float(np.median(relative)), shapes)


def _nonnegative_fit(x: np.ndarray, y: np.ndarray) -> tuple[float, ...]:
    """Least squares ``x @ w ≈ y`` with ``w ≥ 0``: the best over every subset of free coefficients (three
    columns: seven subsets), which is exact and needs no solver. One coefficient per column."""
    best, best_w = math.inf, np.zeros(x.shape[1])
    for mask in range(1, 1 << x.shape[1]):
        free = [j for j in range(x.shape[1]) if mask >> j & 1]
        w_free, *_ = np.linalg.lstsq(x[:, free], y, rcond=None)
        if np.any(w_free < 0):
            continue
        w = np.zeros(x.shape[1])
        w[free] = w_free
        residual = float(np.sum((x @ w - y) ** 2))
        if residual < best:
            best, best_w = residual, w
    return tuple(float(w) for w in best_w)


def measure_cost(
    step: Callable[[dict[str, Any]], Any],
    *,
    lengths: Sequence[int] = LENGTHS,
    rows: Sequence[int] = ROWS,
    max_tokens: int | None = None,
    device: Any = None,
    vocab_size: int = 1000,
    repeats: int = 3,
    warmup: int = 1,
    progress: bool | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> CostFit:
    """Times ``step(batch)`` — the user's forward and backward, e.g.
    ``lambda batch: model(**batch).loss.backward()`` — on padded batches of every ``rows × length`` shape
    of the grid (up to ``max_tokens`` tokens when given), and fits the step time (see :class:`CostFit`).

    Each batch is a dict of ``input_ids`` (random ids below ``vocab_size``), ``attention_mask`` (ones),
    ``labels`` and ``position_ids``, ``[rows, length]`` int64 torch tensors on ``device`` (default: CUDA
    when available, else the CPU). On CUDA every timing is bracketed by ``torch.cuda.synchronize()``, so
    queued kernels are counted. Each shape runs ``warmup`` times untimed, then ``repeats`` times; its
    time is the median. A shape that runs out of GPU memory is skipped (and the larger ones after it);
    the fit needs three shapes over two lengths.

    Pass the result's ``cost`` to the sampler: ``BucketSampler(..., cost=fit.cost)``.

    Raises:
        TypeError: ``step`` is not callable.
        ValueError: a grid value is not a positive int, ``repeats`` < 1, or too few shapes ran to fit.
        Whatever ``step`` raises (other than running out of GPU memory), with a note naming the shape.
    """
    import torch

    if not callable(step):
        raise TypeError(f"step must be a callable taking a batch dict, got {type(step).__name__}")
    grid = _grid(lengths, rows, max_tokens)
    if not _is_int(repeats) or repeats < 1:
        raise invalid_setting("repeats", f"repeats={repeats!r} is invalid; pass an int ≥ 1")
    if not _is_int(warmup) or warmup < 0:
        raise invalid_setting("warmup", f"warmup={warmup!r} is invalid; pass an int ≥ 0")
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    generator = torch.Generator().manual_seed(0)
    timings: list[tuple[int, int, float]] = []
    skipped: list[tuple[int, int]] = []
    spreads: list[float] = []
    for r, n in _progress(grid, progress):
        if skipped and any(r >= sr and n >= sn for sr, sn in skipped):
            skipped.append((r, n))
            continue
        batch = _batch(r, n, vocab_size, device, generator)
        try:
            seconds, spread = _time(step, batch, warmup, repeats, sync, clock)
        except torch.cuda.OutOfMemoryError:
            skipped.append((r, n))
            torch.cuda.empty_cache()
            continue
        except Exception as error:
            note = getattr(error, "add_note", None)  # Python 3.11+
            if note is not None:
                note(f"measure_cost: while timing a batch of {r} rows × {n} tokens")
            raise
        timings.append((r, n, seconds))
        spreads.append(spread)
    try:
        fit = fit_cost(timings)
    except ValueError as error:
        raise ValueError(f"{error} (skipped for memory: {skipped or 'none'})") from None
    if fit.error > MAX_ERROR:
        warnings.warn(_why_off(fit.error, fit.median_error, timings, spreads, repeats), stacklevel=2)
    return CostFit(fit.a, fit.b, fit.c, fit.error, fit.median_error, fit.timings, tuple(skipped))


def _grid(lengths: Sequence[int], rows: Sequence[int], max_tokens: int | None) -> list[tuple[int, int]]:
    for name, values in (("lengths", lengths), ("rows", rows)):
        bad = [v for v in values if not _is_int(v) or v < 1]
        if bad or not len(values):
            raise ValueError(f"{name} must be positive ints, got {list(values)!r}")
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise invalid_setting("max_tokens", f"max_tokens={max_tokens!r} is invalid; pass None or an int ≥ 1")
    grid = [(int(r), int(n)) for n in sorted(set(lengths)) for r in sorted(set(rows))]
    return [(r, n) for r, n in grid if max_tokens is None or r * n <= max_tokens]


def _batch(rows: int, length: int, vocab_size: int, device: Any, generator: Any) -> dict[str, Any]:
    import torch

    ids = torch.randint(0, vocab_size, (rows, length), generator=generator, dtype=torch.int64).to(device)
    positions = torch.arange(length, device=device).expand(rows, length).contiguous()
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone(), "position_ids": positions}


def _why_off(error: float, median: float, timings: list, spreads: list[float], repeats: int) -> str:
    """A warning that the fit is off, with what the timings say about why."""
    lengths = len({n for _, n, _ in timings})
    causes = []
    if max(spreads, default=0.0) > MAX_ERROR / 2:
        causes.append(
            f"the {repeats} timings of one shape differ by up to {max(spreads):.0%} (a busy machine, or steps "
            "too short to time): rerun on a quiet device, raise repeats, or time longer lengths"
        )
    if len(timings) < 6 or lengths < 3:
        causes.append(f"only {len(timings)} shapes over {lengths} lengths were timed: pass more lengths and rows")
    if not causes:
        causes.append("the step time does not follow c + rows·(a·L + b·L²) here (check that step() trains)")
    return (
        f"measure_cost: the fit is off by up to {error:.1%} on a timed shape (median {median:.1%}), so the cost "
        f"it gives may misprice batches; " + "; ".join(causes)
    )


def _time(step, batch, warmup: int, repeats: int, sync, clock) -> tuple[float, float]:
    """The median time of ``repeats`` steps, and their spread relative to it."""
    for _ in range(warmup):
        step(batch)
    sync()
    times = []
    for _ in range(repeats):
        start = clock()
        step(batch)
        sync()
        times.append(clock() - start)
    median = float(np.median(times))
    return median, (max(times) - min(times)) / median if median > 0 else 0.0


def _progress(grid: list[tuple[int, int]], enabled: bool | None):
    import sys

    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return grid
    from tqdm.auto import tqdm

    return tqdm(grid, desc="timing shapes", unit="shape")

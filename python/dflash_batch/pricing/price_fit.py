"""The fit behind :class:`~dflash_batch.StepTimer`: micro-batch times against what they ran, the decision
whether the fit replaces the price in use, and what it found (:class:`Calibration`).

``seconds ≈ c + a·x + b·x²`` by non-negative least squares over relative errors (a 0.1 s and a 1 ms
micro-batch count alike), refitted without the records it misses by far (checkpoints, evaluation, GC). A fit
replaces the price in use only when it predicts held-back micro-batches (every fourth) better, by a margin
and by at least :data:`MIN_GAIN`. Plain numpy: the core plans with whatever price it is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .cost import _nonnegative_fit

#: A micro-batch whose time is off the fit by more than this many median deviations (relative) is left out.
OUTLIER_DEVIATIONS = 5.0
#: Micro-batches recorded (over all ranks) below which an epoch's records are not fitted.
MIN_RECORDS = 24
#: A fit must also beat the price in use by this much median relative error (0.2%): two prices that both
#: predict the times as well as the timer can tell are the same price, and the plans stay as they are.
MIN_GAIN = 0.002


@dataclass(frozen=True)
class Calibration:
    """What :meth:`StepTimer.end_epoch` found for ``epoch``'s records (every rank's).

    ``fitted``: the fit's ``(a, b, c)`` in seconds (``None`` when too few records); ``price``: the fit as a
    rank price ``(1, b/a)``; ``error``/``error_before``: median relative error of the fit and of the price in
    use (scaled to seconds) on the held-back micro-batches; ``applied``: whether the next epochs balance by
    ``price``, from ``from_epoch``; ``records``/``dropped``: micro-batches fitted and left out as outliers;
    ``measured``: the synchronous efficiency per micro-batch the ranks' times show (``None`` on one rank);
    ``predicted``/``predicted_before``: what the fit and the price in use predict for the same micro-batches;
    ``ratio_range``: the least and largest ``b/a`` of four fits that each leave a quarter of the records out
    — how sure the price is (wide when the records hardly tell the linear price from the per-step constant:
    under a token budget every batch holds about as many tokens).
    """

    epoch: int
    price_before: tuple[float, float]
    fitted: tuple[float, float, float] | None
    price: tuple[float, float] | None
    error: float | None
    error_before: float | None
    applied: bool
    from_epoch: int | None
    records: int
    dropped: int
    measured: float | None
    predicted: float | None
    predicted_before: float | None
    reason: str
    ratio_range: tuple[float, float] | None = None

    def logs(self) -> dict[str, float]:
        """What a trainer logs of it, as ``rank_price/*`` floats — finite only (a trainer's state is JSON:
        ``inf``/``nan`` would be written as the non-standard ``Infinity``/``NaN``). The price ``(a, b)`` is
        logged as ``linear`` and ``quadratic``: ``(1, b/a)``, or ``(0, 1)`` for a purely quadratic fit."""
        logs = {"rank_price/applied": float(self.applied), "rank_price/records": float(self.records)}
        if self.price is not None:
            logs["rank_price/linear"], logs["rank_price/quadratic"] = self.price
            logs["rank_price/error"], logs["rank_price/error_before"] = self.error, self.error_before  # type: ignore[assignment]
        if self.measured is not None:
            logs["rank_price/measured_balance"] = self.measured
            logs["rank_price/predicted_balance"] = self.predicted  # type: ignore[assignment]
        return {key: float(value) for key, value in logs.items() if value is not None and math.isfinite(value)}

    def __str__(self) -> str:
        if self.fitted is None:
            return f"epoch {self.epoch}: rank price kept at {self.price_before} ({self.reason})"
        verb = f"applied from epoch {self.from_epoch}" if self.applied else "not applied"
        sure = ""
        if self.ratio_range is not None:
            sure = f"b/a between {self.ratio_range[0]:.3g} and {self.ratio_range[1]:.3g} leaving a quarter out; "
        balance = ""
        if self.measured is not None:
            balance = (
                f"; balance measured {self.measured:.3f}, predicted {self.predicted:.3f} by the fit, "
                f"{self.predicted_before:.3f} by the price in use"
            )
        return (
            f"epoch {self.epoch}: fitted rank price {self.price} {verb} ({sure}held-back error {self.error:.1%} "
            f"vs {self.error_before:.1%}; {self.records} micro-batches, {self.dropped} outliers){balance} — "
            f"{self.reason}"
        )


def decide(
    records: list[tuple[int, int, float, float, float]],
    before: tuple[float, float],
    epoch: int,
    margin: float,
    world: int,
) -> Calibration:
    """The fit of ``records`` and whether it replaces the price ``before`` (see the module docs)."""
    keep: dict[str, Any] = {"epoch": epoch, "price_before": before, "from_epoch": epoch + 1}
    if len(records) < MIN_RECORDS:
        return Calibration(
            **keep, fitted=None, price=None, error=None, error_before=None, applied=False, records=len(records),
            dropped=0, measured=None, predicted=None, predicted_before=None,
            reason=f"{len(records)} micro-batches recorded, fewer than the {MIN_RECORDS} a fit needs",
        )  # fmt: skip
    data = np.asarray(records, dtype=np.float64)
    x, x2, seconds = data[:, 2], data[:, 3], data[:, 4]
    fold = np.arange(len(data)) % 4
    held = fold == 3
    fit, _ = robust_fit(x[~held], x2[~held], seconds[~held])
    scaled, _ = robust_fit(x[~held], x2[~held], seconds[~held], price=before)
    error = _median_error(fit, x[held], x2[held], seconds[held])
    error_before = _median_error(scaled, x[held], x2[held], seconds[held])
    full, used_all = robust_fit(x, x2, seconds)
    a, b, c = full
    price = rank_price(a, b)
    applied = error < (1.0 - margin) * error_before and error_before - error > MIN_GAIN
    reason = (
        "it predicts held-back micro-batches better than the price in use"
        if applied
        else "it does not predict held-back micro-batches better than the price in use by the margin"
    )
    measured, predicted, predicted_before = _balance(data, full, before, world)
    ratios = [_ratio(robust_fit(x[fold != k], x2[fold != k], seconds[fold != k])[0]) for k in range(4)]
    return Calibration(
        **keep, fitted=(a, b, c), price=price, error=error, error_before=error_before, applied=applied,
        records=int(used_all.sum()), dropped=int((~used_all).sum()), measured=measured, predicted=predicted,
        predicted_before=predicted_before, reason=reason, ratio_range=(min(ratios), max(ratios)),
    )  # fmt: skip


#: The least and largest ``b/a`` a rank price may have (the planner's bounds on each of ``a`` and ``b``): below,
#: the price is linear at every length; above, quadratic.
RATIO_BOUNDS = (1e-12, 1e12)


def rank_price(a: float, b: float) -> tuple[float, float]:
    """The rank price of a fit's ``a·x + b·x²``, within what the planner takes: ``(1, b/a)``, ``(1, 0)`` when the
    quadratic part is negligible at any length, ``(0, 1)`` when the linear one is (attention-dominated timings
    fit ``a`` ≈ 0: ``(1, 5e13)`` would be refused as a ``rank_cost`` the user never set)."""
    if a <= 0 or b / a > RATIO_BOUNDS[1]:
        return (0.0, 1.0)
    ratio = b / a
    return (1.0, ratio if ratio >= RATIO_BOUNDS[0] else 0.0)


def _ratio(fit: tuple[float, float, float]) -> float:
    a, b, _ = fit
    return b / a if a > 0 else math.inf


def robust_fit(
    x: np.ndarray, x2: np.ndarray, seconds: np.ndarray, *, price: tuple[float, float] | None = None
) -> tuple[tuple[float, float, float], np.ndarray]:
    """``seconds ≈ c + a·x + b·x2`` by non-negative least squares over relative errors, refitted twice
    without the records off by more than :data:`OUTLIER_DEVIATIONS` median deviations; with ``price``
    ``(p, q)``, only a scale ``s`` and ``c`` are fitted (``a = s·p``, ``b = s·q``): the price in use, in
    seconds. Returns ``(a, b, c)`` and which records were kept."""
    kept = np.ones(len(seconds), dtype=bool)
    coefficients = (0.0, 0.0, 0.0)
    for _ in range(3):
        if price is None:
            columns = np.stack([x, x2, np.ones_like(x)], axis=1)
        else:
            columns = np.stack([price[0] * x + price[1] * x2, np.ones_like(x)], axis=1)
        w = _nonnegative_fit(columns[kept] / seconds[kept, None], np.ones(int(kept.sum())))
        fitted = columns @ w
        relative = np.abs(fitted - seconds) / seconds
        deviation = float(np.median(np.abs(relative[kept] - np.median(relative[kept]))))
        limit = np.median(relative[kept]) + OUTLIER_DEVIATIONS * max(deviation, 1e-3)
        again = relative <= limit
        coefficients = (float(w[0]), float(w[1]), float(w[2])) if price is None else (
            float(w[0] * price[0]), float(w[0] * price[1]), float(w[1]))  # fmt: skip
        if again.sum() < 3 or np.array_equal(again, kept):
            break
        kept = again
    return coefficients, kept


def _median_error(fit: tuple[float, float, float], x: np.ndarray, x2: np.ndarray, seconds: np.ndarray) -> float:
    a, b, c = fit
    return float(np.median(np.abs(c + a * x + b * x2 - seconds) / seconds))


def _balance(
    data: np.ndarray, fit: tuple[float, float, float], before: tuple[float, float], world: int
) -> tuple[float | None, float | None, float | None]:
    """Synchronous efficiency per micro-batch over the ordinals every rank recorded: measured, predicted by
    ``fit`` and by the price ``before`` (``None`` on one rank)."""
    if world < 2:
        return None, None, None
    ranks, ordinals = data[:, 0].astype(np.int64), data[:, 1].astype(np.int64)
    steps = int(min((ordinals[ranks == r].max() + 1) if np.any(ranks == r) else 0 for r in range(world)))
    if steps == 0:
        return None, None, None
    a, b, c = fit
    inside = ordinals < steps
    grid = np.zeros((3, steps, world))
    for row, rank, ordinal in zip(data[inside], ranks[inside], ordinals[inside], strict=True):
        grid[:, ordinal, rank] = (row[4], c + a * row[2] + b * row[3], before[0] * row[2] + before[1] * row[3])
    figures = [float(g.sum() / (world * g.max(axis=1).sum())) for g in grid]
    return figures[0], figures[1], figures[2]

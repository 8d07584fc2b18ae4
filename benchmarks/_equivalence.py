"""A two one-sided test (TOST) of paired differences: is a strategy's held-out loss equivalent to a full
shuffle's within a margin stated before the run?

The differences are one per seed (the seed fixes the model's init and the data's draws for both strategies,
so that part of the spread cancels). Their mean's 90% confidence interval (Student's t, n − 1 degrees of
freedom) decides: inside ``(−m, +m)`` is "equivalent within ±m" (both one-sided tests reject at 5%);
entirely above 0 is "worse" (by at least its lower end; "worse by at least m" once that passes the margin),
entirely below 0 "better"; anything else "inconclusive" — too few seeds or too much noise to say."""

from __future__ import annotations

import math
from collections.abc import Sequence

#: One-sided 95% quantiles of Student's t by degrees of freedom (1 to 30); beyond, the normal's 1.645.
T95 = (
    6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
    1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697,
)  # fmt: skip


def interval(differences: Sequence[float]) -> tuple[float, float, float]:
    """The mean of ``differences`` and its two-sided 90% confidence interval."""
    n = len(differences)
    if n < 2:
        raise ValueError(f"a confidence interval needs at least 2 paired differences, got {n}")
    mean = sum(differences) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1))
    half = (T95[n - 2] if n - 1 <= len(T95) else 1.645) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def verdict(differences: Sequence[float], margin: float) -> dict:
    """The TOST verdict of paired differences (strategy − reference, lower loss is better) at ``margin``."""
    if not margin > 0:
        raise ValueError(f"margin must be positive, got {margin}")
    mean, low, high = interval(differences)
    if -margin < low and high < margin:
        words = f"equivalent within ±{margin:.3f}"
    elif low > 0:
        words = f"worse by at least {low:.3f}" + (" (beyond the margin)" if low >= margin else "")
    elif high < 0:
        words = f"better by at least {-high:.3f}"
    else:
        words = "inconclusive"
    return {"mean": mean, "low": low, "high": high, "margin": margin, "n": len(differences), "verdict": words}

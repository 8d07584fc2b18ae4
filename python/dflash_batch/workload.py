"""The seed workload: sample lengths shaped like the DFlash dataset (see shared/CONTEXT.md).

Each sample draws its bin from the seed histogram's shares and its length log-uniformly inside the bin
(mean ≈ 2,277, median ≈ 1,726 tokens). Generated in fixed-size pieces so that 100M lengths need only
the 400 MB of the result, and reproducible from ``seed``.
"""

from __future__ import annotations

import numpy as np

#: (lowest, highest, share) of each bin.
SEED_BINS = ((64, 511, 0.054), (512, 1023, 0.192), (1024, 2047, 0.337), (2048, 4095, 0.283), (4096, 8192, 0.134))
#: Samples in the seed dataset.
SEED_SAMPLES = 902_087
_PIECE = 1 << 20


def seed_workload(n: int = SEED_SAMPLES, seed: int = 0) -> np.ndarray:
    """``n`` uint32 lengths of the seed workload."""
    if n < 0:
        raise ValueError(f"n={n} is invalid; n must be >= 0")
    rng = np.random.default_rng(seed)
    low = np.array([b[0] for b in SEED_BINS], dtype=np.float64)
    high = np.array([b[1] for b in SEED_BINS], dtype=np.float64)
    shares = np.array([b[2] for b in SEED_BINS])
    out = np.empty(n, dtype=np.uint32)
    for start in range(0, n, _PIECE):
        size = min(_PIECE, n - start)
        bins = rng.choice(len(SEED_BINS), size=size, p=shares / shares.sum())
        lo, hi = low[bins], high[bins]
        lengths = np.floor(lo * ((hi + 1) / lo) ** rng.random(size))
        out[start : start + size] = np.clip(lengths, lo, hi)
    return out

"""Windows of a stream against the global plan of the same data: what a window's size costs in padding, mixing
and rank balance, so a user can pick it from a table.

    python benchmarks/windows.py                          # 902,087 seed lengths, max_tokens=16384, 8 ranks × 4
    python benchmarks/windows.py --samples 3000000        # what the docs quote: 3 windows of 1M too
    python benchmarks/windows.py --samples 100000         # a quick look
    python benchmarks/windows.py --json docs/figures.json # also records the figures the docs quote

Every window of ``db.Windows`` is planned as its own epoch (``Windows.plan_window``, the call its iteration
makes); their batches, in training order, are scored as one epoch over the whole stream — padding efficiency,
``window_tv`` against the whole stream's lengths (windows of 32 batches: one optimizer step of 8 ranks × 4),
p99 rank imbalance and the end-to-end share per step — beside the global plan of the same lengths (what a
local tokenized file gets). Planning time is per window and per batch. Targets (issue 62): windows of 100K
samples within 0.01 of the global efficiency and 0.02 of its ``window_tv``.
"""

from __future__ import annotations

import argparse
import sys
import time

import dflash_batch as db
import dflash_batch._core as _core
import numpy as np
from _figures import command_of, write

MAX_TOKENS = 16384
WORLD = 8
ACCUMULATION = 4
SIZES = (10_000, 30_000, 100_000, 300_000, 1_000_000)
SETTINGS = {"max_tokens": MAX_TOKENS, "world_size": WORLD, "accumulation": ACCUMULATION}


def windowed(lengths: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """The windows' plans of pass 0 joined into one CSR over the stream's indices, and each window's planning
    seconds."""
    windows = db.Windows(lengths.tolist(), length=int, window=size, rank=0, **SETTINGS)
    offsets, indices, seconds, start, base = [np.zeros(1, np.int64)], [], [], 0, 0
    for k, examples in enumerate(windows.cut(iter(lengths.tolist()))):
        began = time.perf_counter()
        plan = windows.plan_window(examples, k, 0)
        seconds.append(time.perf_counter() - began)
        assert np.array_equal(np.sort(plan.indices), np.arange(len(examples))), "a window loses or repeats samples"
        assert len(plan) % WORLD == 0
        indices.append(plan.indices.astype(np.int64) + start)
        offsets.append(plan.offsets[1:].astype(np.int64) + base)
        start += len(examples)
        base += len(plan.indices)
    assert start == len(lengths)
    return np.concatenate(offsets).astype(np.uint32), np.concatenate(indices).astype(np.uint32), seconds


def scored(lengths: np.ndarray, offsets: np.ndarray, indices: np.ndarray) -> dict:
    window = WORLD * ACCUMULATION
    imbalance = _core.rank_imbalance(offsets, indices, lengths, WORLD, 1)
    end_to_end = _core.end_to_end(offsets, indices, lengths, WORLD, ACCUMULATION)
    return {
        "efficiency": _core.efficiency(offsets, indices, lengths),
        "window_tv": _core.window_tv(offsets, indices, lengths, window),
        "p99": imbalance[1] if imbalance else None,
        "end_to_end_step": end_to_end[1] if end_to_end else None,
        "batches": len(offsets) - 1,
    }


def collect(samples: int) -> dict:
    lengths = db.seed_workload(samples, seed=0)
    print(f"seed workload: {len(lengths):,} lengths; max_tokens={MAX_TOKENS}, {WORLD} ranks × {ACCUMULATION}")
    sampler = db.BucketSampler(lengths, rank=0, **SETTINGS)
    began = time.perf_counter()
    plan = sampler.plan(0)
    global_seconds = time.perf_counter() - began
    whole = {**scored(lengths, plan.offsets, plan.indices), "plan_ms": global_seconds * 1e3}
    print(
        f"{'window':>10} {'windows':>8} {'efficiency':>10} {'window_tv':>9} {'p99 imb':>8} {'e2e/step':>8} "
        f"{'ms/window':>9} {'µs/batch':>8}"
    )

    def row(name: str, figures: dict, windows: int, per_window_ms: float) -> None:
        per_batch = per_window_ms * windows * 1e3 / figures["batches"]
        print(
            f"{name:>10} {windows:>8} {figures['efficiency']:>10.4f} {figures['window_tv']:>9.4f} "
            f"{figures['p99']:>8.2f} {figures['end_to_end_step']:>8.3f} {per_window_ms:>9.1f} {per_batch:>8.2f}"
        )

    row("global", whole, 1, whole["plan_ms"])
    rows = {}
    for size in SIZES:
        if size > samples:
            continue
        offsets, indices, seconds = windowed(lengths, size)
        figures = scored(lengths, offsets, indices)
        figures.update(
            windows=len(seconds),
            window_ms=float(np.median(seconds)) * 1e3,
            efficiency_gap=whole["efficiency"] - figures["efficiency"],
            window_tv_gap=figures["window_tv"] - whole["window_tv"],
        )
        rows[str(size)] = figures
        row(f"{size:,}", figures, len(seconds), figures["window_ms"])
    at = rows.get("100000")
    if at is not None:
        met = at["efficiency_gap"] <= 0.01 and at["window_tv_gap"] <= 0.02
        print(
            f"\nwindows of 100,000: efficiency {at['efficiency_gap']:+.4f} below the global plan (target ≤ 0.01), "
            f"window_tv {at['window_tv_gap']:+.4f} above it (target ≤ 0.02): {'MET' if met else 'MISSED'}"
        )
    return {"samples": samples, "global": whole, "windows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=db.SEED_SAMPLES)
    parser.add_argument("--json", metavar="FILE", help="record the figures under 'windows' of FILE")
    given = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(given)
    write(args.json, "windows", collect(args.samples), command_of("windows.py", given))
    return 0


if __name__ == "__main__":
    sys.exit(main())

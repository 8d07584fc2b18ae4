"""Efficiency and mixing at once, and the rank-balance frontier, on the seed workload.

    python benchmarks/mixing.py               # 902,087 lengths, max_tokens=16384, 8 ranks × 4 micro-batches
    python benchmarks/mixing.py --samples 50000 --repeats 3   # a quick look

Part 1 scores the default sampler against the issue's targets (efficiency ≥ 0.98, window_tv ≤ 0.075,
churn ≤ 0.002, planning ≤ 15 ms per epoch, p99 rank imbalance ≤ 1.10), next to HF-style mega-batch
sorting and the seed's 6 buckets measured in the same run. Part 2 prints the frontier that
``balance_tolerance`` walks: window_tv against p99 rank imbalance (padded tokens), with planning time.
Every plan is checked first (every sample once, within budget).
"""

from __future__ import annotations

import argparse
import os

import dflash_batch as db
import numpy as np
from _timing import timings
from dflash_batch import baselines, metrics

MAX_TOKENS = 16384
WORLD = 8
ACCUMULATION = 4
TOLERANCES = (None, 0.6, 0.4, 0.3, 0.2, 0.15, 0.1, 0.05)


def check(lengths: np.ndarray, plan: db.Plan) -> None:
    assert np.array_equal(np.sort(plan.indices), np.arange(len(lengths))), "plan loses or repeats samples"
    sizes = np.diff(plan.offsets)
    longest = np.maximum.reduceat(lengths[plan.indices], plan.offsets[:-1].astype(np.int64))
    assert np.all(sizes * longest.astype(np.int64) <= MAX_TOKENS), "batch over budget"


def scored(lengths: np.ndarray, tolerance: float | None, repeats: int) -> dict:
    sampler = db.BucketSampler(
        lengths,
        max_tokens=MAX_TOKENS,
        world_size=WORLD,
        rank=0,
        accumulation=ACCUMULATION,
        balance_tolerance=tolerance,
    )
    first, second = sampler.plan(0), sampler.plan(1)
    check(lengths, first)
    stats = first.stats()
    median, best = timings(lambda i: sampler.plan(i + 2), repeats)
    return {
        "efficiency": stats["efficiency"],
        "window_tv": stats["window_tv"],
        "churn": first.churn(second),
        "p50": stats["rank_imbalance_p50"],
        "p99": stats["rank_imbalance_p99"],
        "steps": stats["steps"],
        "median_ms": median * 1e3,
        "best_ms": best * 1e3,
        "buckets": stats["buckets"],
    }


def baseline(lengths: np.ndarray, epochs: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    order, offsets = epochs[0]
    imbalance = metrics.rank_imbalance(lengths, order, offsets, WORLD)
    return {
        "efficiency": baselines.efficiency(lengths, order, offsets),
        "window_tv": metrics.window_tv(lengths, order, offsets, WORLD * ACCUMULATION),
        "churn": metrics.churn(len(lengths), epochs[0], epochs[1]),
        "p99": imbalance[1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=db.SEED_SAMPLES)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()

    lengths = db.seed_workload(args.samples, seed=0)
    window = WORLD * ACCUMULATION
    print(
        f"seed workload: {len(lengths):,} lengths; max_tokens={MAX_TOKENS}, world_size={WORLD}, "
        f"accumulation={ACCUMULATION} (windows of {window} batches), cores={os.cpu_count()}"
    )

    default = scored(lengths, None, args.repeats)
    rule = {"max_tokens": MAX_TOKENS}
    megabatch = [baselines.cut(lengths, baselines.megabatch_sorted(lengths, 8, seed=s), **rule) for s in (0, 1)]
    seed_buckets = [baselines.seed_bucketed(lengths, **rule, seed=s) for s in (0, 1)]
    rows = [
        ("dflash_batch (defaults)", default),
        ("HF mega-batch sorting", baseline(lengths, megabatch)),
        ("seed's 6 buckets", baseline(lengths, seed_buckets)),
    ]
    print(f"\n{'strategy':<26} {'efficiency':>10} {'window_tv':>10} {'churn':>8} {'p99 imbalance':>14}")
    for name, r in rows:
        print(f"{name:<26} {r['efficiency']:>10.4f} {r['window_tv']:>10.4f} {r['churn']:>8.4f} {r['p99']:>14.3f}")
    print(f"(dflash_batch: {default['buckets']} buckets, {default['steps']:,} steps per rank)")

    ok = lambda met: "MET" if met else "MISSED"  # noqa: E731
    d = default
    print("\ntargets at the defaults (one run; planning median, best in brackets)")
    print(f"  efficiency ≥ 0.98:          {d['efficiency']:.4f}  {ok(d['efficiency'] >= 0.98)}")
    print(f"  window_tv ≤ 0.075:          {d['window_tv']:.4f}  {ok(d['window_tv'] <= 0.075)}")
    print(f"  churn ≤ 0.002:              {d['churn']:.4f}  {ok(d['churn'] <= 0.002)}")
    print(f"  planning ≤ 15 ms per epoch: {d['median_ms']:.1f} ms [{d['best_ms']:.1f}]  {ok(d['median_ms'] <= 15)}")
    print(f"  p99 rank imbalance ≤ 1.10:  {d['p99']:.3f}  {ok(d['p99'] <= 1.10)}")
    if d["p99"] > 1.10:
        print(
            "    why: a full batch of k rows of length L costs k·L, fixed by its samples (two rows of 5.5K "
            "tokens cost 0.67 of the budget); steps can only be matched from batches of similar cost. "
            "Inside a window that leaves mixing untouched (the default); reaching 1.10 means grouping "
            "similar costs across windows, and the cheap ones are all long: see the frontier below."
        )

    print("\nfrontier: balance_tolerance vs mixing (same workload and settings)")
    print(f"{'balance_tolerance':>18} {'window_tv':>10} {'p50':>7} {'p99':>7} {'median ms':>10} {'best ms':>8}")
    for tolerance in TOLERANCES:
        r = default if tolerance is None else scored(lengths, tolerance, max(3, args.repeats // 3))
        name = "None (default)" if tolerance is None else f"{tolerance:g}"
        print(
            f"{name:>18} {r['window_tv']:>10.4f} {r['p50']:>7.3f} {r['p99']:>7.3f} "
            f"{r['median_ms']:>10.1f} {r['best_ms']:>8.1f}"
        )


if __name__ == "__main__":
    main()

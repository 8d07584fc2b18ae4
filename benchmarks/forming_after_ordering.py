"""A study for issue 18, not the library's behaviour: would forming after ordering raise synchronous
efficiency? Measured as a post-pass over today's plans, in numpy.

    python benchmarks/forming_after_ordering.py                    # seed workload, accumulation 1 and 4
    python benchmarks/forming_after_ordering.py --samples 100000   # quicker
    python benchmarks/forming_after_ordering.py --attention        # priced a·L + b·L², b = 1/30720

The construction: a step's batches are trimmed to a common cost ``T`` (rows dropped from the end of each
batch until its cost is at most ``T``), with ``T`` chosen per step among its batch costs to minimise
``world_size × max(kept costs) + moved cost / e`` (``e``: the synchronous efficiency assumed for the
extra steps the moved rows make; ``--extra-sync``), trimming only where that beats the step as it is.
Trimmed rows are re-formed per bucket within the budget, the new batches sorted by cost, split until
they fill whole steps (as the planner's split stage does), and appended as extra steps. Every sample
stays in the plan exactly once (asserted); the figures are scored by ``db.metrics``. What it does not
do yet: spread the extra steps through the epoch or mix buckets in them (``window_tv`` pays for that),
or keep the epoch's step count fixed.
"""

from __future__ import annotations

import argparse

import dflash_batch as db
import dflash_batch.metrics as metrics
import numpy as np

BUDGET = 16384
WORLD = 8


def study(lengths: np.ndarray, accumulation: int, b: float, extra_sync: float) -> dict:
    cost_model = (1.0, b) if b else "tokens"
    sampler = db.BucketSampler(
        lengths, max_tokens=BUDGET, world_size=WORLD, rank=0, accumulation=accumulation, cost=cost_model
    )
    plan = sampler.plan(0)
    edges = np.asarray(sampler.edges)
    offsets = plan.offsets.astype(np.int64)
    batches = [list(plan.indices[offsets[k] : offsets[k + 1]]) for k in range(len(offsets) - 1)]

    def cost(rows: list) -> float:
        longest = float(lengths[rows].max())
        return len(rows) * (longest + b * longest * longest)

    def trimmed(rows: list, target: float) -> tuple[list, list]:
        kept, moved = list(rows), []
        while len(kept) > 1 and cost(kept) > target:
            moved.append(kept.pop())
        return kept, moved

    out, leftovers = [], {}
    for start in range(0, len(batches), WORLD):
        step = batches[start : start + WORLD]
        costs = [cost(rows) for rows in step]
        best, target = WORLD * max(costs), None
        for candidate in sorted(set(costs)):
            kept = [cost(trimmed(rows, candidate)[0]) for rows in step]
            score = WORLD * max(kept) + (sum(costs) - sum(kept)) / extra_sync
            if score < best - 1e-9:
                best, target = score, candidate
        for rows in step:
            kept, moved = (rows, []) if target is None else trimmed(rows, target)
            out.append(kept)
            for r in moved:
                leftovers.setdefault(int(np.searchsorted(edges, lengths[r])), []).append(r)
    extra = []
    for _, rows in sorted(leftovers.items()):
        current: list = []
        for r in rows:
            if current and cost([*current, r]) > BUDGET:
                extra.append(current)
                current = []
            current.append(r)
        if current:
            extra.append(current)
    while len(extra) % WORLD:
        big = max(range(len(extra)), key=lambda k: (len(extra[k]) > 1, cost(extra[k])))
        rows = extra.pop(big)
        extra += [rows[: len(rows) // 2], rows[len(rows) // 2 :]]
    extra.sort(key=cost)
    every = out + extra
    order = np.concatenate([np.asarray(rows, dtype=np.int64) for rows in every])
    new_offsets = np.cumsum([0] + [len(rows) for rows in every])
    assert np.array_equal(np.sort(order), np.arange(len(lengths))), "a sample lost or repeated"
    price = {} if not b else {"cost": (1.0, b)}
    before = metrics.sync_efficiency(lengths, plan.indices, offsets, WORLD, accumulation, **price)
    after = metrics.sync_efficiency(lengths, order, new_offsets, WORLD, accumulation, **price)
    window = WORLD * accumulation
    return {
        "batches": (len(batches), len(every)),
        "efficiency": (
            metrics.efficiency(lengths, plan.indices, offsets),
            metrics.efficiency(lengths, order, new_offsets),
        ),
        "sync": (before[0], after[0]),
        "sync_step": (before[1], after[1]),
        "window_tv": (
            metrics.window_tv(lengths, plan.indices, offsets, window),
            metrics.window_tv(lengths, order, new_offsets, window),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=db.SEED_SAMPLES)
    parser.add_argument("--accumulation", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--attention", action="store_true", help="price batches a·L + b·L², b = 1/30720")
    parser.add_argument("--extra-sync", type=float, default=0.97)
    args = parser.parse_args()
    lengths = db.seed_workload(args.samples)
    b = 1 / 30720 if args.attention else 0.0
    print(f"seed workload: {len(lengths):,} lengths, max_tokens={BUDGET}, {WORLD} ranks, price b={b:.3g}")
    heads = ("efficiency", "sync/micro", "sync/step", "window_tv")
    print(f"{'accumulation':>12} {'batches':>17} " + " ".join(f"{h:>13}" for h in heads))
    for accumulation in args.accumulation:
        r = study(lengths, accumulation, b, args.extra_sync)
        cells = [f"{r['batches'][0]:,}→{r['batches'][1]:,}"] + [
            f"{r[k][0]:.3f}→{r[k][1]:.3f}" for k in ("efficiency", "sync", "sync_step", "window_tv")
        ]
        print(f"{accumulation:>12} {cells[0]:>17} " + " ".join(f"{c:>13}" for c in cells[1:]))


if __name__ == "__main__":
    main()

"""One RL step's rollouts split into every rank's micro-batches: ``db.split_step`` against the two ways RL
frameworks do it today, on rollout-like lengths.

    python benchmarks/online_step.py                      # 4,096 sequences, 8 ranks, 20 steps per distribution
    python benchmarks/online_step.py --json docs/figures.json

Each step's lengths are prompts (64–1,024 tokens) plus responses drawn from one of three shapes: ``grpo``
(lognormal responses around 600 tokens), ``reasoning`` (lognormal around 3,000, a tenth cut at the 16,384-token
cap) and ``mixed`` (half short answers, half long reasoning). Every way gets the same budget — 65,536 padded
tokens a micro-batch — and is scored under an attention price (a row of length ``L`` costs ``L + L²/(6·5120)``):

* **dflash_batch**: ``db.split_step(lengths, world_size=8, max_tokens=65536, cost=price)``, in Rust;
* **karmarkar_karp**: what verl does, written here from the method (Karmarkar & Karp 1982; equal counts
  per rank by differencing groups of one sequence per rank): sequences to ranks by largest differencing of their
  token counts, then each rank's sequences into micro-batches longest first under the budget; the ranks run as
  many micro-batches as the rank with the most (the others wait through empty ones);
* **greedy**: longest first, each sequence to the rank with the fewest tokens so far, then micro-batches as above.

Per way, over the steps (median): the most loaded rank's cost over the mean (``imbalance``), the share of time
ranks spend working when every micro-batch is a collective (``lockstep``: Σ mean over ranks of the j-th
micro-batch's cost / Σ its max, an empty micro-batch costing nothing), ``useful`` (each rank's share of the
sequences' own cost, no padding, over that lockstep time: padding and waiting together), micro-batches per
rank, and the time to split one step (one core). Every split is checked first: every sequence once, no
micro-batch over the budget.
"""

from __future__ import annotations

import argparse
import heapq
import sys
import time

import dflash_batch as db
import numpy as np
from _figures import command_of, write

WORLD = 8
BUDGET = 65536
CAP = 16384
PRICE = (1.0, 1.0 / (6 * 5120))


def rollouts(shape: str, n: int, rng: np.random.Generator) -> np.ndarray:
    prompts = rng.integers(64, 1025, n)
    if shape == "grpo":
        responses = rng.lognormal(np.log(600), 0.8, n)
    elif shape == "reasoning":
        responses = rng.lognormal(np.log(3000), 0.9, n)
    else:
        responses = np.where(
            rng.random(n) < 0.5, rng.lognormal(np.log(150), 0.7, n), rng.lognormal(np.log(4000), 0.7, n)
        )
    return np.minimum(prompts + responses.astype(np.int64), CAP).astype(np.int64)


def row_cost(length: float) -> float:
    return PRICE[0] * length + PRICE[1] * length * length


def micro_batches(lengths: np.ndarray, seqs: list[int]) -> list[list[int]]:
    """A rank's sequences into padded micro-batches, longest first, while rows × longest fits the budget."""
    out: list[list[int]] = []
    longest = 0
    for i in sorted(seqs, key=lambda i: -lengths[i]):
        if out and (len(out[-1]) + 1) * longest <= BUDGET:
            out[-1].append(i)
        else:
            longest = int(lengths[i])
            out.append([i])
    return out


def karmarkar_karp(lengths: np.ndarray, k: int) -> list[list[int]]:
    """Sequences to ``k`` ranks, equal counts, by largest differencing of token counts: sorted sequences taken
    ``k`` at a time form a partial partition (one sequence per rank); the two partial partitions with the
    largest spread are merged — the heaviest subset of one with the lightest of the other — until one is left."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    pad = (-len(order)) % k
    order += [-1] * pad  # placeholders of no tokens, so every group has one per rank
    heap = []
    for g in range(0, len(order), k):
        group = order[g : g + k]
        subsets = [(float(lengths[i]) if i >= 0 else 0.0, [i] if i >= 0 else []) for i in group]
        subsets.sort(key=lambda s: -s[0])
        heapq.heappush(heap, (-(subsets[0][0] - subsets[-1][0]), g, subsets))
    while len(heap) > 1:
        _, g1, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(x[0] + y[0], x[1] + y[1]) for x, y in zip(a, reversed(b), strict=True)]
        merged.sort(key=lambda s: -s[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), g1, merged))
    return [s[1] for s in heap[0][2]]


def greedy(lengths: np.ndarray, k: int) -> list[list[int]]:
    ranks: list[list[int]] = [[] for _ in range(k)]
    loads = [(0, r) for r in range(k)]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        load, r = heapq.heappop(loads)
        ranks[r].append(i)
        heapq.heappush(loads, (load + int(lengths[i]), r))
    return ranks


def scored(lengths: np.ndarray, ranks: list[list[list[int]]], seconds: float) -> dict:
    seen = sorted(i for rank in ranks for b in rank for i in b)
    assert seen == list(range(len(lengths))), "a sequence lost or repeated"
    assert all(len(b) * max(lengths[i] for i in b) <= BUDGET for rank in ranks for b in rank), "over budget"
    costs = [[len(b) * row_cost(max(lengths[i] for i in b)) for b in rank] for rank in ranks]
    loads = [sum(c) for c in costs]
    steps = max(len(c) for c in costs)
    padded = [c + [0.0] * (steps - len(c)) for c in costs]
    per_step = list(zip(*padded, strict=True))
    useful = sum(row_cost(float(v)) for v in lengths) / len(ranks)  # each rank's share, no padding, no wait
    return {
        "imbalance": max(loads) / (sum(loads) / len(loads)),
        "lockstep": sum(sum(s) / len(s) for s in per_step) / sum(max(s) for s in per_step),
        "useful": useful / sum(max(s) for s in per_step),
        "micro_batches": steps,
        "equal_counts": len({len(c) for c in costs}) == 1,
        "ms": seconds * 1e3,
    }


def timed(fn) -> tuple[object, float]:
    began = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - began


def collect(n: int, steps: int) -> dict:
    rng = np.random.default_rng(0)
    figures: dict = {"sequences": n, "world_size": WORLD, "max_tokens": BUDGET, "steps": steps, "shapes": {}}
    print(f"{n:,} sequences a step, {WORLD} ranks, {BUDGET:,} padded tokens a micro-batch, {steps} steps a shape")
    head = ("shape", "way", "imbalance", "lockstep", "useful", "µbatches", "equal", "ms")
    print("{:<10} {:<15} {:>9} {:>8} {:>7} {:>8} {:>6} {:>8}".format(*head))
    for shape in ("grpo", "reasoning", "mixed"):
        rows: dict[str, list[dict]] = {"dflash_batch": [], "karmarkar_karp": [], "greedy": []}
        for _ in range(steps):
            lengths = rollouts(shape, n, rng)
            split, s = timed(
                lambda lengths=lengths: db.split_step(lengths, world_size=WORLD, max_tokens=BUDGET, cost=PRICE)
            )
            ranks = [[b.tolist() for b in rank] for rank in split.ranks]
            rows["dflash_batch"].append(scored(lengths, ranks, s))
            for name, assign in (("karmarkar_karp", karmarkar_karp), ("greedy", greedy)):
                ranks, s = timed(
                    lambda lengths=lengths, assign=assign: [micro_batches(lengths, r) for r in assign(lengths, WORLD)]
                )
                rows[name].append(scored(lengths, ranks, s))
        figures["shapes"][shape] = {}
        for name, runs in rows.items():
            keys = ("imbalance", "lockstep", "useful", "micro_batches", "ms")
            med = {key: float(np.median([r[key] for r in runs])) for key in keys}
            med["equal_counts"] = all(r["equal_counts"] for r in runs)
            figures["shapes"][shape][name] = med
            print(
                f"{shape:<10} {name:<15} {med['imbalance']:>9.4f} {med['lockstep']:>8.3f} {med['useful']:>7.3f} "
                f"{med['micro_batches']:>8.0f} {med['equal_counts']!s:>6} {med['ms']:>8.2f}"
            )
    best = min(figures["shapes"][s]["dflash_batch"]["ms"] for s in figures["shapes"])
    worst = max(figures["shapes"][s]["dflash_batch"]["ms"] for s in figures["shapes"])
    print(f"\ndb.split_step: {best:.2f}–{worst:.2f} ms a step of {n:,} (target ≤ 1 ms for 4,096 on one core)")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", metavar="FILE", help="record the figures under 'online_step' of FILE")
    given = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(given)
    write(args.json, "online_step", collect(args.sequences, args.steps), command_of("online_step.py", given))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Mixture schedules (issue 63 part 1): weights that change from epoch to epoch, measured epoch by epoch.

The seed workload split into four sources (``db.seed_mixture``: chat, code, math, safety — 40/30/20/10 of
the samples, code the longest), 8 ranks × 4 micro-batches, ``max_tokens=16384``, weights in tokens. The
schedule moves from 0.3/0.3/0.25/0.15 (``benchmarks/mixing.py``'s fixed weights) at epoch 0 to
0.1/0.45/0.25/0.2 at epoch 4, linearly, then holds; a constant variant jumps at epoch 2 and 4. For each
epoch of padded and packed plans:

* ``source_tv`` against the weights in force that epoch (per optimizer step's window, ½ Σ |share − weight|,
  the mean over windows), and its p99 over windows;
* the largest gap between a source's tokens and its quota for the epoch's weights (≤ one sample);
* efficiency (padded) or fill (packed), batches per epoch (the same every epoch) and re-forming passes;
* planning time per epoch against the same mixture with fixed weights, in the same run.

And the cycles, in samples (where a cycle's size is a count of rows): 'chat' down-sampled from 0.3 to 0.05 of
the samples over the run, every epoch's 'chat' rows tracked against the walk the docs state — rows repeated
within a cycle (target 0) and rows a cycle left behind when the next slice did not fit (< that slice).

    python benchmarks/schedules.py [--samples N] [--json docs/figures.json]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

import dflash_batch as db
import numpy as np
from _figures import command_of, write
from _timing import timings

MAX_TOKENS, WORLD, ACCUMULATION = 16384, 8, 4
NAMES = ("chat", "code", "math", "safety")
FIRST = {"chat": 0.3, "code": 0.3, "math": 0.25, "safety": 0.15}
LAST = {"chat": 0.1, "code": 0.45, "math": 0.25, "safety": 0.2}
MIDDLE = {"chat": 0.2, "code": 0.35, "math": 0.3, "safety": 0.15}
SCHEDULES = {
    "linear": ({4: LAST}, "linear"),
    "constant": ({2: MIDDLE, 4: LAST}, "constant"),
}
EPOCHS = 7


def sampler_of(mix: db.Mixture, mode: str) -> db.BucketSampler:
    return db.BucketSampler(mix, max_tokens=MAX_TOKENS, world_size=WORLD, rank=0, accumulation=ACCUMULATION, mode=mode)


def quota(size: int, weights: list[float]) -> np.ndarray:
    """Largest-remainder shares of ``size`` by ``weights`` (the rule the planner states)."""
    w = np.asarray(weights, dtype=np.float64)
    exact = size * w / w.sum()
    shares = np.floor(exact).astype(np.int64)
    order = sorted((i for i in range(len(w)) if w[i] > 0), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in order[: size - int(shares.sum())]:
        shares[i] += 1
    return shares


def window_p99(mix: db.Mixture, plan: db.Plan, weights: list[float]) -> float:
    """The p99 over optimizer-step windows of ½ Σ |token share − weight|."""
    window = WORLD * ACCUMULATION
    offsets = plan.offsets.astype(np.int64)
    windows = (len(offsets) - 1) // window
    lengths = mix.lengths()[plan.indices].astype(np.float64)
    source = mix.source_of(plan.indices)
    batch = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    keep = batch < windows * window
    mass = np.zeros((windows, len(NAMES)))
    np.add.at(mass, (batch[keep] // window, source[keep]), lengths[keep])
    shares = mass / mass.sum(axis=1, keepdims=True)
    return float(np.percentile(0.5 * np.abs(shares - np.asarray(weights)).sum(axis=1), 99))


def epochs_of(mix: db.Mixture, mode: str) -> dict:
    """Each epoch's figures against its own weights."""
    sampler = sampler_of(mix, mode)
    lengths = mix.lengths().astype(np.int64)
    size = int(lengths.sum())
    rows = []
    for epoch in range(EPOCHS):
        plan = sampler.plan(epoch)
        stats = plan.stats()
        weights = [mix.weights_at(epoch)[n] for n in NAMES]
        got = np.bincount(mix.source_of(plan.indices), weights=lengths[plan.indices], minlength=len(NAMES))
        gap = int(np.abs(got - quota(size, weights)).max())
        assert gap <= int(lengths.max()), f"epoch {epoch}: a source's tokens off its quota by {gap}"
        rows.append(
            {
                "epoch": epoch,
                "weights": weights,
                "source_tv": stats["source_tv"],
                "source_tv_p99": window_p99(mix, plan, weights),
                "share_gap": gap,
                "efficiency": stats["utilization"] if mode == "packed" else stats["efficiency"],
                "batches": len(plan.offsets) - 1,
                "reformed": stats["reformed"],
            }
        )
    return {
        "epochs": rows,
        "source_tv_max": max(r["source_tv"] for r in rows),
        "source_tv_mean": float(np.mean([r["source_tv"] for r in rows])),
        "source_tv_p99_max": max(r["source_tv_p99"] for r in rows),
        "share_gap_max": max(r["share_gap"] for r in rows),
        "efficiency_min": min(r["efficiency"] for r in rows),
        "batches": sorted({r["batches"] for r in rows}),
    }


def cycles(parts: dict) -> dict:
    """In samples: 'chat' from 0.3 of the samples to 0.05 (linear over 6 epochs), every epoch's 'chat' rows
    checked against the walk: repeats within a cycle, and what each cycle left behind."""
    first = {"chat": 0.3, "code": 0.3, "math": 0.25, "safety": 0.15}
    last = {"chat": 0.05, "code": 0.4, "math": 0.3, "safety": 0.25}
    mix = db.Mixture(
        {n: (parts[n], first[n]) for n in NAMES}, unit="samples", schedule={6: last}, interpolation="linear"
    )
    sampler = sampler_of(mix, "padded")
    chat_rows, epochs = len(parts["chat"]), 14
    rests = [int(quota(len(mix), [mix.weights_at(e)[n] for n in NAMES])[0]) for e in range(epochs)]
    cycle, at, of_epoch = 0, 0, []
    for rest in rests:
        if at + rest > chat_rows:
            cycle, at = cycle + 1, 0
        of_epoch.append(cycle)
        at += rest
    seen: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for epoch in range(epochs):
        plan = sampler.plan(epoch)
        chat = np.asarray(plan.indices)[mix.source_of(plan.indices) == 0]
        seen[of_epoch[epoch]].update(chat.tolist())
    repeated = sum(c - 1 for counter in seen.values() for c in counter.values() if c > 1)
    left = [chat_rows - len(seen[c]) for c in range(of_epoch[-1])]
    slices = [rests[of_epoch.index(c + 1)] for c in range(of_epoch[-1])]
    print(
        f"\ncycles ('chat', {chat_rows:,} rows, slices {rests[0]:,} → {rests[-1]:,} rows an epoch over {epochs} "
        f"epochs, {of_epoch[-1] + 1} cycles): rows repeated within a cycle {repeated}; rows left at each cycle's "
        f"end {left} (each under the slice that did not fit: {slices})"
    )
    assert all(a < b for a, b in zip(left, slices, strict=True))
    return {"repeated": repeated, "left": left, "slices": slices, "rests": rests, "cycles": of_epoch[-1] + 1}


def collect(samples: int, repeats: int) -> dict:
    """Every figure of the module docs, printed as it goes."""
    parts = db.seed_mixture(samples, seed=0)
    print(
        f"seed workload as 4 sources: {', '.join(f'{n} {len(parts[n]):,}' for n in NAMES)}; {WORLD} ranks × "
        f"{ACCUMULATION}, max_tokens={MAX_TOKENS}, weights in tokens, cores={os.cpu_count()}"
    )
    figures: dict = {"samples": samples}
    fixed = db.Mixture({n: (parts[n], FIRST[n]) for n in NAMES})
    for mode in ("padded", "packed"):
        base = sampler_of(fixed, mode)
        base_ms = timings(lambda i, s=base: s.plan(i + 1), repeats)[0] * 1e3
        for name, (points, interpolation) in SCHEDULES.items():
            mix = db.Mixture({n: (parts[n], FIRST[n]) for n in NAMES}, schedule=points, interpolation=interpolation)
            row = epochs_of(mix, mode)
            sampler = sampler_of(mix, mode)
            sampler.plan(0)  # the shared step count, once
            ms = timings(lambda i, s=sampler: s.plan(i % EPOCHS + 1), repeats)[0] * 1e3
            row |= {"plan_ms": ms, "fixed": {"plan_ms": base_ms}, "ratio": ms / base_ms}
            figures[f"{mode}_{name}"] = row
            show(f"{mode}, {name} schedule ({interpolation}; points {points})", row)
    figures["cycles"] = cycles(parts)
    worst = max(v["source_tv_max"] for k, v in figures.items() if k not in ("cycles", "samples"))
    print(
        f"\ntarget: per-step source TV ≤ 0.03 against the weights in force — worst epoch {worst:.4f} "
        f"{'MET' if worst <= 0.03 else 'MISSED'}; rows twice within a cycle: {figures['cycles']['repeated']}"
    )
    return figures


def show(title: str, row: dict) -> None:
    print(f"\n{title}:")
    print(
        f"  {'epoch':>5} {'weights':<24} {'source_tv':>9} {'p99':>6} {'gap tok':>8} {'eff/fill':>8} "
        f"{'batches':>7} {'reformed':>8}"
    )
    for r in row["epochs"]:
        w = "/".join(f"{x:.3f}" for x in r["weights"])
        print(
            f"  {r['epoch']:>5} {w:<24} {r['source_tv']:>9.4f} {r['source_tv_p99']:>6.3f} "
            f"{r['share_gap']:>8,} {r['efficiency']:>8.4f} {r['batches']:>7} {r['reformed']:>8}"
        )
    print(
        f"  planning {row['plan_ms']:.1f} ms an epoch, {row['ratio']:.2f}× fixed weights "
        f"({row['fixed']['plan_ms']:.1f} ms) in this run"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=db.SEED_SAMPLES)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", metavar="FILE", help="record the figures under 'schedules' of FILE")
    args = parser.parse_args()
    figures = collect(args.samples, args.repeats)
    write(args.json, "schedules", figures, command_of("schedules.py", sys.argv[1:]))


if __name__ == "__main__":
    main()

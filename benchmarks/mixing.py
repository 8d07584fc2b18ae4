"""Efficiency and mixing at once, and the rank-balance frontier, on the seed workload.

    python benchmarks/mixing.py               # 902,087 lengths, max_tokens=16384, 8 ranks × 4 micro-batches
    python benchmarks/mixing.py --samples 50000 --repeats 3   # a quick look
    python benchmarks/mixing.py --json docs/figures.json      # also records the figures the docs quote

Part 1 scores the default sampler against the issue's targets (efficiency ≥ 0.97, window_tv ≤ 0.075,
churn ≤ 0.002, planning ≤ 15 ms per epoch, p99 rank imbalance ≤ 1.10), next to HF-style mega-batch
sorting and the seed's 6 buckets measured in the same run. Part 2 prints the frontier that
``balance_tolerance`` walks: window_tv against p99 rank imbalance and synchronous efficiency, with planning
time. Part 3 is synchronous efficiency — the share of GPU time spent on work when ranks wait for the
slowest every micro-batch (FSDP / ZeRO-3) or every optimizer step (DDP with ``no_sync``) — for the
configurations people run, against its targets, with sorted static batches as the reference (≈ 1).
Part 3 also scores ``trim_steps=True`` beside the settings it applies to: batches added and planning time.
Part 5 plans mixtures of four sources against their targets, beside Megatron's greedy blending and HF
``interleave_datasets`` (``_mixtures.py``).
Every plan is checked first (every sample once, within budget).
"""

from __future__ import annotations

import argparse
import os

import _mixtures
import dflash_batch as db
import numpy as np
from _figures import write
from _timing import timings
from dflash_batch.tools import baselines, metrics

MAX_TOKENS = 16384
WORLD = 8
ACCUMULATION = 4
#: The padding efficiency the default padded plan must reach: its target since padded batches aim for 0.97
#: (wider buckets, for optimizer steps nearer a shuffle's: docs/convergence.md); 0.98 before.
EFFICIENCY = 0.97
TOLERANCES = (None, 0.6, 0.4, 0.3, 0.2, 0.15, 0.1, 0.05)
#: An attention-aware price per row, a·L + b·L² with b = 1/(6 · 5120): a 27B-class width.
ATTENTION = (1.0, 1.0 / (6 * 5120))


def check_all(lengths: np.ndarray, plan: db.Plan) -> None:
    """Every sample once: a benchmark of a wrong plan measures nothing (packed plans have their own budget)."""
    assert np.array_equal(np.sort(plan.indices), np.arange(len(lengths))), "plan loses or repeats samples"


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
        "sync": stats["sync_efficiency"],
        "sync_step": stats["sync_efficiency_step"],
        "end_to_end": stats["end_to_end_efficiency"],
        "end_to_end_step": stats["end_to_end_efficiency_step"],
    }


def baseline(lengths: np.ndarray, epochs: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    order, offsets = epochs[0]
    imbalance = metrics.rank_imbalance(lengths, order, offsets, WORLD)
    return {
        "efficiency": baselines.efficiency(lengths, order, offsets),
        "window_tv": metrics.window_tv(lengths, order, offsets, WORLD * ACCUMULATION),
        "churn": metrics.churn(len(lengths), epochs[0], epochs[1]),
        "p99": imbalance[1],
        **dict(
            zip(
                ("sync", "sync_step"),
                metrics.sync_efficiency(lengths, order, offsets, WORLD, ACCUMULATION),
                strict=True,
            )
        ),
        **dict(
            zip(
                ("end_to_end", "end_to_end_step"),
                metrics.end_to_end(lengths, order, offsets, WORLD, ACCUMULATION),
                strict=True,
            )
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=db.SEED_SAMPLES)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--json", metavar="FILE", help="record the figures under 'mixing' of FILE")
    parser.add_argument("--no-peers", action="store_true", help="skip HF's BatchRebalanceSampler (slow: seconds)")
    args = parser.parse_args()
    figures = collect(args.samples, args.repeats, not args.no_peers)
    write(
        args.json,
        "mixing",
        figures,
        "python benchmarks/mixing.py" + ("" if args.samples == db.SEED_SAMPLES else f" --samples {args.samples}"),
    )


def collect(samples: int, repeats: int, peers: bool = True) -> dict:
    """Every figure this benchmark prints, printed as it goes; planning times are the keys ending in
    ``_ms`` (the rest is the same in every run)."""
    args = argparse.Namespace(samples=samples, repeats=repeats)

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
    shuffled = [baselines.cut(lengths, np.random.default_rng(s).permutation(len(lengths)), **rule) for s in (0, 1)]
    rows = [
        ("dflash_batch (defaults)", default),
        ("HF mega-batch sorting", baseline(lengths, megabatch)),
        ("seed's 6 buckets", baseline(lengths, seed_buckets)),
        ("full shuffle", baseline(lengths, shuffled)),
    ]
    head = f"{'strategy':<26} {'efficiency':>10} {'window_tv':>10} {'churn':>8} {'p99 imbalance':>14}"
    print(f"\n{head} {'sync/micro':>10} {'sync/step':>10}")
    for name, r in rows:
        print(
            f"{name:<26} {r['efficiency']:>10.4f} {r['window_tv']:>10.4f} {r['churn']:>8.4f} {r['p99']:>14.3f} "
            f"{r['sync']:>10.4f} {r['sync_step']:>10.4f}"
        )
    print(f"(dflash_batch: {default['buckets']} buckets, {default['steps']:,} steps per rank)")

    ok = lambda met: "MET" if met else "MISSED"  # noqa: E731
    d = default
    print("\ntargets at the defaults (one run; planning median, best in brackets)")
    print(f"  efficiency ≥ {EFFICIENCY}:          {d['efficiency']:.4f}  {ok(d['efficiency'] >= EFFICIENCY)}")
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
    print(
        f"{'balance_tolerance':>18} {'window_tv':>10} {'p50':>7} {'p99':>7} {'sync/micro':>10} {'sync/step':>10} "
        f"{'median ms':>10} {'best ms':>8}"
    )
    frontier = {}
    for tolerance in TOLERANCES:
        r = default if tolerance is None else scored(lengths, tolerance, max(3, args.repeats // 3))
        frontier["none" if tolerance is None else f"{tolerance:g}".replace(".", "_")] = r
        name = "None (default)" if tolerance is None else f"{tolerance:g}"
        print(
            f"{name:>18} {r['window_tv']:>10.4f} {r['p50']:>7.3f} {r['p99']:>7.3f} {r['sync']:>10.4f} "
            f"{r['sync_step']:>10.4f} {r['median_ms']:>10.1f} {r['best_ms']:>8.1f}"
        )
    random_order = db.BucketSampler(
        lengths, max_tokens=MAX_TOKENS, world_size=WORLD, rank=0, accumulation=ACCUMULATION, order="random"
    )
    predicted = random_order.predicted_efficiency
    random_tv = random_order.plan(0).stats()["window_tv"]
    print(f"\norder='random': window_tv {random_tv:.4f}; predicted efficiency {predicted:.4f}")
    return {
        "samples": len(lengths),
        "random_order": {"window_tv": random_tv},
        "predicted_efficiency": predicted,
        "default": default,
        "megabatch": rows[1][1],
        "seed_buckets": rows[2][1],
        "full_shuffle": rows[3][1],
        "frontier": frontier,
        "sync": synchronous(lengths),
        **({"peers": peer_table(lengths)} if peers else {}),
        "mixture": _mixtures.collect(len(lengths), max(3, repeats // 3)),
    }


def synchronous(lengths: np.ndarray) -> dict:
    """Part 3: synchronous efficiency of the configurations people run, against the targets."""
    print(f"\nsynchronous efficiency, {WORLD} ranks (sorted static batches ≈ 1 by construction)")
    print(
        f"{'plan':<52} {'efficiency':>10} {'window_tv':>10} {'sync/micro':>10} {'sync/step':>10} "
        f"{'batches':>8} {'plan ms':>9}"
    )
    got, figures = {}, {}

    def row(key: str, name: str, price=None, **settings) -> None:
        sampler = db.BucketSampler(lengths, max_tokens=MAX_TOKENS, world_size=WORLD, rank=0, **settings)
        plan = sampler.plan(0)
        check_all(lengths, plan)
        stats = plan.stats()
        sync = (stats["sync_efficiency"], stats["sync_efficiency_step"])
        end = (stats["end_to_end_efficiency"], stats["end_to_end_efficiency_step"])
        if price is not None:  # the plan's own cost model is not the price it is scored at
            accumulation = settings.get("accumulation", 1)
            sync = metrics.sync_efficiency(lengths, plan.indices, plan.offsets, WORLD, accumulation, cost=price)
            end = metrics.end_to_end(lengths, plan.indices, plan.offsets, WORLD, accumulation, cost=price)
        got[key] = (stats["efficiency"], stats["window_tv"], *sync, len(plan))
        figures[key] = dict(zip(("efficiency", "window_tv", "micro", "step", "batches"), got[key], strict=True))
        figures[key].update(end_to_end=end[0], end_to_end_step=end[1])
        more = ""
        if settings.get("trim_steps"):  # against the same settings untrimmed, the row above
            untrimmed = got[key.removesuffix("+trim")][4]
            median, _ = timings(lambda i: sampler.plan(i + 1), 3)
            more = f" {len(plan) / untrimmed - 1:>+8.1%} {median * 1e3:>9.1f}"
            figures[key]["added"] = len(plan) / untrimmed - 1
            figures[key]["plan_ms"] = median * 1e3
        print(
            f"{name:<52} {stats['efficiency']:>10.4f} {stats['window_tv']:>10.4f} {sync[0]:>10.4f} {sync[1]:>10.4f}"
            + more
        )

    a = ACCUMULATION
    trim = {"trim_steps": True}
    row("a4", f"accumulation {a}, padded tokens", accumulation=a)
    row("a4+trim", "  + trim_steps=True", accumulation=a, **trim)
    row("a4at98", "  target_efficiency=0.98 (the default before 0.97)", accumulation=a, target_efficiency=0.98)
    row("a1", "accumulation 1, padded tokens", accumulation=1)
    row("a1+trim", "  + trim_steps=True", accumulation=1, **trim)
    row("attention", f"accumulation {a}, priced a·L+b·L², cost='tokens'", ATTENTION, accumulation=a)
    row("matched", f"accumulation {a}, priced a·L+b·L², cost=(a, b)", accumulation=a, cost=ATTENTION)
    row("matched+trim", "  + trim_steps=True", accumulation=a, cost=ATTENTION, **trim)
    # The default aims at 0.982 under this price (more buckets: padding caps the figure per step); 0.98
    # was this one's before. Padded batches under other prices aimed for 0.98 too until they aimed for 0.97.
    row("matched98", "  target_efficiency=0.98 instead", accumulation=a, cost=ATTENTION, target_efficiency=0.98)
    row("packed", f"packed rows, accumulation {a}, cost=(a, b)", accumulation=a, mode="packed", cost=ATTENTION)
    row("packed1", "packed rows, accumulation 1, cost=(a, b)", accumulation=1, mode="packed", cost=ATTENTION)
    order = np.argsort(lengths, kind="stable")
    sorted_static = baselines.cut(lengths, order, max_tokens=MAX_TOKENS)
    micro, step = metrics.sync_efficiency(lengths, *sorted_static, WORLD, ACCUMULATION)
    efficiency = baselines.efficiency(lengths, *sorted_static)
    name = "sorted static batches (the reference)"
    print(f"{name:<52} {efficiency:>10.4f} {'':>10} {micro:>10.4f} {step:>10.4f}")
    tv = metrics.window_tv(lengths, *sorted_static, WORLD * ACCUMULATION)
    end = metrics.end_to_end(lengths, *sorted_static, WORLD, ACCUMULATION)
    figures["sorted"] = {
        "efficiency": efficiency, "window_tv": tv, "micro": micro, "step": step, "end_to_end": end[0],
        "end_to_end_step": end[1],
    }  # fmt: skip

    targets = [
        (f"per micro-batch ≥ 0.965 (accumulation {ACCUMULATION})", "a4", 2, 0.965),
        ("per micro-batch ≥ 0.93 (accumulation 1)", "a1", 2, 0.93),
        (f"per optimizer step ≥ 0.970 (accumulation {ACCUMULATION})", "a4", 3, 0.970),
        ("attention price, matching cost model ≥ 0.94 (per micro-batch)", "matched", 2, 0.94),
        ("packed rows ≥ 0.985 (per micro-batch)", "packed", 2, 0.985),
    ]
    print(
        f"\ntargets, at padding efficiency ≥ {EFFICIENCY} and (accumulation > 1) window_tv ≤ 0.075: the default, and"
        " with trim_steps=True where it applies"
    )
    for name, key, column, target in targets:
        windows = key != "a1"  # with accumulation 1 a window is one step: no mixing target
        cells = [verdict(got[key], column, target, windows)]
        if f"{key}+trim" in got:
            cells.append("trimmed " + verdict(got[f"{key}+trim"], column, target, windows))
        print(f"  {name:<64} " + "; ".join(cells))
    print(
        "    why: a step waits for its costliest batch, and a full batch of k long rows costs k·L, fixed by its"
        " samples. Inside an optimizer window the steps are already cost-sorted; with accumulation 1 the window"
        " is the step, so only trimming the step's batches to a common cost helps (trim_steps=True), and the"
        " rows trimmed make extra steps of short rows: more steps, and window_tv rises where those steps are"
        " whole windows (accumulation 4 under an attention price: see the trimmed row's window_tv). Packed"
        " rows under an attention price are composed by cost (rust/core/src/plan/form/compose.rs)."
    )
    packed, matched = figures["packed"], figures["matched"]
    print(f"\nunder the attention price with the matching cost model (accumulation {ACCUMULATION}):")
    checks = [
        ("packed rows, end to end per micro-batch ≥ 0.99", packed["end_to_end"], 0.99),
        ("packed rows, window_tv ≤ 0.03", -packed["window_tv"], -0.03),
        ("packed rows, fill ≥ 0.999", packed["efficiency"], 0.999),
        ("padded, end to end per optimizer step ≥ 0.975 (the default)", matched["end_to_end_step"], 0.975),
        ("  the same with target_efficiency=0.98", figures["matched98"]["end_to_end_step"], 0.975),
    ]
    for name, value, least in checks:
        print(f"  {name:<64} {abs(value):.4f} {'MET' if value >= least else 'NOT MET'}")
    return figures


def peer_table(lengths: np.ndarray) -> dict:
    """Part 4: the peers that balance ranks, scored at the attention price in the same run: HF's
    ``BatchRebalanceSampler`` (transformers ≥ 5.24; at its default coefficient and at the same price) and
    ``LengthGroupedSampler``'s mega-batches, beside dflash_batch padded and packed."""
    b = ATTENTION[1]
    print(f"\npeers at the attention price a·L + b·L² (b = {b:.3g}), {WORLD} ranks × {ACCUMULATION} micro-batches")
    print(
        f"{'plan':<48} {'efficiency':>10} {'window_tv':>9} {'sync/micro':>10} {'sync/step':>9} {'e2e/micro':>9} "
        f"{'e2e/step':>8} {'largest':>8} {'plan ms':>8}"
    )
    rows = {}

    def add(key, name, order, offsets, seconds: float | None, capacity=None, sync=None) -> None:
        if sync is None:  # padded batches at the price (a packed plan's own stats balance its rows' Σ a·l + b·l²)
            sync = metrics.sync_efficiency(lengths, order, offsets, WORLD, ACCUMULATION, cost=ATTENTION)
        end = metrics.end_to_end(lengths, order, offsets, WORLD, ACCUMULATION, cost=ATTENTION, capacity=capacity)
        sizes = np.diff(offsets)
        longest = np.maximum.reduceat(lengths[order], offsets[:-1].astype(np.int64))
        largest = int(capacity if capacity else (sizes * longest.astype(np.int64)).max())
        efficiency = (
            lengths.sum() / (len(sizes) * capacity) if capacity else baselines.efficiency(lengths, order, offsets)
        )
        rows[key] = {
            "efficiency": efficiency, "window_tv": metrics.window_tv(lengths, order, offsets, WORLD * ACCUMULATION),
            "micro": sync[0], "step": sync[1], "end_to_end": end[0], "end_to_end_step": end[1],
            "largest": largest, "plan_ms": None if seconds is None else seconds * 1e3,
        }  # fmt: skip
        r = rows[key]
        print(
            f"{name:<48} {r['efficiency']:>10.4f} {r['window_tv']:>9.4f} {r['micro']:>10.4f} {r['step']:>9.4f} "
            f"{r['end_to_end']:>9.4f} {r['end_to_end_step']:>8.4f} {largest:>8,} "
            + ("       —" if seconds is None else f"{r['plan_ms']:>8.0f}")
        )

    for key, name, settings in (
        ("padded", "dflash_batch padded, cost='tokens'", {}),
        ("padded_cost", "dflash_batch padded, cost=(a, b)", {"cost": ATTENTION}),
        (
            "packed_best_fit",
            "dflash_batch packed rows, best fit (1 bucket)",
            {"mode": "packed", "bucketed": True, "boundaries": 1},
        ),
        ("packed", "dflash_batch packed rows, cost='tokens'", {"mode": "packed"}),
        ("packed_cost", "dflash_batch packed rows, cost=(a, b)", {"cost": ATTENTION, "mode": "packed"}),
    ):
        sampler = db.BucketSampler(
            lengths, max_tokens=MAX_TOKENS, world_size=WORLD, rank=0, accumulation=ACCUMULATION, **settings
        )
        plan = sampler.plan(0)
        median, _ = timings(lambda i, s=sampler: s.plan(i + 1), 3)
        packed = settings.get("mode") == "packed"
        order, offsets = np.asarray(plan.indices), np.asarray(plan.offsets)
        sync = packed_sync(lengths, order, offsets) if packed else None
        if "cost" in settings and packed:  # the plan's own figures are at this price: the same numbers
            stats = plan.stats()
            assert np.allclose(sync, (stats["sync_efficiency"], stats["sync_efficiency_step"]), rtol=1e-6)
        add(key, name, order, offsets, median, MAX_TOKENS if packed else None, sync)
    # Its order in numpy (benchmarks/plan.py times the real one), cut under the same budget.
    order = baselines.megabatch_sorted(lengths, 8, seed=0)
    megabatch = baselines.cut(lengths, order, max_tokens=MAX_TOKENS)
    add("megabatch", "HF LengthGroupedSampler (mega-batches), 16K budget", *megabatch, None)
    for key, name, coefficient in (
        ("rebalance_default", "HF BatchRebalanceSampler, its default price", None),
        ("rebalance_price", "HF BatchRebalanceSampler, the same price", b),
    ):
        got = baselines.batch_rebalance(
            lengths, world_size=WORLD, accumulation=ACCUMULATION, max_tokens=MAX_TOKENS, coefficient=coefficient
        )
        if got is None:
            print("  (transformers without BatchRebalanceSampler: pip install 'transformers>=5.24')")
            break
        add(key, name, *got)
    return rows


def packed_sync(lengths: np.ndarray, order: np.ndarray, offsets: np.ndarray) -> tuple[float, float]:
    """``(per micro-batch, per optimizer step)`` synchronous efficiency of packed rows at the attention
    price, as ``Plan.stats()`` scores its own: a row computes on its samples, ``Σ a·l + b·l²``; batch
    ``i`` is step ``i // WORLD``'s rank ``i % WORLD``; a last window of fewer steps counts as one."""
    starts = offsets[:-1].astype(np.int64)
    own = lengths[order].astype(np.float64)
    cost = ATTENTION[0] * np.add.reduceat(own, starts) + ATTENTION[1] * np.add.reduceat(own**2, starts)
    steps = cost[: len(cost) // WORLD * WORLD].reshape(-1, WORLD)
    window_of = np.arange(len(steps)) // ACCUMULATION
    windows = np.zeros((window_of[-1] + 1, WORLD))
    np.add.at(windows, window_of, steps)
    micro = steps.sum() / (WORLD * steps.max(axis=1).sum())
    return float(micro), float(steps.sum() / (WORLD * windows.max(axis=1).sum()))


def verdict(row: tuple, column: int, target: float, windows: bool) -> str:
    """``value MET`` when it reaches ``target`` at padding efficiency ≥ ``EFFICIENCY`` (and, with ``windows`` of
    several micro-batches, window_tv ≤ 0.075); else what fell short."""
    efficiency, tv, value = row[0], row[1], row[column]
    if value < target:
        return f"{value:.4f} MISSED"
    if efficiency < EFFICIENCY:
        return f"{value:.4f} MISSED (efficiency {efficiency:.4f})"
    return f"{value:.4f} MET" + (f", but window_tv {tv:.4f} > 0.075" if windows and tv > 0.075 else "")


if __name__ == "__main__":
    main()

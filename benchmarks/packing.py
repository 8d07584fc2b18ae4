"""Packed mode on the seed workload: utilization, planning time, rank balance and max_seqlen.

    python benchmarks/packing.py                  # 902,087 lengths, C = 16,384, 8 ranks × 4 micro-batches
    python benchmarks/packing.py --samples 50000  # a quick look

In one run: dflash_batch ``mode="packed"`` by default (rows composed by attention with closing fits since
planning rules 4), rows filled best fit over a bounded window (``bucketed=True, boundaries=1``: the default
before rules 4, the baseline), ``bucketed=True``, and rows under the attention price ``cost=(1, 1/30720)``,
against a Python random-order first-fit over 64 open rows (the kind of packer HF
``DataCollatorWithFlattening`` users and axolotl's multipack run in Python), beside the lower bound ⌈Σ L / C⌉
rows. Targets for the default: fill ≥ 0.999, ``window_tv`` no worse than best fit's, plan ≤ 25 ms per epoch
and ≥ 50× the Python first-fit, p99 rank imbalance ≤ 1.05; under the price: fill ≥ 0.999, window_tv ≤ 0.03,
end to end ≥ 0.99 at that price. Every plan is checked first (every sample once, no row over C).

A cap on samples per row (``max_docs_per_row`` = 4, 8, 16, and none) on the seed workload and on a workload of
many short samples (log-normal, median 200 tokens, as chat turns): fill, samples per row and planning time
against the uncapped rows of the same run. Every capped plan is checked first (no row above the cap).

Context parallelism (``context_parallel=4, 8``, rows of 32,768 tokens, every sample padded to a multiple of
2·cp): fill with that padding counted as waste, the per-CP-rank attention spread of the zigzag and the
contiguous layouts, and planning time against plain packed rows of the same capacity in the same run.
Targets: fill ≥ 0.99, zigzag spread ≤ 1%, planning ≤ 2× the plain rows'.

Google Grain's packers (``grain.experimental.FirstFitPackIterDataset`` and ``BestFitPackIterDataset``, 64
and 512 bins, shuffled input) pack token arrays, not lengths, at about a millisecond a sample here, so
they run on the first ``--grain-samples`` samples (default 50,000; every sample is counted back out).
Beside them, dflash_batch on the same samples: the plan alone, and the plan plus every packed row
collated (``collate_packed``), which is the work Grain's figure includes. Times per epoch are scaled to
the seed's 902,087 samples (packing is linear in samples).
"""

from __future__ import annotations

import argparse
import os
import time

import dflash_batch as db
import numpy as np
from _figures import write
from _timing import timings
from dflash_batch.tools import metrics

CAPACITY = 16384
WORLD = 8
ACCUMULATION = 4
# The attention price the composed rows are planned and scored under: a·L + b·L² (b = 1/30720).
ATTENTION = (1.0, 1 / 30720)


def python_first_fit(lengths: np.ndarray, seed: int, window: int = 64) -> list[list[int]]:
    """Random order, then each sample into the first of at most ``window`` open rows with room; when none
    has room and the window is full, the fullest row closes. A row also closes once no sample could fit
    (room below the shortest length). Unbounded first-fit scans thousands of open rows per sample in
    Python (minutes for this workload), so the window is what makes a Python packer usable."""
    order = np.random.default_rng(seed).permutation(len(lengths))
    shortest = int(lengths.min())
    rows: list[list[int]] = []
    rooms: list[int] = []  # free room of each open row
    members: list[list[int]] = []  # samples of each open row
    for i in order.tolist():
        length = int(lengths[i])
        for k, room in enumerate(rooms):
            if room >= length:
                members[k].append(i)
                rooms[k] = room - length
                if rooms[k] < shortest:
                    rows.append(members.pop(k))
                    del rooms[k]
                break
        else:
            if len(rooms) == window:
                k = rooms.index(min(rooms))
                rows.append(members.pop(k))
                del rooms[k]
            members.append([i])
            rooms.append(CAPACITY - length)
    rows.extend(members)
    return rows


def check(lengths: np.ndarray, plan: db.Plan) -> None:
    assert np.array_equal(np.sort(plan.indices), np.arange(len(lengths))), "plan loses or repeats samples"
    sums = np.add.reduceat(lengths[plan.indices].astype(np.int64), plan.offsets[:-1].astype(np.int64))
    assert np.all(sums <= CAPACITY), "row over capacity"


#: The packings compared, by figure key: settings beside ``mode="packed"``.
PACKINGS: dict[str, dict] = {
    "plain": {},
    "best_fit": {"bucketed": True, "boundaries": 1},
    "bucketed": {"bucketed": True},
    "composed": {"cost": ATTENTION},
}


def scored(lengths: np.ndarray, key: str, repeats: int) -> dict:
    """The figures of packing ``key`` (of ``PACKINGS``) on ``lengths``, its plan checked first."""
    sampler = db.BucketSampler(
        lengths,
        max_tokens=CAPACITY,
        mode="packed",
        world_size=WORLD,
        rank=0,
        accumulation=ACCUMULATION,
        **PACKINGS[key],
    )
    plan = sampler.plan(0)
    check(lengths, plan)
    stats = plan.stats()
    longest = np.maximum.reduceat(lengths[plan.indices], plan.offsets[:-1].astype(np.int64))
    median, best = timings(lambda i: sampler.plan(i + 1), repeats)
    # Every plan scored at the attention price: the share of the ranks' time on real work.
    end = metrics.end_to_end(
        lengths, plan.indices, plan.offsets, WORLD, ACCUMULATION, cost=ATTENTION, capacity=CAPACITY
    )
    return {
        "end_to_end": end[0],
        "utilization": stats["utilization"],
        "window_tv": stats["window_tv"],
        "p99": stats["rank_imbalance_p99"],
        "rows": len(plan),
        # The fewest rows any packing of these samples could use: ⌈Σ L / capacity⌉.
        "lower_bound": -(-int(lengths.sum()) // CAPACITY),
        "max_seqlen_mean": float(longest.mean()),
        "max_seqlen_max": int(longest.max()),
        "median_ms": median * 1e3,
        "best_ms": best * 1e3,
        "edges": sampler.edges,
        "churn": plan.churn(sampler.plan(1)),
    }


def grain_packed(lengths: np.ndarray, packer: str, bins: int) -> tuple[float, float]:
    """(utilization, seconds) of one epoch of Grain's ``packer`` over ``lengths`` (int32 tokens)."""
    import logging

    logging.disable(logging.WARNING)  # grain warns that jax is absent
    import grain

    class Source:
        def __len__(self) -> int:
            return len(lengths)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": np.ones(int(lengths[i]), dtype=np.int32)}

    parent = grain.MapDataset.source(Source()).shuffle(seed=0).to_iter_dataset()
    start = time.perf_counter()
    packed = getattr(grain.experimental, packer)(
        parent, length_struct={"input_ids": CAPACITY}, num_packing_bins=bins, shuffle_bins=True, seed=0
    )
    rows = tokens = 0
    for row in packed:
        rows += 1
        tokens += int(np.count_nonzero(row["input_ids_segment_ids"]))
    seconds = time.perf_counter() - start
    assert tokens == int(lengths.sum()), f"{packer} lost tokens"
    return tokens / (rows * CAPACITY), seconds


def dflash_packed(lengths: np.ndarray) -> tuple[float, float, float]:
    """(utilization, plan seconds, plan + collate seconds) of dflash_batch on ``lengths``."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    import pyarrow as pa

    column = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(np.ones(int(offsets[-1]), dtype=np.int32)))
    store = db.TokenStore(pa.table({"input_ids": column}))
    sampler = db.BucketSampler(lengths, max_tokens=CAPACITY, mode="packed", seed=0)
    plan_s = timings(lambda i: sampler.plan(i + 1), 5)[0]
    start = time.perf_counter()
    plan = sampler.plan(0)
    for b in range(len(plan)):
        db.collate_packed(store, plan[b], capacity=CAPACITY, dtype="int32")
    return plan.stats()["utilization"], plan_s, time.perf_counter() - start


def grain_table(lengths: np.ndarray, samples: int) -> dict:
    part = lengths[:samples]
    scale = db.SEED_SAMPLES / len(part)
    print(f"\nGrain's packers against dflash_batch on the first {len(part):,} samples (times scaled ×{scale:.1f})")
    print(f"{'packer':<44} {'utilization':>11} {'s / 902K epoch':>15}")
    util, plan_s, collated_s = dflash_packed(part)
    figures = {
        "samples": len(part),
        "dflash": {"utilization": util, "plan": plan_s * scale, "collated": collated_s * scale},
    }
    print(f"{'dflash_batch packed: plan':<44} {util:>11.4f} {plan_s * scale:>15.2f}")
    print(f"{'dflash_batch packed: plan + collate every row':<44} {util:>11.4f} {collated_s * scale:>15.2f}")
    for packer in ("FirstFitPackIterDataset", "BestFitPackIterDataset"):
        for bins in (64, 512):
            util, seconds = grain_packed(part, packer, bins)
            print(f"{'grain ' + packer + f', {bins} bins':<44} {util:>11.4f} {seconds * scale:>15.1f}")
            figures[f"{packer}_{bins}"] = {"utilization": util, "seconds": seconds * scale}
    return figures


def short_workload(n: int, seed: int = 0) -> np.ndarray:
    """Many short samples: log-normal lengths around 200 tokens (σ 0.8), 16 to 4,096 (chat turns, short
    instructions): ~80 to a 16K row uncapped."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(200), 0.8, n), 16, 4096).astype(np.uint32)


def capped_rows(lengths: np.ndarray, cap: int | None, repeats: int) -> dict:
    """Default packed rows under ``max_docs_per_row=cap``, checked: every sample once, no row over the cap."""
    sampler = db.BucketSampler(
        lengths, max_tokens=CAPACITY, mode="packed", world_size=WORLD, rank=0, accumulation=ACCUMULATION,
        max_docs_per_row=cap,
    )  # fmt: skip
    plan = sampler.plan(0)
    check(lengths, plan)
    docs = np.diff(np.asarray(plan.offsets))
    assert cap is None or docs.max() <= cap, "row over the cap"
    sampler.plan(repeats + 1)  # untimed: the first plans after a new workload run cold (~2×, measured)
    median, best = timings(lambda i: sampler.plan(i + 1), repeats)
    stats = plan.stats()
    return {
        "cap": cap, "fill": stats["utilization"], "rows": len(plan), "docs_mean": float(docs.mean()),
        "docs_max": int(docs.max()), "window_tv": stats["window_tv"], "median_ms": median * 1e3, "best_ms": best * 1e3,
    }  # fmt: skip


def docs_cap_table(seed_lengths: np.ndarray, repeats: int) -> dict:
    """``max_docs_per_row`` at 4, 8, 16 against no cap, on the seed workload and on many short samples."""
    print(f"\nmax_docs_per_row: rows of {CAPACITY} tokens, {WORLD} ranks × {ACCUMULATION}")
    head = f"{'workload':<10} {'cap':>5} {'fill':>7} {'rows':>8} {'docs/row':>9} {'max':>5}"
    print(f"{head} {'median ms':>10} {'× none':>7}")
    figures: dict = {}
    for name, lengths in (("seed", seed_lengths), ("short", short_workload(len(seed_lengths)))):
        runs = [capped_rows(lengths, cap, repeats) for cap in (None, 4, 8, 16)]
        for r in runs:
            r["time_ratio"] = r["median_ms"] / runs[0]["median_ms"]
            cap = "none" if r["cap"] is None else str(r["cap"])
            print(
                f"{name:<10} {cap:>5} {r['fill']:>7.4f} {r['rows']:>8,} {r['docs_mean']:>9.2f} {r['docs_max']:>5} "
                f"{r['median_ms']:>10.1f} {r['time_ratio']:>7.2f}"
            )
        figures[name] = {"none" if r["cap"] is None else f"cap{r['cap']}": r for r in runs}
    return figures


CP_CAPACITY = 32768


def context_parallel_rows(lengths: np.ndarray, cp: int, cost: str | tuple[float, float], repeats: int) -> dict:
    """Rows of ``CP_CAPACITY`` tokens for context parallelism ``cp`` (1: plain packed rows, the baseline),
    checked first: every sample once, every padded row within capacity."""
    sampler = db.BucketSampler(
        lengths, max_tokens=CP_CAPACITY, mode="packed", context_parallel=cp, world_size=WORLD, rank=0,
        accumulation=ACCUMULATION, cost=cost,
    )  # fmt: skip
    plan = sampler.plan(0)
    multiple = sampler.entries.piece_multiple
    assert np.array_equal(np.sort(plan.indices), np.arange(len(lengths))), "plan loses or repeats samples"
    padded = -(-lengths[plan.indices].astype(np.int64) // multiple) * multiple
    sums = np.add.reduceat(padded, plan.offsets[:-1].astype(np.int64))
    assert np.all(sums <= CP_CAPACITY), "padded row over capacity"
    stats = plan.stats()
    median, best = timings(lambda i: sampler.plan(i + 1), repeats)
    return {
        "cp": cp,
        "fill": stats["efficiency"],  # real tokens over rows × capacity: the pieces' padding is waste
        "padding_share": stats.get("piece_padding_tokens", 0) / (len(plan) * CP_CAPACITY),
        "rows": len(plan),
        "zigzag": stats.get("cp_spread_zigzag"),
        "contiguous": stats.get("cp_spread_contiguous"),
        "window_tv": stats["window_tv"],
        # Data-parallel balance on top: useful work over what the ranks spend, per micro-batch.
        "end_to_end": stats["end_to_end_efficiency"],
        "median_ms": median * 1e3,
        "best_ms": best * 1e3,
    }


def context_parallel_table(lengths: np.ndarray, repeats: int) -> dict:
    """Context-parallel rows (cp = 4, 8) against plain packed rows of the same capacity, tokens and priced."""
    print(f"\ncontext parallelism: rows of {CP_CAPACITY} tokens, every sample padded to a multiple of 2·cp")
    head = f"{'cost':<16} {'cp':>3} {'fill':>7} {'padding':>8} {'rows':>7} {'zigzag':>8} {'contiguous':>10} "
    print(head + f"{'window_tv':>9} {'e2e':>6} {'median ms':>10} {'× cp=1':>7}")
    figures: dict = {}
    for name, cost in (("tokens", "tokens"), ("cost=(1, 1/30720)", ATTENTION)):
        base = context_parallel_rows(lengths, 1, cost, repeats)
        runs = [base] + [context_parallel_rows(lengths, cp, cost, repeats) for cp in (4, 8)]
        for r in runs:
            r["time_ratio"] = r["median_ms"] / base["median_ms"]
            spread = lambda v: "—" if v is None else f"{v:.4f}"  # noqa: E731
            print(
                f"{name:<16} {r['cp']:>3} {r['fill']:>7.4f} {r['padding_share']:>8.4f} {r['rows']:>7,} "
                f"{spread(r['zigzag']):>8} {spread(r['contiguous']):>10} {r['window_tv']:>9.4f} "
                f"{r['end_to_end']:>6.4f} {r['median_ms']:>10.1f} {r['time_ratio']:>7.2f}"
            )
        figures["tokens" if cost == "tokens" else "priced"] = {f"cp{r['cp']}": r for r in runs}
    ok = lambda met: "MET" if met else "MISSED"  # noqa: E731
    print("targets (every cp and cost above)")
    cps = [r for by_cost in figures.values() for key, r in by_cost.items() if key != "cp1"]
    fill = min(r["fill"] for r in cps)
    spread = max(r["zigzag"] for r in cps)
    ratio = max(r["time_ratio"] for r in cps)
    print(f"  fill ≥ 0.99 (padding as waste): {fill:.4f} (least)  {ok(fill >= 0.99)}")
    print(f"  zigzag spread ≤ 1%:             {spread:.4f} (most)  {ok(spread <= 0.01)}")
    print(f"  plan ≤ 2× packed:               {ratio:.2f}× (most)  {ok(ratio <= 2)}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=db.SEED_SAMPLES)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--grain-samples", type=int, default=50_000, help="0 skips Grain")
    parser.add_argument("--json", metavar="FILE", help="record the figures under 'packing' of FILE")
    args = parser.parse_args()

    lengths = db.seed_workload(args.samples, seed=0)
    print(
        f"seed workload: {len(lengths):,} lengths; rows of {CAPACITY} tokens, world_size={WORLD}, "
        f"accumulation={ACCUMULATION}, cores={os.cpu_count()}"
    )
    plain, best_fit, bucketed, composed = (scored(lengths, key, args.repeats) for key in PACKINGS)

    start = time.perf_counter()
    rows = python_first_fit(lengths, 0)
    python_s = time.perf_counter() - start
    python_util = lengths.sum() / (len(rows) * CAPACITY)
    python_longest = np.array([lengths[r].max() for r in rows])

    print(f"\n{'strategy':<34} {'utilization':>11} {'rows':>8} {'max_seqlen mean/max':>20} {'median ms':>10}")
    strategies = (
        ("dflash_batch packed", plain),
        ("  best fit (bucketed, 1 bucket)", best_fit),
        ("dflash_batch packed, bucketed", bucketed),
        ("dflash_batch packed, cost=(a, b)", composed),
    )
    for name, r in strategies:
        seqlen = f"{r['max_seqlen_mean']:.0f} / {r['max_seqlen_max']}"
        print(f"{name:<34} {r['utilization']:>11.4f} {r['rows']:>8,} {seqlen:>20} {r['median_ms']:>10.1f}")
    seqlen = f"{python_longest.mean():.0f} / {python_longest.max()}"
    name = "Python first-fit (random order)"
    print(f"{name:<34} {python_util:>11.4f} {len(rows):>8,} {seqlen:>20} {python_s * 1e3:>10.0f}")
    bound = plain["lower_bound"]
    print(f"{'lower bound: ⌈Σ L / ' + str(CAPACITY) + '⌉':<34} {lengths.sum() / (bound * CAPACITY):>11.4f} {bound:>8,}")
    print(
        f"(bucketed edges {bucketed['edges']}; window_tv bucketed {bucketed['window_tv']:.4f}; "
        f"churn plain {plain['churn']:.4f}, best fit {best_fit['churn']:.4f})"
    )

    ok = lambda met: "MET" if met else "MISSED"  # noqa: E731
    ratio = python_s / (plain["median_ms"] / 1e3)
    b = best_fit
    print("\ntargets (default packed rows; planning median, best in brackets)")
    fill = f"{plain['utilization']:.4f} ({plain['rows']:,} rows, bound {bound:,}; best fit {b['utilization']:.4f})"
    print(f"  fill ≥ 0.999:                {fill}  {ok(plain['utilization'] >= 0.999)}")
    tv = f"{plain['window_tv']:.4f} (best fit {b['window_tv']:.4f})"
    print(f"  window_tv no worse:          {tv}  {ok(plain['window_tv'] <= b['window_tv'])}")
    time_ratio = plain["median_ms"] / b["median_ms"]
    print(
        f"  plan ≤ 25 ms per epoch:      {plain['median_ms']:.1f} ms [{plain['best_ms']:.1f}], "
        f"{time_ratio:.2f}× best fit's {b['median_ms']:.1f}  {ok(plain['median_ms'] <= 25)}"
    )
    print(f"  ≥ 50× Python first-fit:      {ratio:.0f}×  {ok(ratio >= 50)}")
    print(f"  p99 rank imbalance ≤ 1.05:   {plain['p99']:.3f}  {ok(plain['p99'] <= 1.05)}")
    c = composed
    price = f"cost=(1, 1/{1 / ATTENTION[1]:.0f})"
    print(f"\ntargets (rows composed under the attention price {price}, {WORLD} ranks × {ACCUMULATION})")
    fill = f"{c['utilization']:.4f} ({c['rows']:,} rows, bound {bound:,})"
    print(f"  fill ≥ 0.999:                {fill}  {ok(c['utilization'] >= 0.999)}")
    print(f"  window_tv ≤ 0.03:            {c['window_tv']:.4f}  {ok(c['window_tv'] <= 0.03)}")
    end = f"{c['end_to_end']:.4f}  {ok(c['end_to_end'] >= 0.99)}"
    print(f"  end to end ≥ 0.99:           {end} (best-fit rows at that price: {b['end_to_end']:.4f})")
    timed = f"{c['median_ms']:.1f} ms [{c['best_ms']:.1f}]"
    print(f"  plan ≤ 25 ms per epoch:      {timed}  {ok(c['median_ms'] <= 25)}")
    figures = {
        "samples": len(lengths), "plain": plain, "best_fit": best_fit, "bucketed": bucketed, "composed": composed,
        "ratio": ratio, "time_ratio": time_ratio,
        "python": {"utilization": python_util, "seconds": python_s, "rows": len(rows)},
    }  # fmt: skip
    figures["max_docs"] = docs_cap_table(lengths, args.repeats)
    figures["context_parallel"] = context_parallel_table(lengths, args.repeats)
    if args.grain_samples:
        figures["grain"] = grain_table(lengths, args.grain_samples)
    write(args.json, "packing", figures, "python benchmarks/packing.py")


if __name__ == "__main__":
    main()

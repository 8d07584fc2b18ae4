"""Part 5 of ``benchmarks/mixing.py``: mixtures (issue 41). The seed workload split into four sources of
different length profiles (``db.seed_mixture``: chat, code, math, safety — 40/30/20/10 of the samples, code
the longest), weighted 0.3/0.3/0.25/0.15 (chat and code down-sampled, math and safety up-sampled), 8 ranks ×
4 micro-batches, ``max_tokens=16384``. For dflash_batch, padded and packed, in tokens and in samples:

* each source's share over three epochs, against the largest-remainder quota (exact in samples; within
  one sample's tokens in tokens);
* ``source_tv``: per optimizer step's window, ½ Σ |share − weight|, the mean over windows (and p99);
* padding efficiency / packed fill and the rank figures, beside the single store (the same seed workload
  planned without sources) — choosing only moves whole batches, so they follow the batches;
* planning time per epoch against the single store, in the same run;
* the reach of choosing: the padded source TV of the same split at 20K, 50K and 200K samples.

Beside them, the peers' ways, bucketed the same way afterwards: Megatron's ``BlendedDataset`` (each
position goes to the source furthest behind its weight, a source's samples taken in a shuffled order,
cycling), and HF ``datasets.interleave_datasets`` with the weights as probabilities
(``all_exhausted``: until every source is used up) — both blend samples, then a bucketing sampler
shuffles the blend: their windows get sources by chance.
"""

from __future__ import annotations

import time

import dflash_batch as db
import numpy as np
from _timing import timings

MAX_TOKENS, WORLD, ACCUMULATION = 16384, 8, 4
WEIGHTS = {"chat": 0.3, "code": 0.3, "math": 0.25, "safety": 0.15}


def collect(samples: int, repeats: int) -> dict:
    parts = db.seed_mixture(samples, seed=0)
    names = list(WEIGHTS)
    single = db.seed_workload(samples, seed=0)
    print(
        f"\nmixtures: the seed workload as {len(names)} sources "
        + ", ".join(f"{n} {len(parts[n]):,} (mean {parts[n].mean():.0f})" for n in names)
        + f"; weights {'/'.join(str(w) for w in WEIGHTS.values())}, {WORLD} ranks × {ACCUMULATION}"
    )
    print(
        f"{'plan':<40} {'share gap':>10} {'source_tv':>9} {'p99':>6} {'eff/fill':>8} {'sync/micro':>10} "
        f"{'sync/step':>9} {'e2e/step':>8} {'plan ms':>8} {'× single':>8}"
    )
    rows: dict = {}
    for mode in ("padded", "packed"):
        plain = sampler_of(single, mode)
        base_ms = timings(lambda i, s=plain: s.plan(i + 1), repeats)[0] * 1e3
        rows[f"single_{mode}"] = figures_of(plain.plan(0).stats(), mode) | {"plan_ms": base_ms}
        show(f"single store, {mode}", rows[f"single_{mode}"], None)
        for unit in ("tokens", "samples"):
            mix = db.Mixture({n: (parts[n], WEIGHTS[n]) for n in names}, unit=unit)
            sampler = sampler_of(mix, mode)
            gap = share_gap(mix, sampler, unit)
            plan = sampler.plan(0)
            ms = timings(lambda i, s=sampler: s.plan(i + 1), repeats)[0] * 1e3
            row = figures_of(plan.stats(), mode) | {"plan_ms": ms, "ratio": ms / base_ms, "share_gap": gap}
            row |= {"source_tv_p99": window_tvs(mix, plan, unit, plan.indices)[1]}
            rows[f"{mode}_{unit}"] = row
            show(f"dflash_batch {mode}, weights in {unit}", row, unit)
    mix = db.Mixture({n: (parts[n], WEIGHTS[n]) for n in names}, unit="samples")
    for key, name, blend in (
        ("megatron", "Megatron-style greedy blend, then buckets", megatron_blend),
        ("interleave", "HF interleave_datasets, then buckets", hf_interleave),
    ):
        start = time.perf_counter()
        rows_of_epoch = blend(mix, seed=0)
        seconds = time.perf_counter() - start
        if rows_of_epoch is None:
            print(f"  ({name}: datasets is not installed)")
            continue
        lengths = mix.lengths()[rows_of_epoch]
        sampler = sampler_of(lengths, "padded")
        plan = sampler.plan(0)
        indices = rows_of_epoch[plan.indices]
        want = quota(mix, "samples", len(rows_of_epoch))
        got = np.bincount(mix.source_of(rows_of_epoch), minlength=len(names))
        tv, p99 = window_tvs(mix, plan, "samples", indices)
        row = figures_of(plan.stats(), "padded") | {"source_tv": tv, "source_tv_p99": p99, "seconds": seconds}
        row["share_gap"] = int(np.abs(got - want).max())
        rows[key] = row
        show(name, row, "samples")
    rows["density"] = density()
    report(rows)
    return rows


def density(sizes: tuple[int, ...] = (20_000, 50_000, 200_000)) -> dict:
    """The padded per-window source TV (tokens) of the same four-source split at smaller sizes: batches
    trade places only with batches of nearly their mean length, and small epochs have fewer of them."""
    out = {}
    for n in sizes:
        parts = db.seed_mixture(n, seed=0)
        mix = db.Mixture({name: (parts[name], WEIGHTS[name]) for name in WEIGHTS}, unit="tokens")
        out[str(n)] = float(np.mean([sampler_of(mix, "padded").plan(e).stats()["source_tv"] for e in (1, 2, 3)]))
    print("source TV by epoch size (padded, tokens): " + ", ".join(f"{n:>7} {tv:.4f}" for n, tv in out.items()))
    return out


def sampler_of(lengths, mode: str) -> db.BucketSampler:
    return db.BucketSampler(
        lengths, max_tokens=MAX_TOKENS, world_size=WORLD, rank=0, accumulation=ACCUMULATION, mode=mode
    )


def figures_of(stats: dict, mode: str) -> dict:
    return {
        "efficiency": stats["utilization"] if mode == "packed" else stats["efficiency"],
        "source_tv": stats.get("source_tv"),
        "sync": stats["sync_efficiency"],
        "sync_step": stats["sync_efficiency_step"],
        "end_to_end_step": stats["end_to_end_efficiency_step"],
    }


def quota(mix: db.Mixture, unit: str, size: int) -> np.ndarray:
    """The largest-remainder shares of ``size`` (samples or tokens) by the mixture's weights."""
    weights = np.array([mix.weights[n] for n in mix.names])
    exact = size * weights / weights.sum()
    shares = np.floor(exact).astype(np.int64)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in order[: size - int(shares.sum())]:
        shares[i] += 1
    return shares


def share_gap(mix: db.Mixture, sampler: db.BucketSampler, unit: str, epochs: int = 3) -> int:
    """The largest gap, over ``epochs`` epochs and the sources, between a source's samples (or tokens) and
    its quota — 0 in samples, at most the longest sample in tokens (asserted)."""
    lengths = mix.lengths()
    size = len(mix) if unit == "samples" else int(lengths.sum())
    want = quota(mix, unit, size)
    gap = 0
    for epoch in range(epochs):
        rows = sampler.plan(epoch).indices
        got = np.bincount(mix.source_of(rows), weights=None if unit == "samples" else lengths[rows], minlength=4)
        gap = max(gap, int(np.abs(got - want).max()))
    assert gap <= (0 if unit == "samples" else int(lengths.max())), f"shares off by {gap}"
    return gap


def window_tvs(mix: db.Mixture, plan: db.Plan, unit: str, indices: np.ndarray) -> tuple[float, float]:
    """Mean and p99 over optimizer-step windows of ½ Σ |source share − weight| (the plan's ``indices``
    given as mixture rows)."""
    window = WORLD * ACCUMULATION
    offsets = plan.offsets.astype(np.int64)
    windows = (len(offsets) - 1) // window
    batch_of = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    keep = batch_of < windows * window
    mass = mix.lengths()[indices].astype(np.float64) if unit == "tokens" else np.ones(len(indices))
    table = np.zeros((windows, len(mix.names)))
    np.add.at(table, (batch_of[keep] // window, mix.source_of(indices[keep])), mass[keep])
    weights = np.array([mix.weights[n] for n in mix.names])
    distance = 0.5 * np.abs(table / table.sum(axis=1, keepdims=True) - weights).sum(axis=1)
    return float(distance.mean()), float(np.percentile(distance, 99))


def megatron_blend(mix: db.Mixture, seed: int) -> np.ndarray:
    """Megatron's ``BlendedDataset`` index for one epoch of ``len(mix)`` samples: position ``i`` goes to the
    source with the largest ``weight × (i + 1) − taken`` (its greedy deficit rule); each source's samples
    come in a seeded shuffled order, cycling when used up."""
    weights = np.array([mix.weights[n] for n in mix.names])
    taken = np.zeros(len(weights))
    choice = np.empty(len(mix), dtype=np.int64)
    for i in range(len(mix)):  # the rule is sequential, as Megatron's C++ helper is
        s = int(np.argmax(weights * (i + 1) - taken))
        choice[i] = s
        taken[s] += 1
    rng = np.random.default_rng(seed)
    out = np.empty(len(mix), dtype=np.int64)
    for s in range(len(weights)):
        lo, hi = mix.bounds[s], mix.bounds[s + 1]
        where = np.flatnonzero(choice == s)
        cycles = -(-len(where) // (hi - lo))
        order = np.concatenate([rng.permutation(np.arange(lo, hi)) for _ in range(cycles)])
        out[where] = order[: len(where)]
    return out


def hf_interleave(mix: db.Mixture, seed: int) -> np.ndarray | None:
    """HF ``interleave_datasets`` of the sources' row numbers with the weights as probabilities."""
    try:
        import datasets
    except ImportError:
        return None
    sources = [
        datasets.Dataset.from_dict({"row": np.arange(mix.bounds[s], mix.bounds[s + 1])}) for s in range(len(mix.names))
    ]
    probabilities = [mix.weights[n] for n in mix.names]
    blended = datasets.interleave_datasets(sources, probabilities, seed=seed, stopping_strategy="all_exhausted")
    return np.asarray(blended["row"], dtype=np.int64)


def show(name: str, row: dict, unit: str | None) -> None:
    gap = "—" if unit is None else f"{row['share_gap']:,}"
    tv = "—" if row.get("source_tv") is None else f"{row['source_tv']:.4f}"
    p99 = "—" if row.get("source_tv_p99") is None else f"{row['source_tv_p99']:.3f}"
    ms = "—" if "plan_ms" not in row else f"{row['plan_ms']:.1f}"
    ratio = "—" if "ratio" not in row else f"{row['ratio']:.2f}"
    print(
        f"{name:<40} {gap:>10} {tv:>9} {p99:>6} {row['efficiency']:>8.4f} {row['sync']:>10.4f} "
        f"{row['sync_step']:>9.4f} {row['end_to_end_step']:>8.4f} {ms:>8} {ratio:>8}"
    )


def report(rows: dict) -> None:
    ok = lambda met: "MET" if met else "MISSED"  # noqa: E731
    print("\nmixture targets (seed workload, 4 sources, 8 × 4)")
    for unit in ("tokens", "samples"):
        r = rows[f"padded_{unit}"]
        print(f"  per-window source TV ≤ 0.03, padded, {unit}: {r['source_tv']:.4f} {ok(r['source_tv'] <= 0.03)}")
    packed = rows["packed_tokens"]
    print(f"  per-window source TV ≤ 0.03, packed, tokens: {packed['source_tv']:.4f} {ok(packed['source_tv'] <= 0.03)}")
    padded = rows["padded_tokens"]
    print(f"  padding efficiency ≥ 0.975: {padded['efficiency']:.4f} {ok(padded['efficiency'] >= 0.975)}")
    print(f"  packed fill ≥ 0.99: {packed['efficiency']:.4f} {ok(packed['efficiency'] >= 0.99)}")
    for mode in ("padded", "packed"):
        mine, single = rows[f"{mode}_tokens"], rows[f"single_{mode}"]
        gap = max(abs(mine[k] - single[k]) for k in ("sync", "sync_step", "end_to_end_step"))
        print(f"  rank figures within 0.005 of the single store, {mode}: largest gap {gap:.4f} {ok(gap <= 0.005)}")
        print(f"  planning within 1.5× of the single store, {mode}: {mine['ratio']:.2f}× {ok(mine['ratio'] <= 1.5)}")

"""Time to plan one epoch of the seed workload, against the baselines measured in the same run.

    python benchmarks/plan.py            # 902,087 lengths, max_tokens=16384, plus the 100M check
    python benchmarks/plan.py --no-big   # skip the 100M-lengths run
    python benchmarks/plan.py --curve    # only the growth curve, 1M to 1B seed lengths (--curve-max)

Correctness is asserted first (every sample exactly once, every batch within budget); then medians are
printed side by side with ratios. Targets: ≤ 10 ms per epoch, ≥ 50× HF transformers'
LengthGroupedSampler, 100M lengths ≤ 2 s an epoch and ≤ 1 GiB peak RSS for the whole process, padded
and packed (each measured in a child process).

lhotse's ``DynamicBucketingSampler`` (6 buckets, ``max_duration`` = the token budget, a sample's duration
its length) runs at ~0.2 ms a sample here, minutes for the seed epoch, so it runs on the first
``--lhotse-samples`` samples (default 50,000) and its time is scaled to the epoch. Its budget caps the sum of
lengths in a batch, not rows × longest, so its batches pad more than a padded-token budget's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import dflash_batch as db
import numpy as np
from _figures import write
from _timing import timings
from dflash_batch.tools import baselines

MAX_TOKENS = 16384
WORLD = 8


def check(lengths: np.ndarray, plan: db.Plan) -> None:
    """Every sample once, within budget: a benchmark of a wrong plan measures nothing."""
    assert np.array_equal(np.sort(plan.indices), np.arange(len(lengths))), "plan loses or repeats samples"
    sizes = np.diff(plan.offsets)
    longest = np.maximum.reduceat(lengths[plan.indices], plan.offsets[:-1].astype(np.int64))
    assert np.all(sizes * longest.astype(np.int64) <= MAX_TOKENS), "batch over budget"
    assert len(plan) % WORLD == 0


def plan_times(lengths: np.ndarray, boundaries, repeats: int) -> tuple[tuple[float, float], float, float]:
    """((median, best) seconds per epoch, efficiency, construction seconds) for dflash_batch."""
    start = time.perf_counter()
    sampler = db.BucketSampler(lengths, max_tokens=MAX_TOKENS, boundaries=boundaries, world_size=WORLD)
    build = time.perf_counter() - start
    check(lengths, sampler.plan(0))

    def one(i):
        sampler.set_epoch(i + 1)
        sampler.plan()

    return timings(one, repeats), sampler.plan(0).stats()["efficiency"], build


def length_grouped(lengths: np.ndarray, repeats: int) -> tuple[tuple[float, float], float] | None:
    try:
        import torch
        from transformers.trainer_pt_utils import LengthGroupedSampler
    except ImportError:
        return None
    as_list = lengths.tolist()

    def one(i):
        torch.manual_seed(i)
        return list(LengthGroupedSampler(batch_size=8, lengths=as_list))

    seconds = timings(one, repeats)
    order = np.array(one(0))
    offsets = np.append(np.arange(0, len(order), 8), len(order))
    return seconds, baselines.efficiency(lengths, order, offsets)


def lhotse_bucketing(lengths: np.ndarray) -> tuple[float, float] | None:
    """(seconds per epoch, efficiency) of lhotse's DynamicBucketingSampler over ``lengths``."""
    try:
        import warnings

        from lhotse import CutSet, MonoCut
        from lhotse.dataset import DynamicBucketingSampler
    except ImportError:
        return None
    cuts = CutSet.from_cuts(MonoCut(id=str(i), start=0.0, duration=float(n), channel=0) for i, n in enumerate(lengths))
    with warnings.catch_warnings():  # lhotse suggests a lazy CutSet; these cuts are already in memory
        warnings.simplefilter("ignore")
        sampler = DynamicBucketingSampler(cuts, max_duration=MAX_TOKENS, num_buckets=6, shuffle=True, seed=0)
        start = time.perf_counter()
        batches = [np.array([int(c.id) for c in batch]) for batch in sampler]
        seconds = time.perf_counter() - start
    order = np.concatenate(batches)
    assert np.array_equal(np.sort(order), np.arange(len(lengths))), "lhotse loses or repeats samples"
    offsets = np.cumsum([0] + [len(b) for b in batches])
    return seconds, baselines.efficiency(lengths, order, offsets)


#: The mixture planned beside the single store: the seed workload's four sources (``db.seed_mixture``),
#: weighted in tokens (chat and code down-sampled, math and safety up-sampled).
MIXTURE = {"chat": 0.3, "code": 0.3, "math": 0.25, "safety": 0.15}


def mixture_of(parts: dict) -> db.Mixture:
    return db.Mixture({name: (parts[name], weight) for name, weight in MIXTURE.items()})


def big_run(n: int, mode: str, lengths: str) -> dict:
    """Plans 3 epochs of n lengths in a fresh process (the caller's array deleted once the sampler holds
    its own); reports the median plan seconds and the whole process's peak RSS. ``lengths="mixture"``:
    the seed workload's four sources, weighted as :data:`MIXTURE`."""
    make = {
        "seed": f"db.seed_workload({n}, seed=0)",
        "uniform": f"np.random.default_rng(0).integers(1, 4097, {n}, dtype=np.uint32)",
        "mixture": f"db.Mixture({{k: (v, {MIXTURE}[k]) for k, v in db.seed_mixture({n}, seed=0).items()}})",
    }[lengths]
    code = f"""
import json, resource, statistics, time
import numpy as np
import dflash_batch as db
lengths = {make}
sampler = db.BucketSampler(lengths, max_tokens={MAX_TOKENS}, world_size={WORLD}, mode={mode!r})
del lengths
times = []
for epoch in range(3):
    sampler.set_epoch(epoch)
    start = time.perf_counter(); plan = sampler.plan(); times.append(time.perf_counter() - start)
    samples = plan.stats()["samples"]; del plan
print(json.dumps({{"seconds": statistics.median(times), "samples": samples,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


CURVE_POINT = """
import json, statistics, sys, time
import numpy as np
import dflash_batch as db

def status():
    out = {}
    for line in open("/proc/self/status"):
        key, value = line.split(":", 1)
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out

n = int(sys.argv[1])
lengths = db.seed_workload(n, seed=0).astype(np.uint16)
before_build = status()["VmRSS"]
start = time.perf_counter()
sampler = db.BucketSampler(lengths, max_tokens=16384, world_size=8)
build = time.perf_counter() - start
del lengths
kept = status()["VmRSS"]
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak from here on
base = status()["VmRSS"]
start = time.perf_counter()
plan = sampler.plan(0)
first = time.perf_counter() - start
after = status()
plan_bytes = plan.indices.nbytes + plan.offsets.nbytes
del plan
times, peaks = [], []
for epoch in (1, 2, 3):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base_epoch = status()["VmRSS"]
    start = time.perf_counter()
    plan = sampler.plan(epoch)
    times.append(time.perf_counter() - start)
    peaks.append((status()["VmHWM"] - base_epoch) / n)
    del plan
print(json.dumps({
    "samples": n, "seconds": statistics.median(times), "first_seconds": first, "build_seconds": build,
    "ns_per_sample": statistics.median(times) / n * 1e9,
    "first_peak_bytes_per_sample": (after["VmHWM"] - base) / n,
    "peak_bytes_per_sample": statistics.median(peaks),
    "plan_bytes_per_sample": plan_bytes / n,
    "planner_bytes_per_sample": (kept - before_build + n * 2) / n,
}))
"""


def curve(largest: int) -> dict:
    """Seconds and bytes a sample of planning from 1M seed lengths up to ``largest``, each size in a fresh
    process: the median of epochs 1-3 and of their peak memory above the built sampler (the plan and its
    working memory; the first plan, which also sets the step count, separately), and what the plan
    itself holds."""
    sizes = [n for n in (1_000_000, 10_000_000, 100_000_000, 300_000_000, 1_000_000_000) if n <= largest]
    print(f"\ngrowth: seed lengths (uint16), max_tokens={MAX_TOKENS}, world_size={WORLD}, a fresh process each")
    print(
        f"{'samples':>14} {'s an epoch':>11} {'ns a sample':>12} {'peak B/sample':>14} {'first plan':>11} "
        f"{'plan B/sample':>14}"
    )
    points = {}
    for n in sizes:
        # Timed as usual; measured again with a fixed mmap threshold, so that every large buffer is
        # mapped and unmapped whole and each epoch's peak RSS is its own (glibc would otherwise keep
        # freed buffers for reuse and hide it; the threshold slows planning, hence two runs).
        def child(env: dict, n: int = n) -> dict:
            command = [sys.executable, "-c", CURVE_POINT, str(n)]
            done = subprocess.run(command, capture_output=True, text=True, check=True, env={**os.environ, **env})
            return json.loads(done.stdout.strip().splitlines()[-1])

        point = child({})
        memory = child({"MALLOC_MMAP_THRESHOLD_": "131072"})
        for key in ("peak_bytes_per_sample", "first_peak_bytes_per_sample"):
            point[key] = memory[key]
        points[str(n)] = point
        print(
            f"{n:>14,} {point['seconds']:>11.3f} {point['ns_per_sample']:>12.2f} "
            f"{point['peak_bytes_per_sample']:>14.2f} {point['first_peak_bytes_per_sample']:>11.2f} "
            f"{point['plan_bytes_per_sample']:>14.2f}"
        )
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=db.SEED_SAMPLES)
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--big", type=int, default=100_000_000, help="lengths for the memory run")
    parser.add_argument("--no-big", action="store_true")
    parser.add_argument("--lhotse-samples", type=int, default=50_000, help="0 skips lhotse")
    parser.add_argument("--json", metavar="FILE", help="record the figures under 'plan' of FILE")
    parser.add_argument("--curve", action="store_true", help="only the growth curve (recorded under 'curve')")
    parser.add_argument("--curve-max", type=int, default=1_000_000_000, help="the curve's largest size")
    args = parser.parse_args()
    if args.curve:
        points = curve(args.curve_max)
        write(args.json, "curve", {"points": points}, f"python benchmarks/plan.py --curve --curve-max {args.curve_max}")
        return
    figures: dict = {"samples": args.samples}

    lengths = db.seed_workload(args.samples, seed=0)
    print(
        f"seed workload: {len(lengths):,} lengths, mean {lengths.mean():.0f}, median {np.median(lengths):.0f}; "
        f"max_tokens={MAX_TOKENS}, world_size={WORLD}, cores={os.cpu_count()}"
    )

    rows = []
    six, six_eff, six_build = plan_times(lengths, 6, args.repeats)
    rows.append(("dflash_batch, 6 optimized buckets", six_eff, six))
    auto, auto_eff, _ = plan_times(lengths, "auto", args.repeats)
    rows.append(("dflash_batch, boundaries='auto'", auto_eff, auto))
    mixture = mixture_times(args.samples, args.repeats)
    rows.append(("dflash_batch, 4 sources (a Mixture)", mixture[1], mixture[0]))
    seed_s = timings(lambda i: baselines.seed_bucketed(lengths, max_tokens=MAX_TOKENS, seed=i), 5)
    seed_eff = baselines.efficiency(lengths, *baselines.seed_bucketed(lengths, max_tokens=MAX_TOKENS))
    rows.append(("seed's 6-bucket shuffle (numpy)", seed_eff, seed_s))
    hf = length_grouped(lengths, 5)
    if hf is not None:
        rows.append(("HF LengthGroupedSampler, batch 8", hf[1], hf[0]))

    print(f"\n{'strategy':<36} {'efficiency':>10} {'median ms':>10} {'best ms':>9} {'× dflash':>9}")
    for name, eff, (median, best) in rows:
        print(f"{name:<36} {eff:>10.3f} {median * 1e3:>10.1f} {best * 1e3:>9.1f} {median / six[0]:>9.1f}")
    print(f"(planner construction, once per sampler: {six_build * 1e3:.1f} ms; × dflash uses medians)")
    keys = ("six", "auto", "mixture", "seed_numpy", "hf")
    for key, (_, eff, (median, best)) in zip(keys, rows, strict=False):
        figures[key] = {"median": median, "best": best, "efficiency": eff, "ratio": median / six[0]}
    figures["six"]["build"] = six_build
    if "hf" in figures:
        figures["hf"]["ratio_auto"] = figures["hf"]["median"] / auto[0]
    figures["mixture"]["ratio_auto"] = mixture[0][0] / auto[0]
    ratio = mixture[0][0] / auto[0]
    print(f"(a mixture of 4 sources plans in {ratio:.2f}× the single store's time, 'auto' edges both)")
    part = lengths[: args.lhotse_samples]
    lhotse = lhotse_bucketing(part) if len(part) else None
    if lhotse is not None:
        seconds = lhotse[0] * len(lengths) / len(part)
        print(
            f"lhotse DynamicBucketingSampler, 6 buckets, on the first {len(part):,} samples: efficiency "
            f"{lhotse[1]:.3f}, {seconds:.1f} s per {len(lengths):,}-sample epoch "
            f"(scaled; {seconds / six[0]:,.0f}× dflash)"
        )
        figures["lhotse"] = {"samples": len(part), "seconds": seconds, "efficiency": lhotse[1]}

    print("\ntargets (median; best in brackets)")
    ok = lambda met: "MET" if met else "MISSED"  # noqa: E731
    print(f"  plan ≤ 10 ms per epoch:            {six[0] * 1e3:.1f} ms [{six[1] * 1e3:.1f}]  {ok(six[0] <= 0.010)}")
    if hf is not None:
        ratio, best_ratio = hf[0][0] / six[0], hf[0][1] / six[1]
        print(f"  ≥ 50× LengthGroupedSampler:        {ratio:.0f}× [{best_ratio:.0f}×]  {ok(ratio >= 50)}")
    print("\nplan time per rank vs world_size (every rank plans the one global epoch)")
    print(f"{'world_size':>10} {'median ms':>10} {'best ms':>8} {'steps per rank':>15}")
    for world in (1, 8, 64, 512):
        sampler = db.BucketSampler(lengths, max_tokens=MAX_TOKENS, world_size=world, rank=world - 1)
        median, best = timings(lambda i, s=sampler: s.plan(i + 1), max(3, args.repeats // 3))
        print(f"{world:>10} {median * 1e3:>10.1f} {best * 1e3:>8.1f} {sampler.plan(0).steps:>15,}")
        figures.setdefault("world", {})[str(world)] = {"median": median, "best": best}
    figures["steps"] = same_steps(lengths)
    if not args.no_big:
        limit = 2**30 / 2**20  # 1 GiB
        print(f"\n{args.big:,} lengths, a fresh process each (targets: ≤ 2 s an epoch, ≤ 1 GiB peak RSS)")
        kinds = (("padded", "seed"), ("packed", "seed"), ("padded", "uniform 1-4096 uint32"), ("padded", "mixture"))
        for mode, lengths_kind in kinds:
            big = big_run(args.big, mode, lengths_kind.split()[0])
            seconds, rss = big["seconds"], big["peak_rss_mib"]
            figures.setdefault("big", {"samples": args.big})[f"{mode}_{lengths_kind.split()[0]}"] = big
            print(
                f"  {mode}, default settings, {lengths_kind} lengths: {seconds:.2f} s "
                f"{'MET' if seconds <= 2 else 'MISSED'}, peak RSS {rss:.0f} MiB {'MET' if rss <= limit else 'MISSED'}"
            )
    write(args.json, "plan", figures, "python benchmarks/plan.py")


def mixture_times(samples: int, repeats: int) -> tuple[tuple[float, float], float]:
    """((median, best) seconds per epoch, efficiency) of the seed workload's four sources as a mixture."""
    mix = mixture_of(db.seed_mixture(samples, seed=0))
    sampler = db.BucketSampler(mix, max_tokens=MAX_TOKENS, world_size=WORLD)
    sampler.plan(0)  # sets the shared step count, as for the single store

    def one(i):
        sampler.set_epoch(i + 1)
        sampler.plan()

    return timings(one, repeats), sampler.plan(0).stats()["efficiency"]


def same_steps(lengths: np.ndarray, epochs: int = 10) -> dict:
    """What one step count for every epoch costs: batches split to reach it, extra forming passes."""
    print(f"\nevery epoch the same steps ({epochs} epochs, {WORLD} ranks)")
    print(
        f"{'plan':<34} {'batches':>9} {'split min/med/max':>18} {'extra steps':>12} "
        f"{'efficiency':>11} {'drawn again':>12}"
    )
    six = [0, 770, 1216, 1728, 2432, 3296, 8192]
    figures = {}
    for key, name, kwargs in (
        ("default", "default, accumulation 4", {"accumulation": 4}),
        ("packed", "packed rows", {"mode": "packed"}),
        ("seed", "the seed's 6 buckets", {"boundaries": six}),
    ):
        sampler = db.BucketSampler(lengths, max_tokens=MAX_TOKENS, world_size=WORLD, rank=0, **kwargs)
        stats = [sampler.plan(e).stats() for e in range(epochs)]
        assert len({s["steps"] for s in stats}) == 1, "epochs with different step counts"
        split = sorted(s["split_batches"] for s in stats)
        batches = stats[0]["batches"]
        extra = np.median(split) / (batches - np.median(split))
        eff = np.mean([s["utilization"] if "mode" in kwargs else s["efficiency"] for s in stats])
        again = sum(s["reformed"] > 0 for s in stats)
        print(
            f"{name:<34} {batches:>9,} {f'{split[0]}/{int(np.median(split))}/{split[-1]}':>18} {extra:>12.3%} "
            f"{eff:>11.3f} {f'{again} of {epochs}':>12}"
        )
        figures[key] = {
            "batches": batches, "split_min": split[0], "split_median": int(np.median(split)), "split_max": split[-1],
            "extra": extra, "efficiency": eff, "again": again, "epochs": epochs,
        }  # fmt: skip
    return figures


if __name__ == "__main__":
    main()

"""One plan per machine (``plan_dir``) against every process planning, measured on 8 processes at once.

    python benchmarks/shared.py                       # 20M seed lengths, 8 processes
    python benchmarks/shared.py --samples 100000000   # the size issue 43 names

Each run starts 8 fresh processes together (the ranks of one machine), each building the sampler of its rank
and asking for epoch 0's plan, then reading every index of it (so mapped pages count where they lie). Each
reports the seconds ``plan(0)`` took, the private memory it kept (``RssAnon``), the shared memory it maps
(``RssShmem``: the plan file, when it lies in ``/dev/shm``) and its peak during the call. The machine's
total is the private memory of all 8 plus the plan files once. A third arm gives every rank a read-only map of
one ``.npy`` of the lengths (``numpy.load(path, mmap_mode="r")``), which the planner borrows instead of copying;
``held`` is everything a rank keeps privately from before its lengths exist (their copy, the planner, the
plan), and the machine's total counts the lengths file once. All arms in the same run; ratios quoted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import dflash_batch as db
import numpy as np
from _figures import write

PROCESSES = 8

CHILD = """
import json, sys, time
import numpy as np
import dflash_batch as db

def status():
    out = {}
    for line in open("/proc/self/status"):
        key, value = line.split(":", 1)
        if key in ("RssAnon", "RssShmem", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    return out

n, rank, plan_dir, mapped = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] or None, sys.argv[4] or None
start = status()
# The lengths as a rank gets them: made here (a private copy), or a read-only map of one file.
lengths = np.load(mapped, mmap_mode="r") if mapped else db.seed_workload(n, seed=0).astype(np.uint16)
sampler = db.BucketSampler(lengths, max_tokens=16384, world_size=8, rank=rank, plan_dir=plan_dir)
del lengths
sampler.schedule.fingerprint  # hashed once per process, before the clock starts
before = status()
start_s = time.perf_counter()
plan = sampler.plan(0)
seconds = time.perf_counter() - start_s
int(plan.indices.sum()), int(plan.offsets[-1])  # every page of the plan read
after = status()
print(json.dumps({
    "seconds": seconds,
    "private_mib": after["RssAnon"] - before["RssAnon"],
    "shared_mib": after["RssShmem"] + after["RssFile"] - before["RssShmem"] - before["RssFile"],
    "held_mib": after["RssAnon"] - start["RssAnon"],
    "borrowed": sampler.schedule.lengths_borrowed,
}))
"""


def arm(n: int, plan_dir: str | None, mapped: str | None = None) -> list[dict]:
    """Starts the 8 ranks together; their reports."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(n), str(rank), plan_dir or "", mapped or ""],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for rank in range(PROCESSES)
    ]
    reports = []
    for child in children:
        out, _ = child.communicate(timeout=3600)
        if child.returncode != 0:
            raise SystemExit(f"a rank failed (exit {child.returncode})")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def summary(reports: list[dict], files_mib: float) -> dict:
    seconds = sorted(r["seconds"] for r in reports)
    private = sum(r["private_mib"] for r in reports)
    return {
        "slowest_seconds": seconds[-1],
        "fastest_seconds": seconds[0],
        "cpu_seconds": sum(seconds),
        "private_mib": private,
        "files_mib": files_mib,
        "machine_mib": private + files_mib,
        "largest_private_mib": max(r["private_mib"] for r in reports),
        # Everything a rank keeps privately from before its lengths exist: their copy, the planner, the plan.
        "held_mib": sum(r["held_mib"] for r in reports),
        "largest_held_mib": max(r["held_mib"] for r in reports),
        "held_by_rank_mib": [r["held_mib"] for r in reports],
        "machine_held_mib": sum(r["held_mib"] for r in reports) + files_mib,
        "borrowed": all(r["borrowed"] for r in reports),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000_000)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    parser.add_argument("--json", metavar="FILE", help="record the figures under 'shared' of FILE")
    args = parser.parse_args()
    plan_dir = tempfile.mkdtemp(prefix="dflash-bench-", dir=args.dir)
    lengths_dir = tempfile.mkdtemp(prefix="dflash-lengths-", dir=args.dir)
    try:
        own = summary(arm(args.samples, None), 0.0)
        shared_reports = arm(args.samples, plan_dir)
        files = sum(os.path.getsize(os.path.join(plan_dir, f)) for f in os.listdir(plan_dir)) / 2**20
        shared = summary(shared_reports, files)
        # The third arm: every rank maps one lengths file read-only (the planner borrows it).
        path = os.path.join(lengths_dir, "lengths.npy")
        np.save(path, db.seed_workload(args.samples, seed=0).astype(np.uint16))
        shutil.rmtree(plan_dir, ignore_errors=True)
        os.makedirs(plan_dir)
        mapped_reports = arm(args.samples, plan_dir, path)
        files = sum(os.path.getsize(os.path.join(plan_dir, f)) for f in os.listdir(plan_dir)) / 2**20
        mapped = summary(mapped_reports, files + os.path.getsize(path) / 2**20)
        assert mapped["borrowed"] and not shared["borrowed"]
    finally:
        shutil.rmtree(plan_dir, ignore_errors=True)
        shutil.rmtree(lengths_dir, ignore_errors=True)
    cores = os.cpu_count()
    print(f"{args.samples:,} seed lengths, {PROCESSES} processes at once, cores={cores}, plan_dir on {args.dir}")
    print(f"{'':34} {'every rank plans':>17} {'one plan per machine':>21} {'+ lengths mapped':>17}")
    rows = [
        ("slowest rank's plan(0), s", "slowest_seconds", ".2f"),
        ("fastest rank's plan(0), s", "fastest_seconds", ".2f"),
        ("CPU seconds, all ranks", "cpu_seconds", ".2f"),
        ("private memory plan(0) kept, MiB", "private_mib", ",.0f"),
        ("largest rank's, MiB", "largest_private_mib", ",.0f"),
        ("machine's memory for plans, MiB", "machine_mib", ",.0f"),
        ("private, lengths + planner + plan", "held_mib", ",.0f"),
        ("largest rank's, MiB", "largest_held_mib", ",.0f"),
        ("machine's memory, all, MiB", "machine_held_mib", ",.0f"),
    ]
    for label, key, fmt in rows:
        print(f"{label:34} {own[key]:>17{fmt}} {shared[key]:>21{fmt}} {mapped[key]:>17{fmt}}")
    print(
        f"ratios: one plan per machine {own['machine_mib'] / shared['machine_mib']:.1f}× less memory for plans, "
        f"{own['slowest_seconds'] / shared['slowest_seconds']:.1f}× faster slowest plan(0); lengths mapped: "
        f"{own['machine_held_mib'] / mapped['machine_held_mib']:.1f}× less memory in all"
    )
    write(
        args.json,
        "shared",
        {
            "samples": args.samples,
            "processes": PROCESSES,
            "every_rank": own,
            "per_machine": shared,
            "lengths_mapped": mapped,
        },
        f"python benchmarks/shared.py --samples {args.samples}",
    )


if __name__ == "__main__":
    main()

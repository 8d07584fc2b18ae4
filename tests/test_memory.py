"""Running out of memory is a MemoryError, not an abort: each case runs in a child process whose address
space is capped (``RLIMIT_AS``, what ``ulimit -v`` sets) a little above what it already uses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")

CHILD = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    import dflash_batch as db

    samples, headroom_mib, stage = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    lengths = np.empty(samples, dtype=np.uint16)
    for start in range(0, samples, 1 << 20):  # no large temporary
        stop = min(samples, start + (1 << 20))
        lengths[start:stop] = np.random.default_rng(start).integers(1, 4096, stop - start)
    if stage == "plan":
        sampler = db.BucketSampler(lengths[:1000], max_tokens=65536)  # threads and pools exist before the cap
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    cap = size + headroom_mib * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    try:
        sampler = db.BucketSampler(lengths, max_tokens=65536, threads=1)
        sampler.plan(0)
    except MemoryError as error:
        print("MemoryError:", error)
        sys.exit(0)
    print("planned")
    """
)


def run_child(samples: int, headroom_mib: int, stage: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(samples), str(headroom_mib), stage],
        capture_output=True,
        text=True,
        timeout=120,
        # Few threads and malloc arenas (each reserves 64 MB of address space), as on 2 cores.
        env={**os.environ, "RAYON_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2"},
    )


@pytest.mark.parametrize(
    "headroom, stage, expected",
    [
        # 50M uint16 lengths: the copy (100 MB) fits, the planner's preparation (200 MB) does not.
        (150, "new", "MemoryError: preparing the planner needs"),
        # Preparation fits; an epoch's working memory (8 bytes a sample, 400 MB) does not.
        (330, "plan", "MemoryError: planning an epoch needs"),
    ],
)
def test_too_little_address_space_is_a_memory_error_naming_the_work(headroom, stage, expected):
    child = run_child(50_000_000, headroom, stage)
    assert child.returncode == 0, f"rc {child.returncode} (a negative one is a signal): {child.stderr[-2000:]}"
    assert expected in child.stdout, child.stdout + child.stderr[-2000:]
    assert "ulimit -v" in child.stdout and "MiB" in child.stdout


def test_the_same_plan_runs_with_room():
    child = run_child(5_000_000, 600, "plan")
    assert child.returncode == 0 and "planned" in child.stdout, child.stderr[-2000:]

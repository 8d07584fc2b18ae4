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


# -- every data-sized entry point, called under a cap after being built without one (issue 29) --------

SWEEP = textwrap.dedent(
    """
    import pickle, resource, sys
    import numpy as np
    import dflash_batch as db

    entry, samples, headroom_mib, folder = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    lengths = np.random.default_rng(0).integers(1, 4096, samples).astype(np.uint32)
    budget = {"max_tokens": 65536, "seed": 1}
    variants = {
        "default": {}, "packed": {"mode": "packed"}, "trim": {"trim_steps": True, "world_size": 4},
        "truncate": {"mode": "packed", "oversize": "truncate", "max_tokens": 2048},
    }
    def write_index(path, counts):  # Megatron's layout: header, lengths, byte pointers, documents
        import struct
        pointers = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) * 2
        with open(path, "wb") as f:
            f.write(b"MMIDIDX\\x00\\x00" + struct.pack("<Q", 1) + struct.pack("<B", 8))
            f.write(struct.pack("<Q", len(counts)) + struct.pack("<Q", len(counts) + 1))
            f.write(counts.astype(np.int32).tobytes() + pointers.tobytes())
            f.write(np.arange(len(counts) + 1, dtype=np.int64).tobytes())

    kind, _, variant = entry.partition(":")
    if kind == "plan":  # a later epoch, as every epoch after the first of a real run
        sampler = db.BucketSampler(lengths, **{**budget, **variants[variant]})
        sampler.plan(0)
        call = lambda: sampler.plan(1)
    elif kind == "stats":
        plan = db.BucketSampler(lengths, **{**budget, **variants[variant]}).plan(0)
        call = plan.stats
    elif kind in ("label_tokens", "pickle"):
        sampler = db.BucketSampler(lengths, **budget)
        sampler.plan(0)
        call = (lambda: sampler.label_tokens(0)) if kind == "label_tokens" else (lambda: pickle.dumps(sampler))
    elif kind == "gather":
        import pyarrow as pa
        path = folder + "/tokens.arrow"
        table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(np.arange(samples + 1) * 2, pa.int32()),
                                                                 pa.array(np.ones(2 * samples, np.int32)))})
        with pa.ipc.new_file(path, table.schema) as writer:
            writer.write_table(table)
        store = db.TokenStore(path)
        rows = np.tile(np.arange(samples, dtype=np.int64), 4)
        call = lambda: store.gather(rows)
    elif kind == "read_lengths":
        import pyarrow as pa
        path = folder + "/lengths.arrow"
        table = pa.table({"seq_len": pa.array(lengths, pa.int64())})
        with pa.ipc.new_file(path, table.schema) as writer:
            writer.write_table(table)
        call = lambda: db.read_lengths(path, column="seq_len")
    elif kind == "seed_workload":
        call = lambda: db.seed_workload(samples * 8)
    elif kind in ("churn", "score"):
        from dflash_batch.tools import metrics
        a, b = (db.BucketSampler(lengths, **budget).plan(e) for e in (0, 1))
        if kind == "churn":
            call = lambda: a.churn(b)
        else:
            order, offsets, lens = a.indices, a.offsets, lengths.copy()
            call = lambda: metrics.window_tv(lens, order, offsets, 32)
    elif kind == "megatron":
        prefix = folder + "/pair"
        counts = lengths % 7 + 1
        (np.arange(int(counts.sum())) % 100).astype(np.uint16).tofile(prefix + ".bin")
        write_index(prefix + ".idx", counts)
        call = lambda: (db.read_lengths(prefix), db.read_documents(prefix), db.TokenStore(prefix))
    elif kind == "table":
        import pyarrow as pa
        table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(np.arange(samples + 1) * 2, pa.int32()),
                                                                 pa.array(np.ones(2 * samples, np.int32)))})
        call = lambda: (db.TokenStore(table), db.read_lengths(table, column="input_ids"))
    del lengths
    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + headroom_mib * 2**20, resource.getrlimit(resource.RLIMIT_AS)[1]))
    try:
        call()
    except MemoryError as error:
        print("MemoryError:", error)
        sys.exit(0)
    print("ok")
    """
)

ENTRIES = [
    "plan:default", "plan:packed", "plan:trim", "plan:truncate", "stats:default", "stats:packed",
    "label_tokens", "pickle", "gather", "read_lengths", "seed_workload", "churn", "score", "table",
    "megatron",
]  # fmt: skip
#: Headrooms in MiB above the process's size when the cap is set; ``make fuzz`` sweeps more.
HEADROOMS = [int(h) for h in os.environ.get("DFLASH_MEMORY_HEADROOMS", "0,12,40,200").split(",")]


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_entry_point_under_a_cap_returns_or_raises_memory_error(entry, tmp_path):
    """Built without a cap, then capped at each headroom and called: a result or a MemoryError naming
    the work, never a signal (Rust aborts on a failed allocation it did not reserve)."""
    samples = int(os.environ.get("DFLASH_MEMORY_SAMPLES", "1000000"))
    outcomes = []
    for headroom in HEADROOMS:
        child = subprocess.run(
            [sys.executable, "-c", SWEEP, entry, str(samples), str(headroom), str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "RAYON_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2"},
        )
        said = (child.stdout.strip().splitlines() or [""])[-1]
        assert child.returncode == 0, f"{entry} at {headroom} MiB: rc {child.returncode}: {child.stderr[-1500:]}"
        # numpy and pickle raise a bare MemoryError; the core names the work and the size
        assert said == "ok" or said.startswith("MemoryError"), f"{entry} at {headroom} MiB: {said!r}"
        outcomes.append(said.split(":")[0])
    assert outcomes[-1] == "ok" or samples > 1_000_000, f"{entry}: no headroom was enough: {outcomes}"

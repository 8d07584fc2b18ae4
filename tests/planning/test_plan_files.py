"""Files a ``plan_dir`` holds are opened without blocking and guarded after mapping (issue 59): a FIFO at
a plan file's or the lock's name is refused (it hung every rank of the machine, holding the directory's
lock), and a plan file truncated after it was mapped is a ``DataError`` when a batch is read, never the
SIGBUS that reading the lost pages would raise."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import dflash_batch as db
import numpy as np
import pytest

LENGTHS = db.seed_workload(3000, seed=1)


def sampler(plan_dir) -> db.BucketSampler:
    return db.BucketSampler(LENGTHS, max_tokens=16384, plan_dir=plan_dir)


def plan_file(plan_dir) -> str:
    return next(os.path.join(plan_dir, n) for n in os.listdir(plan_dir) if n.endswith(".plan"))


def plan_in_a_child(plan_dir, epoch: int) -> str:
    """What a child process planning ``epoch`` in ``plan_dir`` prints: the refusal's type and message. In a
    child under a time limit: the hang these tests regress would otherwise hang the suite."""
    code = textwrap.dedent(
        f"""
        import dflash_batch as db
        s = db.BucketSampler(db.seed_workload(3000, seed=1), max_tokens=16384, plan_dir={str(plan_dir)!r})
        try:
            s.plan({epoch})
        except (db.DataError, OSError) as error:
            print(type(error).__name__, error)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_fifo_at_the_plan_files_name_is_refused_not_waited_on(tmp_path):
    sampler(tmp_path).plan(0)
    path = plan_file(tmp_path)
    os.remove(path)
    os.mkfifo(path)
    out = plan_in_a_child(tmp_path, 0)
    assert out.startswith("DataError") and "not a regular file" in out, out


def test_a_fifo_at_the_locks_name_is_refused(tmp_path):
    sampler(tmp_path).plan(0)
    lock = next(os.path.join(tmp_path, n) for n in os.listdir(tmp_path) if n.endswith(".lock"))
    os.remove(lock)
    os.mkfifo(lock)
    out = plan_in_a_child(tmp_path, 1)
    assert out.split()[0] in ("DataError", "OSError") and ".lock" in out, out


def test_a_plan_file_truncated_after_mapping_is_a_data_error_not_a_signal(tmp_path):
    plan = sampler(tmp_path).plan(0)
    first = plan[0].copy()
    os.truncate(plan_file(tmp_path), 1000)
    for read in (lambda: plan[1], lambda: plan.indices, lambda: plan.offsets):
        with pytest.raises(db.DataError, match="truncated to 1000 bytes after this process mapped"):
            read()
    assert len(first) > 0


def test_an_untouched_mapped_plan_reads_as_planned(tmp_path):
    plan = sampler(tmp_path).plan(0)
    own = db.BucketSampler(LENGTHS, max_tokens=16384).plan(0)
    assert np.array_equal(plan.indices, own.indices) and np.array_equal(plan[3], own[3])

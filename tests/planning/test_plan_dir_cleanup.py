"""A ``plan_dir`` after a run (issue 59): the last epochs' plans (one planned ahead, never trained) and the
lock stayed in ``/dev/shm`` — ~2 × 4.4 GiB at 1B samples — with no cleanup. Now the last process of a
planner to exit normally removes them; a killed one leaves them for the next run (documented)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import sys
    import dflash_batch as db
    sampler = db.BucketSampler(db.seed_workload(3000, seed=1), max_tokens=16384, plan_dir=sys.argv[1])
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for _ in sampler:  # plans the next epoch ahead while this one is iterated
            pass
    print("ready", flush=True)
    if len(sys.argv) > 2:
        sys.stdin.readline()  # held until the test says
    """
)


def ours(plan_dir) -> list[str]:
    return sorted(n for n in os.listdir(plan_dir) if n.startswith("dflash-"))


def start(plan_dir, hold: bool = False) -> subprocess.Popen:
    args = [sys.executable, "-c", CHILD, str(plan_dir)] + (["hold"] if hold else [])
    child = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def test_a_normal_exit_leaves_no_plan_lock_or_users_file(tmp_path):
    child = start(tmp_path)
    assert child.wait(timeout=120) == 0
    assert ours(tmp_path) == []


def test_the_plans_stay_while_another_process_uses_them_and_go_with_the_last(tmp_path):
    first = start(tmp_path, hold=True)
    second = start(tmp_path)
    assert second.wait(timeout=120) == 0
    left = ours(tmp_path)
    assert any(n.endswith(".plan") for n in left) and any(n.endswith(".lock") for n in left), left
    first.communicate("go\n", timeout=120)
    assert first.returncode == 0
    assert ours(tmp_path) == []


def test_a_killed_process_leaves_its_plans_for_the_next_run_to_use(tmp_path):
    child = start(tmp_path, hold=True)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    left = ours(tmp_path)
    assert any(n.endswith(".plan") for n in left), left
    # The next run of the same data and settings uses them, then clears them at its exit.
    assert start(tmp_path).wait(timeout=120) == 0
    assert ours(tmp_path) == []

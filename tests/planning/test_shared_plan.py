"""One plan per machine (``plan_dir``, ``rust/core/src/shared/``): the shared plan is the plan each process
would make, bit for bit, through every call a trainer makes; a file there that is not the plan is refused;
a planner killed mid-write leaves nothing another process accepts."""

from __future__ import annotations

import fcntl
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time

import dflash_batch as db
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st


def _same(a: db.Plan, b: db.Plan) -> bool:
    return np.array_equal(a.offsets, b.offsets) and np.array_equal(a.indices, b.indices)


def _files(directory) -> list[str]:
    return sorted(os.listdir(directory))


@settings(max_examples=40, deadline=None)
# A first epoch refused: the users file is already there (found by hypothesis in the fast lane).
@example(lengths=[1, 1, 1, 1366, 2049, 2049, 1, 2049], world=3, seed=0, mode="padded", epochs=[0])
@given(
    lengths=st.lists(st.integers(1, 4000), min_size=8, max_size=300),
    world=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    mode=st.sampled_from(["padded", "packed"]),
    epochs=st.lists(st.integers(0, 6), min_size=1, max_size=4),
)
def test_the_shared_plan_is_the_plan_every_process_makes(tmp_path_factory, lengths, world, seed, mode, epochs):
    directory = tmp_path_factory.mktemp("plans")
    kwargs = dict(max_tokens=4096, world_size=world, seed=seed, mode=mode, rank=0)
    own = db.BucketSampler(np.array(lengths), **kwargs)
    shared = db.BucketSampler(np.array(lengths), plan_dir=directory, **kwargs)
    for epoch in epochs:
        try:
            mine = own.plan(epoch)
        except db.PlanError as refused:  # too few samples for the ranks: refused alike, with the same words
            with pytest.raises(db.PlanError) as caught:
                shared.plan(epoch)
            assert str(caught.value) == str(refused)
            # The lock and the users file (held while this process lives: plan_files.py) are no plans.
            published = [f for f in _files(directory) if not f.endswith((".lock", ".users"))]
            assert not published, "nothing published"
            return
        theirs = shared.plan(epoch)
        assert _same(mine, theirs)
        assert theirs.stats() == mine.stats()
        assert not theirs.indices.flags.writeable and not theirs.offsets.flags.writeable
        own.set_epoch(epoch), shared.set_epoch(epoch)
        assert [b.tolist() for b in shared] == [b.tolist() for b in own]


def test_a_trainers_calls_see_the_same_batches_and_a_resume_the_same_rest(tmp_path):
    lengths = db.seed_workload(6000, seed=1)
    kwargs = dict(max_tokens=16384, world_size=2, rank=1, accumulation=2)
    own = db.BucketSampler(lengths, **kwargs)
    shared = db.BucketSampler(lengths, plan_dir=tmp_path, **kwargs)
    assert len(shared) == len(own)
    for epoch in range(3):
        own.set_epoch(epoch), shared.set_epoch(epoch)
        it_own, it_shared = iter(own), iter(shared)
        for _ in range(5):
            assert np.array_equal(next(it_own), next(it_shared))
        state = shared.state_dict()
        assert state == own.state_dict()
        resumed = db.BucketSampler(lengths, plan_dir=tmp_path, **kwargs)
        resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
        assert [b.tolist() for b in resumed] == [b.tolist() for b in it_own]
    # A pickled copy (a DataLoader worker's) shares through the same directory.
    copy = pickle.loads(pickle.dumps(shared))
    assert copy.schedule.plan_dir == os.fspath(tmp_path)
    assert _same(copy.plan(2), own.plan(2))


def test_a_held_plan_stays_valid_after_later_epochs_delete_its_file(tmp_path):
    lengths = db.seed_workload(4000, seed=2)
    sampler = db.BucketSampler(lengths, max_tokens=16384, plan_dir=tmp_path)
    held = sampler.plan(0)
    first_batch, indices = np.array(held[0]), np.array(held.indices)
    sampler.plan(1), sampler.plan(2)
    plans = [f for f in _files(tmp_path) if f.endswith(".plan")]
    assert [f[-8:] for f in plans] == ["-e1.plan", "-e2.plan"], "epoch 0's file is deleted"
    assert np.array_equal(held[0], first_batch) and np.array_equal(held.indices, indices)


def test_the_next_epoch_is_planned_while_this_one_trains(tmp_path):
    lengths = db.seed_workload(20000, seed=9)
    own = db.BucketSampler(lengths, max_tokens=16384, world_size=2, rank=0)
    sampler = db.BucketSampler(lengths, max_tokens=16384, world_size=2, rank=0, plan_dir=tmp_path)
    batches = iter(sampler)
    next(batches)
    ahead = sampler.schedule._ahead[1]  # started by the first batch of epoch 0
    assert _same(ahead.result(timeout=120), own.plan(1))
    rest = list(batches)
    sampler.set_epoch(1), own.set_epoch(1)
    assert [b.tolist() for b in sampler] == [b.tolist() for b in own]
    assert len(rest) == len(own) - 1


def test_a_fork_while_the_next_epoch_is_planned_does_not_inherit_the_lock(tmp_path):
    lengths = db.seed_workload(2_000_000, seed=10)
    sampler = db.BucketSampler(lengths, max_tokens=16384, plan_dir=tmp_path)
    next(iter(sampler))  # epoch 1 is being planned in the background now
    pid = os.fork()
    if pid == 0:  # the child plans epoch 2 through the same directory, which needs the lock
        try:
            sampler.schedule.plan(2)
        finally:
            os._exit(0)
    waited: list[tuple[int, int]] = []
    waiter = threading.Thread(target=lambda: waited.append(os.waitpid(pid, 0)))
    waiter.start()
    waiter.join(timeout=120)
    if waiter.is_alive():
        os.kill(pid, signal.SIGKILL)
        waiter.join()
        pytest.fail("the forked child waited for a lock held by a thread it does not have")
    assert os.waitstatus_to_exitcode(waited[0][1]) == 0


def _plan_file(directory, epoch: int = 0) -> str:
    (name,) = [f for f in _files(directory) if f.endswith(f"-e{epoch}.plan")]
    return os.path.join(directory, name)


def test_a_file_of_other_settings_or_another_epoch_at_the_name_is_refused(tmp_path):
    lengths = db.seed_workload(3000, seed=3)
    ours = db.BucketSampler(lengths, max_tokens=16384, seed=1, plan_dir=tmp_path / "a")
    theirs = db.BucketSampler(lengths, max_tokens=16384, seed=2, plan_dir=tmp_path / "b")
    ours.plan(0), theirs.plan(0)
    path = _plan_file(tmp_path / "a")
    os.replace(_plan_file(tmp_path / "b"), path)
    fresh = db.BucketSampler(lengths, max_tokens=16384, seed=1, plan_dir=tmp_path / "a")
    with pytest.raises(db.DataError, match="fingerprint") as caught:
        fresh.plan(0)
    assert caught.value.kind == "shared_plan" and caught.value.path == path
    assert "delete it" in str(caught.value)


@pytest.mark.parametrize("change", ["a byte of the data", "a byte of the header", "cut short", "emptied"])
def test_a_changed_or_cut_file_is_refused(tmp_path, change):
    lengths = db.seed_workload(3000, seed=4)
    db.BucketSampler(lengths, max_tokens=16384, plan_dir=tmp_path).plan(0)
    path = _plan_file(tmp_path)
    data = bytearray(open(path, "rb").read())
    if change == "a byte of the data":
        data[-4] ^= 1
    elif change == "a byte of the header":
        data[40] ^= 1
    elif change == "cut short":
        data = data[:-8]
    else:
        data = bytearray()
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(db.DataError) as caught:
        db.BucketSampler(lengths, max_tokens=16384, plan_dir=tmp_path).plan(0)
    assert caught.value.kind == "shared_plan"


def test_a_plan_dir_that_cannot_be_used_is_an_os_error_naming_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"x")
    sampler = db.BucketSampler(db.seed_workload(2000, seed=5), max_tokens=16384, plan_dir=blocker / "plans")
    with pytest.raises(OSError, match="plan_dir") as caught:
        sampler.plan(0)
    assert caught.value.kind == "shared_plan" and caught.value.path.endswith("plans")


@pytest.mark.parametrize(("plan_dir", "error"), [(3, TypeError), (b"/dev/shm", TypeError), ("", ValueError)])
def test_a_plan_dir_that_is_not_a_path_is_refused(plan_dir, error):
    with pytest.raises(error, match="plan_dir"):
        db.BucketSampler(np.array([5, 6, 7, 8]), max_tokens=64, plan_dir=plan_dir)


_CHILD = """
import hashlib, sys
import dflash_batch as db
n, directory, epochs = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
lengths = db.seed_workload(n, seed=7)
kwargs = dict(max_tokens=16384, world_size=8, rank=int(sys.argv[4]) if len(sys.argv) > 4 else 0)
shared = db.BucketSampler(lengths, plan_dir=directory, **kwargs)
own = db.BucketSampler(lengths, **kwargs)
for epoch in range(epochs):
    a, b = shared.plan(epoch), own.plan(epoch)
    digest = lambda p: hashlib.sha256(p.offsets.tobytes() + p.indices.tobytes()).hexdigest()
    print(epoch, digest(a), digest(b), flush=True)
"""


@pytest.mark.multiprocess
def test_eight_processes_share_one_plan_equal_to_each_ones_own(tmp_path):
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, "300000", str(tmp_path), "3", str(rank)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(8)
    ]
    lines = []
    for child in children:
        out, _ = child.communicate(timeout=600)
        assert child.returncode == 0
        lines.append(out.split("\n")[:-1])
    for per_child in lines:
        for line in per_child:
            _, shared, own = line.split()
            assert shared == own
    assert len({tuple(per_child) for per_child in lines}) == 1, "every process mapped the same plans"


# Registered before dflash_batch's own exit handlers, so it runs after them (atexit is last in, first
# out): a plan still being made here would return from Rust into a finalizing interpreter, which ends its
# thread with pthread_exit, and the unwinding through pyo3's frames aborts the process.
_EXIT_CHILD = """
import atexit, sys

def at_exit():
    print("made before finalizing:", sampler.schedule_ahead.done(), flush=True)

atexit.register(at_exit)
import dflash_batch as db

lengths = db.seed_workload(int(sys.argv[2]), seed=7)
sampler = db.BucketSampler(lengths, max_tokens=16384, world_size=8, rank=0, plan_dir=sys.argv[1])
sampler.schedule.plan_ahead(1)
sampler.schedule_ahead = sampler.schedule._ahead[1]
"""


def test_exit_waits_for_the_plan_being_made_ahead(tmp_path):
    # Regression: a script that ended while the next epoch was planned ahead aborted at exit ("FATAL:
    # exception not rethrown") now and then, in the killed-planner test below.
    fingerprint = db.BucketSampler(db.seed_workload(5_000_000, seed=7), max_tokens=16384, world_size=8).schedule
    with open(tmp_path / f"dflash-{fingerprint.fingerprint}.users", "ab") as users:
        fcntl.flock(users, fcntl.LOCK_SH)  # another user of the plans: the child's exit leaves them
        done = subprocess.run(
            [sys.executable, "-c", _EXIT_CHILD, str(tmp_path), "5000000"], capture_output=True, text=True, timeout=300
        )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.strip().splitlines()[-1] == "made before finalizing: True", done.stdout
    assert any(f.endswith("-e1.plan") for f in _files(tmp_path)), "the plan was finished and published"


def test_exit_waits_a_bounded_time_for_a_plan_another_process_holds_up(tmp_path):
    # Another process of the machine holds the directory's lock (it plans, or it hangs): exit waits
    # _EXIT_WAIT_S for the plan being made ahead, then says so and leaves.
    short_wait = "import dflash_batch as db\nimport dflash_batch.base.runtime as runtime\nruntime._EXIT_WAIT_S = 0.5"
    child = _EXIT_CHILD.replace("import dflash_batch as db", short_wait)
    same = db.BucketSampler(db.seed_workload(50_000, seed=7), max_tokens=16384, world_size=8)
    fingerprint = same.schedule.fingerprint
    with open(tmp_path / f"dflash-{fingerprint}.lock", "ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = subprocess.run(
            [sys.executable, "-c", child, str(tmp_path), "50000"], capture_output=True, text=True, timeout=300
        )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.strip().splitlines()[-1] == "made before finalizing: False", done.stdout
    assert "plan is still being made after" in done.stderr and "exiting without it" in done.stderr, done.stderr
    assert not any(f.endswith(".plan") for f in _files(tmp_path))


@pytest.mark.multiprocess
def test_a_planner_killed_mid_write_leaves_no_file_another_accepts(tmp_path):
    # Large enough that writing takes a while: the child is killed once its temporary file exists.
    child = subprocess.Popen([sys.executable, "-c", _CHILD, "20000000", str(tmp_path), "1"], stdout=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not any(".tmp-" in f for f in _files(tmp_path)):
        assert child.poll() is None, "the child finished before it could be killed"
        assert time.monotonic() < deadline, "the child never started writing"
        time.sleep(0.001)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert not any(f.endswith(".plan") for f in _files(tmp_path)), "a killed writer published nothing"
    # The next process takes the lock (released by the kernel), plans the epoch itself and tidies.
    script = textwrap.dedent(_CHILD)
    out = subprocess.run(
        [sys.executable, "-c", script, "20000000", str(tmp_path), "1"],
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout  # fmt: skip
    _, shared, own = out.split()
    assert shared == own
    assert not any(".tmp-" in f for f in _files(tmp_path))


_CAPPED = """
import hashlib, resource, sys
import numpy as np
import dflash_batch as db
directory, extra_mib = sys.argv[1], int(sys.argv[2])
lengths = db.seed_workload(100_000_000, seed=11).astype(np.uint16)
sampler = db.BucketSampler(lengths, max_tokens=16384, world_size=8, plan_dir=directory)
del lengths
sampler.schedule.fingerprint  # hashed before the cap: a pass over the lengths, no memory
if sys.argv[3] == "plan":
    plan = sampler.schedule.plan(0)  # the first process: plans and publishes, uncapped
else:
    size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    plan_file = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory) if f.endswith(".plan"))
    resource.setrlimit(resource.RLIMIT_AS, (size + plan_file + extra_mib * 2**20, resource.RLIM_INFINITY))
    plan = sampler.schedule.plan(0)
digest = hashlib.sha256(plan.offsets.data)  # read in place: a copy would not fit under the cap
digest.update(plan.indices.data)
print(digest.hexdigest())
""".replace("import hashlib, resource, sys", "import hashlib, os, resource, sys")


@pytest.mark.slow
def test_at_100m_samples_a_rank_that_maps_the_plan_needs_64_mib_beyond_it(tmp_path):
    """The issue's memory target for the ranks that do not plan: beyond the lengths it was built from and the
    plan file it maps, a rank's address space grows by at most 64 MiB to take its epoch (``RLIMIT_AS``
    counts the map, so the cap is the process's size + the plan file + 64 MiB)."""
    run = [sys.executable, "-c", _CAPPED, str(tmp_path), "64"]
    keep = {**os.environ, "DFLASH_BATCH_KEEP_PLANS": "1"}  # the planner's exit leaves the plan for the finder
    first = subprocess.run([*run, "plan"], capture_output=True, text=True, timeout=900, check=True, env=keep).stdout
    found = subprocess.run([*run, "find"], capture_output=True, text=True, timeout=900, env=keep)
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout == first
    # The cap without most of the plan file's room: the map does not fit, a MemoryError naming it, never a crash.
    starved = subprocess.run(
        [sys.executable, "-c", _CAPPED, str(tmp_path), "-300", "find"],
        capture_output=True,
        text=True,
        timeout=900,
        env=keep,
    )
    assert starved.returncode == 1 and "MemoryError: mapping the shared plan" in starved.stderr, starved.stderr[-2000:]


def test_a_next_epoch_that_ran_out_of_memory_ahead_is_made_again_when_asked(tmp_path):
    """Made ahead, an epoch's plan is made beside the current one; a MemoryError then is not the epoch's
    answer: asked for, it is made again (alone). Any other error made ahead is raised as it was."""
    from concurrent.futures import Future

    lengths = db.seed_workload(3000, seed=12)
    schedule = db.BucketSampler(lengths, max_tokens=16384, plan_dir=tmp_path).schedule
    own = db.BucketSampler(lengths, max_tokens=16384)
    for epoch, error in ((3, MemoryError("made beside another plan")), (4, db.PlanError("as made"))):
        failed: Future = Future()
        failed.set_exception(error)
        schedule._ahead[epoch] = failed
        if isinstance(error, MemoryError):
            assert _same(schedule.plan(epoch), own.plan(epoch))
        else:
            with pytest.raises(db.PlanError, match="as made"):
                schedule.plan(epoch)


def test_the_next_epoch_is_not_made_ahead_under_another_price(tmp_path):
    """A rank price set for the next epoch plans it by another schedule (another planner): making it ahead
    would build that planner and evict the current one's from the position's cache, so it is made when
    asked instead — and is still the plan a sampler without plan_dir makes at that price."""
    lengths = db.seed_workload(4000, seed=13)
    kwargs = dict(max_tokens=16384, world_size=2, rank=0)
    sampler = db.BucketSampler(lengths, plan_dir=tmp_path, **kwargs)
    own = db.BucketSampler(lengths, **kwargs)
    for s in (sampler, own):
        s.position.price_from(1, (1.0, 1 / 4096))  # builds the priced schedule, checked
    priced = sampler.position.schedule_at(1)
    next(iter(sampler))
    assert sampler.schedule._ahead == {} and priced._ahead == {}, "nothing made ahead across a price change"
    assert sampler.position.schedule_at(1) is priced
    assert _same(sampler.plan(1), own.plan(1))
    sampler.set_epoch(1)
    next(iter(sampler))  # epoch 2 has epoch 1's price: made ahead by the priced schedule
    assert sampler.position.schedule_at(2) is priced and 2 in priced._ahead
    own.set_epoch(2)
    assert _same(priced._ahead[2].result(timeout=120), own.plan(2))


def test_a_mixtures_shared_plan_is_its_own_and_other_weights_plan_apart(tmp_path):
    parts = db.seed_mixture(6000, seed=5)

    def sampler(weights, **kwargs):
        mixture = db.Mixture({name: (lengths, w) for (name, lengths), w in zip(parts.items(), weights, strict=True)})
        return db.BucketSampler(mixture, max_tokens=16384, world_size=2, rank=1, **kwargs)

    weights, others = (0.3, 0.3, 0.25, 0.15), (0.4, 0.2, 0.3, 0.1)
    own, shared = sampler(weights), sampler(weights, plan_dir=tmp_path)
    for epoch in range(3):
        assert _same(own.plan(epoch), shared.plan(epoch))
        assert shared.plan(epoch).stats() == own.plan(epoch).stats()
    stems = {f.split("-r")[0].removesuffix(".lock") for f in _files(tmp_path) if not f.endswith(".users")}
    other_own, other_shared = sampler(others), sampler(others, plan_dir=tmp_path)
    assert _same(other_own.plan(1), other_shared.plan(1)), "another mixture's file is not taken for its plan"
    assert not _same(other_shared.plan(1), shared.plan(1))
    now = {f.split("-r")[0].removesuffix(".lock") for f in _files(tmp_path) if not f.endswith(".users")}
    assert len(now - stems) == 1, "its own stem"
    # Mid-epoch state of the shared sampler resumes on a fresh one to exactly the rest of its batches.
    shared.set_epoch(2)
    batches = iter(shared)
    seen = [next(batches).tolist() for _ in range(3)]
    state = shared.state_dict()
    resumed = sampler(weights, plan_dir=tmp_path)
    resumed.load_state_dict(state)
    own.set_epoch(2)
    every = [b.tolist() for b in own]
    assert every[:3] == seen and [b.tolist() for b in resumed] == every[3:]

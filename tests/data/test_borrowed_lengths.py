"""Lengths the planner borrows (``rust/python/src/borrowed.rs``): a read-only ``numpy.memmap`` of ``uint16``
or ``uint32`` lengths is planned from in place, so the ranks of a machine share one copy in the page cache.
Plans are the ones a copy makes, bit for bit; only maps nothing in the process can write are borrowed; a
file truncated or rewritten under the map is an error naming it before any length is read, never a signal
or plans of other lengths."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import dflash_batch as db
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def _borrowed(sampler: db.BucketSampler) -> bool:
    return sampler.schedule.lengths_borrowed


def _same(a: db.Plan, b: db.Plan) -> bool:
    return np.array_equal(a.offsets, b.offsets) and np.array_equal(a.indices, b.indices)


def _saved(directory, lengths: np.ndarray, name: str = "lengths.npy") -> str:
    path = os.path.join(directory, name)
    np.save(path, lengths)
    return path


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 70_000), min_size=8, max_size=300),
    wide=st.booleans(),
    world=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    mode=st.sampled_from(["padded", "packed"]),
    epochs=st.lists(st.integers(0, 6), min_size=1, max_size=3),
)
def test_a_borrowed_map_plans_as_a_copy_does(tmp_path_factory, lengths, wide, world, seed, mode, epochs):
    dtype = np.uint32 if wide else np.uint16
    values = np.minimum(np.array(lengths), np.iinfo(dtype).max).astype(dtype)
    path = _saved(tmp_path_factory.mktemp("lengths"), values)
    kwargs = dict(max_tokens=80_000, world_size=world, seed=seed, mode=mode, rank=0)
    copied = db.BucketSampler(values.copy(), **kwargs)
    mapped = db.BucketSampler(np.load(path, mmap_mode="r"), **kwargs)
    assert _borrowed(mapped) and not _borrowed(copied)
    assert mapped.schedule.fingerprint == copied.schedule.fingerprint
    assert len(mapped) == len(copied)
    for epoch in epochs:
        try:
            mine = copied.plan(epoch)
        except db.PlanError as refused:
            with pytest.raises(db.PlanError) as caught:
                mapped.plan(epoch)
            assert str(caught.value) == str(refused)
            return
        theirs = mapped.plan(epoch)
        assert _same(mine, theirs) and theirs.stats() == mine.stats()
        mapped.set_epoch(epoch), copied.set_epoch(epoch)
        assert [b.tolist() for b in mapped] == [b.tolist() for b in copied]
    state = mapped.state_dict()
    again = db.BucketSampler(np.load(path, mmap_mode="r"), **kwargs)
    again.load_state_dict(state)  # the same fingerprint: a resume from a copy's state and back
    copied.load_state_dict(state)


def _forms(path: str, values: np.ndarray) -> dict:
    def read_only_copy():
        array = values.copy()
        array.setflags(write=False)  # can be made writable again: copied
        return array

    return {
        "np.load r": (lambda: np.load(path, mmap_mode="r"), True),
        "np.memmap r": (lambda: np.memmap(path, dtype=values.dtype, mode="r", offset=128, shape=values.shape), True),
        "a view of r": (lambda: np.load(path, mmap_mode="r")[:], True),
        "np.load r+": (lambda: np.load(path, mmap_mode="r+"), False),
        "np.load c (copy on write)": (lambda: np.load(path, mmap_mode="c"), False),
        "a read-only copy": (read_only_copy, False),
        "a strided view of r": (lambda: np.load(path, mmap_mode="r")[::2], False),
        "int64 from r": (lambda: np.load(path, mmap_mode="r").astype(np.int64), False),
        "a list": (lambda: values.tolist(), False),
    }


@pytest.mark.parametrize("form", list(_forms("", np.zeros(1, dtype=np.uint16))), ids=lambda f: f.replace(" ", "-"))
def test_only_a_map_nothing_can_write_is_borrowed(tmp_path, form):
    values = db.seed_workload(5_000, seed=3).astype(np.uint16)
    path = _saved(tmp_path, values)
    make, borrowed = _forms(path, values)[form]
    array = make()
    sampler = db.BucketSampler(array, max_tokens=16384, seed=2)
    assert _borrowed(sampler) is borrowed
    expected = values[::2] if "strided" in form else values
    assert _same(sampler.plan(1), db.BucketSampler(expected.copy(), max_tokens=16384, seed=2).plan(1))
    if not borrowed and isinstance(array, np.memmap) and array.flags.writeable:
        array[:] = 1  # a writable map changed afterwards: the copy planned from is intact
        assert _same(sampler.plan(1), db.BucketSampler(expected.copy(), max_tokens=16384, seed=2).plan(1))


def test_a_bad_length_in_a_map_is_named_as_in_a_copy(tmp_path):
    values = np.array([5, 9, 0, 4], dtype=np.uint16)
    path = _saved(tmp_path, values)
    with pytest.raises(db.PlanError, match="length 0 at row 2") as mapped:
        db.BucketSampler(np.load(path, mmap_mode="r"), max_tokens=64)
    with pytest.raises(db.PlanError) as copied:
        db.BucketSampler(values, max_tokens=64)
    assert str(mapped.value) == str(copied.value)


# Each call a trainer makes after the file changed, in a child: a SIGBUS there is a signal, not a pass.
CHANGED = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    import dflash_batch as db

    path, change, call = sys.argv[1], sys.argv[2], sys.argv[3]
    sampler = db.BucketSampler(np.load(path, mmap_mode="r"), max_tokens=16384, world_size=2, rank=0, seed=1)
    plan = sampler.plan(0)
    size = os.path.getsize(path)
    if change == "truncated":
        with open(path, "r+b") as f:
            f.truncate(size // 3)
    elif change == "rewritten":
        with open(path, "r+b") as f:
            f.seek(size - 2)
            f.write(np.array([7], dtype=np.uint16).tobytes())
        stat = os.stat(path)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    elif change == "replaced":  # a new file renamed over the old name: the map keeps the old one
        np.save(path + ".new.npy", np.ones(size // 2, dtype=np.uint16))
        os.replace(path + ".new.npy", path)
    calls = {
        "plan": lambda: sampler.plan(1),
        "len": lambda: len(sampler),
        "iterate": lambda: next(iter(sampler)),
        "stats": lambda: plan.stats(),
        "fingerprint": lambda: sampler.schedule._planner.fingerprint,
        "state_dict+resume": lambda: sampler.load_state_dict({**sampler.state_dict(), "epoch": 1}),
        "re-priced": lambda: sampler.schedule.replace(accumulation=4).plan(1),
    }
    try:
        calls[call]()
    except db.DataError as e:
        print("DataError", e)
    else:
        print("ok")
    """
)


@pytest.mark.parametrize("call", ["plan", "len", "iterate", "stats", "fingerprint", "state_dict+resume", "re-priced"])
@pytest.mark.parametrize("change", ["truncated", "rewritten", "replaced"])
def test_a_file_changed_under_the_map_is_an_error_naming_it(tmp_path, change, call):
    path = _saved(tmp_path, db.seed_workload(300_000, seed=4).astype(np.uint16))
    done = subprocess.run(
        [sys.executable, "-c", CHANGED, path, change, call], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    out = done.stdout.strip().splitlines()[-1]
    if change == "replaced":
        assert out == "ok"  # the map still holds the old file's pages, and the check the old inode
    elif call in ("plan", "re-priced"):  # a new epoch, or a new planner, reads every length: refused
        assert out.startswith("DataError") and path in out and "changed while it was mapped" in out, out
    else:  # refused where the call reads lengths; fine where it uses what was planned before
        assert out == "ok" or (out.startswith("DataError") and path in out), out


MEMORY = textwrap.dedent(
    """
    import sys
    import numpy as np
    import dflash_batch as db

    def anon():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024

    path, mapped = sys.argv[1], sys.argv[2] == "1"
    lengths = np.load(path, mmap_mode="r")
    if not mapped:
        lengths = np.array(lengths)
    before = anon()
    sampler = db.BucketSampler(lengths, max_tokens=16384, world_size=8, rank=0, seed=0)
    print(anon() - before, int(sampler.schedule.lengths_borrowed))
    """
)


def test_a_borrowed_map_keeps_no_copy_of_the_lengths(tmp_path):
    """20M lengths (past the epochs formed bucket by bucket, whose working memory is per sample): a copy
    costs the planner 2 bytes a sample of private memory (40 MB); a borrowed map, less than a tenth of it."""
    n = 20_000_000
    path = _saved(tmp_path, db.seed_workload(n, seed=0).astype(np.uint16))

    def grown(mapped: bool) -> int:
        done = subprocess.run(
            [sys.executable, "-c", MEMORY, path, "1" if mapped else "0"], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        bytes_, borrowed = map(int, done.stdout.split())
        assert borrowed == int(mapped)
        return bytes_

    copied, borrowed = grown(False), grown(True)
    assert copied >= 2 * n * 0.9, copied
    assert borrowed < 2 * n / 10, borrowed


def test_a_changed_or_pickled_schedule_maps_the_file_again(tmp_path):
    """Re-pricing, changed settings and pickles (a spawned DataLoader worker) keep the lengths borrowed:
    a pickle carries where they lie in the file, not a copy of them, and plans as the original does."""
    values = db.seed_workload(50_000, seed=6).astype(np.uint16)
    path = _saved(tmp_path, values)
    maps = (np.load(path, mmap_mode="r"), np.load(path, mmap_mode="r")[100:], np.asarray(np.load(path, "r")))
    for mapped in maps:
        sampler = db.BucketSampler(mapped, max_tokens=16384, world_size=2, rank=1, seed=4)
        assert _borrowed(sampler)
        changed = sampler.schedule.replace(accumulation=4)
        assert changed.lengths_borrowed and changed.fingerprint != sampler.schedule.fingerprint
        blob = pickle.dumps(sampler)
        assert len(blob) < 5_000, len(blob)  # no copy of 50K lengths inside
        again = pickle.loads(blob)
        assert _borrowed(again) and again.schedule.fingerprint == sampler.schedule.fingerprint
        assert _same(again.plan(2), sampler.plan(2))
        expected = values[100:] if len(mapped) < len(values) else values
        assert _same(again.plan(2), db.BucketSampler(expected.copy(), max_tokens=16384, world_size=2, seed=4).plan(2))


def test_a_pickle_whose_file_was_replaced_is_refused(tmp_path):
    path = _saved(tmp_path, db.seed_workload(5_000, seed=7).astype(np.uint16))
    sampler = db.BucketSampler(np.load(path, mmap_mode="r"), max_tokens=16384, seed=1)
    blob = pickle.dumps(sampler)
    np.save(path + ".new.npy", db.seed_workload(5_000, seed=8).astype(np.uint16))
    os.replace(path + ".new.npy", path)
    assert _same(sampler.plan(0), sampler.plan(0))  # the sampler keeps the old file's map
    with pytest.raises(db.DataError, match="changed since this sampler was pickled"):
        pickle.loads(blob)


@pytest.mark.parametrize("change", ["deleted", "replaced"])
def test_a_copy_made_after_the_file_went_carries_the_lengths(tmp_path, change):
    """A cache cleaned, or a file rewritten by a new preprocessing run, while a sampler maps the old one: the map
    still holds the lengths it planned from, so a copy made now (a spawned DataLoader worker) carries them, with a
    warning naming the file, and plans as the original does — never a FileNotFoundError in a worker, nor the new
    file's lengths."""
    values = db.seed_workload(5_000, seed=9).astype(np.uint16)
    path = _saved(tmp_path, values)
    sampler = db.BucketSampler(np.load(path, mmap_mode="r"), max_tokens=16384, world_size=2, rank=0, seed=3)
    assert _borrowed(sampler)
    if change == "deleted":
        os.remove(path)
    else:
        np.save(path + ".new.npy", db.seed_workload(5_000, seed=10).astype(np.uint16))
        os.replace(path + ".new.npy", path)
    with pytest.warns(UserWarning, match=r"lengths\.npy was deleted or replaced.*carry its 5,000 lengths"):
        blob = pickle.dumps(sampler)
    again = pickle.loads(blob)
    assert not _borrowed(again) and again.schedule.fingerprint == sampler.schedule.fingerprint
    assert _same(again.plan(1), sampler.plan(1))
    assert _same(again.plan(1), db.BucketSampler(values.copy(), max_tokens=16384, world_size=2, seed=3).plan(1))
    # Changed settings (a StepTimer re-pricing, say) carry them too, and plan as from the values.
    with pytest.warns(UserWarning, match="deleted or replaced"):
        changed = sampler.schedule.replace(accumulation=2)
    assert not changed.lengths_borrowed
    expected = db.BucketSampler(values.copy(), max_tokens=16384, world_size=2, seed=3, accumulation=2)
    assert changed.fingerprint == expected.schedule.fingerprint and _same(changed.plan(0), expected.plan(0))
    assert pickle.loads(pickle.dumps(changed)).fingerprint == changed.fingerprint


def test_a_copy_of_an_untouched_map_warns_nothing(tmp_path):
    path = _saved(tmp_path, db.seed_workload(2_000, seed=11).astype(np.uint16))
    sampler = db.BucketSampler(np.load(path, mmap_mode="r"), max_tokens=16384, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _borrowed(pickle.loads(pickle.dumps(sampler)))

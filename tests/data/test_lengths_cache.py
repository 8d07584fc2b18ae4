"""``read_lengths(..., cache=path)``: written once, mapped by every caller, borrowed by the sampler; written
again when its sources change; never overwriting a file it did not write; one writer among racing
processes."""

from __future__ import annotations

import multiprocessing
import os

import dflash_batch as db
import numpy as np
import pyarrow as pa
import pytest
from _arrow import token_rows, token_table, write_ipc
from dflash_batch import _core
from dflash_batch.data import lengths_cache


@pytest.fixture
def dataset(tmp_path):
    rows = token_rows(300, seed=1, longest=60)
    return write_ipc(tmp_path / "data.arrow", token_table(rows)), rows


def test_the_first_call_writes_and_every_call_maps_the_same_lengths(dataset, tmp_path, monkeypatch):
    path, rows = dataset
    cache = tmp_path / "cache" / "lengths.npy"
    first = db.read_lengths(path, "input_ids", cache=cache)
    assert isinstance(first, np.memmap) and first.dtype == np.uint16 and not first.flags.writeable
    assert first.tolist() == [len(r) for r in rows] == db.read_lengths(path, "input_ids").tolist()
    written = os.stat(cache).st_mtime_ns

    def no_reading(*args, **kwargs):
        raise AssertionError("a valid cache is mapped, not read again")

    monkeypatch.setattr(_core, "read_lengths", no_reading)
    again = db.read_lengths(str(path), "input_ids", cache=str(cache))
    assert np.array_equal(again, first) and os.stat(cache).st_mtime_ns == written
    assert sorted(os.listdir(cache.parent)) == ["lengths.npy", "lengths.npy.lock"]


def test_a_sampler_borrows_the_cache_and_plans_as_from_a_copy(dataset, tmp_path):
    path, _ = dataset
    mapped = db.read_lengths(path, "input_ids", cache=tmp_path / "lengths.npy")
    sampler = db.BucketSampler(mapped, max_tokens=256, world_size=2, rank=1)
    copied = db.BucketSampler(np.array(mapped, dtype=np.uint32), max_tokens=256, world_size=2, rank=1)
    assert sampler.schedule.lengths_borrowed and not copied.schedule.lengths_borrowed
    assert [list(b) for b in sampler] == [list(b) for b in copied]


def test_changed_files_or_another_column_write_the_cache_again(dataset, tmp_path):
    path, rows = dataset
    cache = tmp_path / "lengths.npy"
    assert db.read_lengths(path, "input_ids", cache=cache).tolist() == [len(r) for r in rows]
    # The dataset rewritten (other rows, so another size and modification time): the cache follows.
    longer = token_rows(200, seed=2, longest=90)
    write_ipc(path, token_table(longer))
    assert db.read_lengths(path, "input_ids", cache=cache).tolist() == [len(r) for r in longer]
    # The same size and contents, only touched: read again all the same (a time is all it can tell by).
    stamp = os.stat(path).st_mtime_ns + 10**9
    os.utime(path, ns=(stamp, stamp))
    assert db.read_lengths(path, "input_ids", cache=cache).tolist() == [len(r) for r in longer]
    assert db.read_lengths(path, "seq_len", cache=cache).tolist() == [len(r) for r in longer]
    key = lengths_cache.source_key([str(path)], "seq_len", None)
    trailer = open(cache, "rb").read()[-lengths_cache.TRAILER :]
    assert trailer[:-8] == lengths_cache.MAGIC + key


def test_a_rewrite_of_the_same_size_with_its_time_set_back_writes_the_cache_again(dataset, tmp_path):
    # What `cp -p`, `rsync -t` or `tar x` leave: other rows of the same bytes in all, with the source's
    # modification time. Size and time alone would pass it for the file cached.
    path, rows = dataset
    cache = tmp_path / "lengths.npy"
    assert db.read_lengths(path, "input_ids", cache=cache).tolist() == [len(r) for r in rows]
    before = os.stat(path)
    # Each record batch of 7 rows (write_ipc's) reversed: the same buffers' sizes, other lengths per row.
    reordered = [row for start in range(0, len(rows), 7) for row in reversed(rows[start : start + 7])]
    assert [len(r) for r in reordered] != [len(r) for r in rows]
    write_ipc(path, token_table(reordered))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert db.read_lengths(path, "input_ids", cache=cache).tolist() == [len(r) for r in reordered]


def test_lengths_past_uint16_are_kept_as_uint32(tmp_path):
    table = pa.table({"seq_len": pa.array([5, 70_000, 12], type=pa.int64())})
    path = write_ipc(tmp_path / "long.arrow", table)
    lengths = db.read_lengths(path, cache=tmp_path / "lengths.npy")
    assert lengths.dtype == np.uint32 and lengths.tolist() == [5, 70_000, 12]


def test_a_file_it_did_not_write_is_refused_and_left_alone(dataset, tmp_path):
    path, _ = dataset
    theirs = tmp_path / "theirs.npy"
    np.save(theirs, np.arange(10))
    before = theirs.read_bytes()
    with pytest.raises(db.DataError, match="is not a lengths cache dflash_batch wrote"):
        db.read_lengths(path, "input_ids", cache=theirs)
    assert theirs.read_bytes() == before
    tiny = tmp_path / "tiny.npy"
    tiny.write_bytes(b"x")
    with pytest.raises(db.DataError, match="delete it or pass another path"):
        db.read_lengths(path, "input_ids", cache=tiny)


def test_a_damaged_cache_is_refused_naming_it(dataset, tmp_path):
    path, _ = dataset
    cache = tmp_path / "lengths.npy"
    db.read_lengths(path, "input_ids", cache=cache)
    whole = cache.read_bytes()
    # Bytes lost from the array, the trailer kept: the array and the size disagree.
    cache.write_bytes(whole[:-100] + whole[-lengths_cache.TRAILER :])
    with pytest.raises(db.DataError, match="damaged"):
        db.read_lengths(path, "input_ids", cache=cache)


def test_a_bit_flipped_in_the_cached_data_is_refused(dataset, tmp_path):
    """Regression (issue 59): one bit flipped in a lengths cache's data was returned as the lengths (the
    trailer hashed the source files, not the content)."""
    path, rows = dataset
    cache = tmp_path / "lengths.npy"
    db.read_lengths(path, "input_ids", cache=cache)
    whole = bytearray(cache.read_bytes())
    at = len(whole) - lengths_cache.TRAILER - 7  # inside the array, near its end
    whole[at] ^= 0x04
    cache.write_bytes(bytes(whole))
    with pytest.raises(db.DataError, match=r"does not match the checksum written with it.*delete it"):
        db.read_lengths(path, "input_ids", cache=cache)
    cache.unlink()
    assert db.read_lengths(path, "input_ids", cache=cache).tolist() == [len(r) for r in rows]


def test_a_cache_an_earlier_version_wrote_is_written_again(dataset, tmp_path):
    path, rows = dataset
    cache = tmp_path / "lengths.npy"
    db.read_lengths(path, "input_ids", cache=cache)
    whole = cache.read_bytes()
    cache.write_bytes(whole[: -lengths_cache.TRAILER] + lengths_cache.OLD_MAGIC + bytes(32))
    assert db.read_lengths(path, "input_ids", cache=cache).tolist() == [len(r) for r in rows]
    assert cache.read_bytes()[-lengths_cache.TRAILER :].startswith(lengths_cache.MAGIC)


def test_a_table_in_memory_cannot_be_cached(tmp_path):
    with pytest.raises(ValueError, match="an in-memory table has none to tell a stale cache by"):
        db.read_lengths(pa.table({"seq_len": [1, 2]}), cache=tmp_path / "lengths.npy")


def test_missing_files_are_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        db.read_lengths(tmp_path / "absent.arrow", cache=tmp_path / "lengths.npy")


def test_a_dead_writers_temporary_is_removed_and_never_read(dataset, tmp_path):
    path, rows = dataset
    cache = tmp_path / "lengths.npy"
    dead = tmp_path / "lengths.npy.tmp-999999"
    dead.write_bytes(b"half a cache")
    assert db.read_lengths(path, "input_ids", cache=cache).tolist() == [len(r) for r in rows]
    assert not dead.exists()


def _read_in_child(args):
    path, cache = args
    return db.read_lengths(path, "input_ids", cache=cache).tolist()


def test_processes_racing_for_the_cache_get_the_same_lengths_and_one_file(dataset, tmp_path):
    path, rows = dataset
    cache = str(tmp_path / "lengths.npy")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        got = pool.map(_read_in_child, [(str(path), cache)] * 8, chunksize=1)
    assert all(g == [len(r) for r in rows] for g in got)
    assert sorted(os.listdir(tmp_path)) == ["data.arrow", "lengths.npy", "lengths.npy.lock"]


KILLED_WRITER = """
import os, signal, sys
import numpy as np
import dflash_batch as db

def save_half_then_die(file, array, allow_pickle=False):
    file.write(b"\\x93NUMPY half")
    file.flush()
    os.kill(os.getpid(), signal.SIGKILL)

np.save = save_half_then_die
db.read_lengths(sys.argv[1], "input_ids", cache=sys.argv[2])
"""


def test_a_writer_killed_midway_leaves_no_cache_at_the_path(dataset, tmp_path):
    import signal
    import subprocess
    import sys

    path, rows = dataset
    cache = tmp_path / "lengths.npy"
    child = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path), str(cache)], timeout=120)
    assert child.returncode == -signal.SIGKILL
    assert not cache.exists() and any(f.startswith("lengths.npy.tmp-") for f in os.listdir(tmp_path))
    assert db.read_lengths(path, "input_ids", cache=cache).tolist() == [len(r) for r in rows]
    assert not any(f.startswith("lengths.npy.tmp-") for f in os.listdir(tmp_path))


@pytest.mark.parametrize("at", ["cache", "lock"])
def test_a_fifo_at_the_caches_or_its_locks_name_is_refused_not_waited_on(dataset, tmp_path, at):
    import subprocess
    import sys

    path, _ = dataset
    cache = tmp_path / "lengths.npy"
    os.mkfifo(cache if at == "cache" else f"{cache}.lock")
    code = (
        "import sys, dflash_batch as db\n"
        "try:\n    db.read_lengths(sys.argv[1], 'input_ids', cache=sys.argv[2])\n"
        "except db.DataError as error:\n    print('DataError', error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path), str(cache)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("DataError") and "not a regular file" in done.stdout, done.stdout

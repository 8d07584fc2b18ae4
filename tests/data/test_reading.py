"""read_lengths and TokenStore on files written by pyarrow: both IPC formats, every supported type."""

from __future__ import annotations

import pickle
import subprocess
import sys

import dflash_batch as db
import numpy as np
import pyarrow as pa
import pytest
from _arrow import token_rows, token_table, write_ipc

ROWS = token_rows(50)
LENGTHS = np.array([len(r) for r in ROWS])


@pytest.fixture(params=["stream", "file"])
def path(request, tmp_path):
    return write_ipc(tmp_path / "data.arrow", token_table(ROWS), stream=request.param == "stream")


def test_lengths_from_seq_len_and_from_offsets(path):
    for column in ("seq_len", "input_ids"):
        lengths = db.read_lengths(path, column)
        assert lengths.dtype == np.uint32
        np.testing.assert_array_equal(lengths, LENGTHS)
        assert not lengths.flags.writeable


@pytest.mark.parametrize(
    "int_type", [pa.int8(), pa.uint8(), pa.int16(), pa.uint16(), pa.int32(), pa.uint32(), pa.uint64()]
)
def test_any_integer_width(tmp_path, int_type):
    path = write_ipc(tmp_path / "w.arrow", token_table(ROWS, seq_len_type=int_type))
    np.testing.assert_array_equal(db.read_lengths(path), LENGTHS)


@pytest.mark.parametrize("value_type", [pa.int32(), pa.int64(), pa.uint32()])
@pytest.mark.parametrize("large", [False, True])
def test_tokens_keep_their_type_in_list_and_large_list(tmp_path, value_type, large):
    path = write_ipc(tmp_path / "t.arrow", token_table(ROWS, value_type, large), stream=not large)
    store = db.TokenStore(path)
    assert len(store) == len(ROWS) and store.dtype == value_type.to_pandas_dtype()
    np.testing.assert_array_equal(store.lengths(), LENGTHS)
    np.testing.assert_array_equal(db.read_lengths(path, "input_ids"), LENGTHS)
    for i, row in enumerate(ROWS):
        np.testing.assert_array_equal(store[i], row)
        assert store[i].dtype == store.dtype


def test_rows_are_read_only_views_that_outlive_the_store(path):
    store = db.TokenStore(path)
    row = store[3]
    assert not row.flags.writeable and not row.flags.owndata
    with pytest.raises(ValueError):
        row[0] = 1
    del store
    np.testing.assert_array_equal(row, ROWS[3])  # the view keeps the map alive


def test_negative_indices_and_numpy_integers(path):
    store = db.TokenStore(path)
    np.testing.assert_array_equal(store[-1], ROWS[-1])
    np.testing.assert_array_equal(store[np.int64(2)], ROWS[2])
    with pytest.raises(TypeError, match="gather"):
        store[1:3]


def test_gather_concatenates_rows_with_offsets(path):
    store = db.TokenStore(path)
    picks = np.array([5, 0, 49, 5], dtype=np.uint32)
    tokens, offsets = store.gather(picks)
    np.testing.assert_array_equal(tokens, np.concatenate([ROWS[i] for i in picks]))
    np.testing.assert_array_equal(offsets, np.cumsum([0] + [len(ROWS[i]) for i in picks]))
    assert offsets.dtype == np.int64 and tokens.dtype == np.int32
    empty_tokens, empty_offsets = store.gather([])
    assert len(empty_tokens) == 0 and list(empty_offsets) == [0]


def test_out_of_range_rows_raise_index_error(path):
    store = db.TokenStore(path)
    for bad in (50, -51):
        with pytest.raises(IndexError, match=f"row {bad} is out of range for a dataset of 50 rows"):
            store[bad]
        with pytest.raises(IndexError):
            store.gather([0, bad])
    with pytest.raises(IndexError):
        store.gather(np.array([2**64 - 1], dtype=np.uint64))
    with pytest.raises(TypeError, match="1-D array of integers"):
        store.gather(np.array([1.5]))


def test_files_lists_globs_and_directories_form_one_row_space(tmp_path):
    a = write_ipc(tmp_path / "a.arrow", token_table(ROWS[:20]))
    b = write_ipc(tmp_path / "b.arrow", token_table(ROWS[20:]), stream=False)
    for source in ([a, b], str(tmp_path / "*.arrow"), tmp_path):
        np.testing.assert_array_equal(db.read_lengths(source), LENGTHS)
        np.testing.assert_array_equal(db.TokenStore(source)[25], ROWS[25])
    np.testing.assert_array_equal(db.read_lengths([b, a])[:30], LENGTHS[20:])


def test_store_pickles_as_its_source_and_reopens_in_another_process(path):
    store = db.TokenStore(path)
    clone = pickle.loads(pickle.dumps(store))
    np.testing.assert_array_equal(clone[7], store[7])
    code = "import pickle, sys; store = pickle.loads(sys.stdin.buffer.read()); print(len(store), int(store[7].sum()))"
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(store), capture_output=True, check=True)
    assert out.stdout.decode().split() == [str(len(ROWS)), str(int(ROWS[7].sum()))]


def test_progress_reports_every_file(tmp_path, capsys):
    paths = [write_ipc(tmp_path / f"{i}.arrow", token_table(ROWS)) for i in range(3)]
    db.read_lengths(paths, progress=True)
    assert "3/3" in capsys.readouterr().err
    db.read_lengths(paths, progress=False)
    assert capsys.readouterr().err == ""
    calls = []
    db._core.read_lengths([str(p) for p in paths], "seq_len", progress=calls.append)
    assert calls == [1, 2, 3]


def test_progress_callback_errors_propagate(tmp_path):
    path = write_ipc(tmp_path / "p.arrow", token_table(ROWS))

    def stop(done):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        db._core.read_lengths([str(path)], "seq_len", progress=stop)


def test_bucket_sampler_reads_a_source(path):
    from_path = db.BucketSampler(path, batch_size=4, seed=3)
    from_array = db.BucketSampler(LENGTHS, batch_size=4, seed=3)
    np.testing.assert_array_equal(from_path.plan(0).indices, from_array.plan(0).indices)
    derived = db.BucketSampler([path], batch_size=4, seed=3, column="input_ids")
    np.testing.assert_array_equal(derived.plan(0).indices, from_array.plan(0).indices)

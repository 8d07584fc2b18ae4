"""Tables in memory (pyarrow tables, in-memory ``datasets``, anything with ``__arrow_c_stream__``) are read
by the same Rust code as files, through the Arrow C stream interface: same lengths, tokens, batches and
errors; no copy of the tokens; and a producer's bad data is an error, never a crash."""

from __future__ import annotations

import gc

import dflash_batch as db
import numpy as np
import pyarrow as pa
import pytest
from _arrow import token_rows, token_table, write_ipc
from hypothesis import given, settings
from hypothesis import strategies as st

ROWS = token_rows(30, seed=4)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_ipc(tmp_path_factory.mktemp("tables") / "t.arrow", token_table(ROWS))


def chunked(table: pa.Table, size: int) -> pa.Table:
    return pa.Table.from_batches(table.to_batches(max_chunksize=size))


def test_a_table_reads_like_its_files(files):
    table = chunked(token_table(ROWS), 4)
    np.testing.assert_array_equal(db.read_lengths(table), db.read_lengths(files))
    np.testing.assert_array_equal(db.read_lengths(table, "input_ids"), [len(r) for r in ROWS])
    memory, mapped = db.TokenStore(table), db.TokenStore(files)
    assert memory.dtype == mapped.dtype == np.int32 and memory.paths == ()
    for i in (0, 7, -1):
        np.testing.assert_array_equal(memory[i], mapped[i])
    picks = [5, 2, 29, 2]
    for got, want in zip(memory.gather(picks), mapped.gather(picks), strict=True):
        np.testing.assert_array_equal(got, want)
    for key, value in db.collate(memory, picks, pad_to_multiple_of=8).items():
        np.testing.assert_array_equal(value, db.collate(mapped, picks, pad_to_multiple_of=8)[key], err_msg=key)


def test_rows_are_views_of_the_table_that_outlive_it():
    table = token_table(ROWS, value_type=pa.int64())
    values = table.column("input_ids").chunk(0).values.to_numpy()
    store = db.TokenStore(table)
    row = store[3]
    assert np.shares_memory(row, values), "the tokens were copied"
    del table, values
    gc.collect()
    np.testing.assert_array_equal(row, ROWS[3])
    np.testing.assert_array_equal(store[4], ROWS[4])


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), min_size=1, max_size=25),
    chunk=st.integers(1, 6),
    start=st.integers(0, 5),
    large=st.booleans(),
)
def test_sliced_and_chunked_tables_read_their_own_rows(lengths, chunk, start, large):
    """Slices carry an offset into their buffers: rows must come from the slice, not the buffer's front."""
    rows = [np.arange(n, dtype=np.int64) + 100 * i for i, n in enumerate(lengths)]
    table = chunked(token_table(rows, large=large), chunk)
    start = min(start, len(rows) - 1)
    sliced = table.slice(start)
    store = db.TokenStore(sliced)
    assert len(store) == len(rows) - start
    np.testing.assert_array_equal(db.read_lengths(sliced), lengths[start:])
    for i in range(len(store)):
        np.testing.assert_array_equal(store[i], rows[start + i])


def test_falling_offsets_are_a_data_error_not_a_read_out_of_bounds():
    values = pa.array([1, 2, 3], type=pa.int32())
    offsets = pa.array([0, 3, 1], type=pa.int32())
    # from_buffers checks only the span, not that offsets rise: what a careless producer can hand over.
    bad = pa.Array.from_buffers(pa.list_(pa.int32()), 2, [None, offsets.buffers()[1]], children=[values])
    table = pa.table({"input_ids": bad})
    with pytest.raises(db.DataError, match="the in-memory table is not valid Arrow data"):
        db.TokenStore(table)
    with pytest.raises(db.DataError, match="the in-memory table is not valid Arrow data"):
        db.read_lengths(table, "input_ids")


def test_table_errors_name_the_table_and_the_fix():
    table = pa.table({"input_ids": pa.array([[1, 2], None, [3]], type=pa.list_(pa.int32()))})
    with pytest.raises(db.DataError, match=r"the in-memory table has no column \"seq_len\".*column=\"input_ids\""):
        db.read_lengths(table, "seq_len")
    # The default takes input_ids when there is no seq_len, and names what is wrong with it.
    for column in ("input_ids", None):
        with pytest.raises(db.DataError, match='the in-memory table has a null in column "input_ids" at row 1'):
            db.read_lengths(table, column)
    strings = pa.table({"input_ids": pa.array([["a"]], type=pa.list_(pa.string()))})
    with pytest.raises(db.DataError, match=r"must be a list .* of token ids \(any integer width"):
        db.TokenStore(strings)
    with pytest.raises(db.DataError, match="the in-memory table holds no rows"):
        db.TokenStore(pa.table({"input_ids": pa.array([], type=pa.list_(pa.int32()))}))


def test_a_mapping_past_the_rows_is_an_index_error():
    from dflash_batch import _core

    table = token_table(ROWS[:3])
    with pytest.raises(IndexError, match="row 7 is out of range for a dataset of 3 rows"):
        _core.read_table_lengths(table, "seq_len", np.array([0, 7], dtype=np.uint64))
    with pytest.raises(IndexError, match="row 7 is out of range"):
        _core.TokenStore.from_table(table, "input_ids", np.array([7], dtype=np.uint64))


class Producer:
    """A table that speaks the Arrow C stream interface, badly or well."""

    def __init__(self, make):
        self.make = make

    def __arrow_c_stream__(self, requested_schema=None):
        return self.make()


def test_any_stream_producer_is_read_and_bad_ones_are_type_errors():
    table = token_table(ROWS[:5])
    np.testing.assert_array_equal(db.read_lengths(Producer(table.__arrow_c_stream__)), [len(r) for r in ROWS[:5]])
    with pytest.raises(TypeError, match="returned something other than a PyCapsule"):
        db.read_lengths(Producer(lambda: 42))
    with pytest.raises(TypeError, match="capsule not named 'arrow_array_stream'"):
        db.read_lengths(Producer(lambda: pa.schema([("a", pa.int32())]).__arrow_c_schema__()))
    with pytest.raises(ZeroDivisionError):
        db.read_lengths(Producer(lambda: 1 / 0))
    column = pa.chunked_array([[1, 2]])  # a stream of int64 arrays, not of record batches
    with pytest.raises(db.DataError, match="cannot be read through the Arrow C stream interface"):
        db.TokenStore(Producer(column.__arrow_c_stream__))


def test_the_native_entry_points_refuse_objects_without_the_interface():
    from dflash_batch import _core

    with pytest.raises(TypeError, match=r"table must be a pyarrow Table .* got list"):
        _core.read_table_lengths([[1, 2]], "input_ids")


def test_a_store_over_a_table_pickles_and_loads(files):
    import pickle

    store = db.TokenStore(chunked(token_table(ROWS), 6))
    again = pickle.loads(pickle.dumps(store))
    np.testing.assert_array_equal(again.gather([1, 9])[0], store.gather([1, 9])[0])
    sampler = db.BucketSampler(db.read_lengths(store._source.table), max_tokens=128, seed=2)
    batch = next(iter(sampler))
    mapped = db.collate(db.TokenStore(files), batch)["input_ids"]
    np.testing.assert_array_equal(db.collate(store, batch)["input_ids"], mapped)

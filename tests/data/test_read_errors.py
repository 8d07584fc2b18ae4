"""One test per kind of bad dataset input: a clear exception naming the file and the fix, never a crash."""

from __future__ import annotations

import json

import dflash_batch as db
import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from _arrow import token_rows, token_table, write_ipc

ROWS = token_rows(20)


def test_exception_hierarchy():
    assert issubclass(db.DataError, ValueError)


def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        db.read_lengths(tmp_path / "nope.arrow")
    with pytest.raises(FileNotFoundError, match="no files match"):
        db.read_lengths(str(tmp_path / "*.arrow"))
    with pytest.raises(FileNotFoundError, match="list of files is empty"):
        db.read_lengths([])


def test_file_missing_from_a_state_json_is_an_os_error(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"_data_files": [{"filename": "gone.arrow"}]}))
    with pytest.raises(FileNotFoundError, match=r"gone\.arrow"):
        db.read_lengths(tmp_path)


def test_directory_without_arrow_files(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(FileNotFoundError, match=r"no Arrow files \(\*\.arrow"):
        db.read_lengths(tmp_path)


def test_dataset_dict_directory_names_its_splits(tmp_path):
    (tmp_path / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(FileNotFoundError, match="splits \\['train', 'test'\\]; pass one split's directory"):
        db.read_lengths(tmp_path)


def test_non_arrow_file(tmp_path):
    text = tmp_path / "a.arrow"
    text.write_text("id,len\n1,2\n")
    with pytest.raises(db.DataError, match=r"is not an Arrow IPC file or stream \(it starts with b'id,len\\n1'\)"):
        db.read_lengths(text)
    parquet = tmp_path / "b.arrow"
    pq.write_table(token_table(ROWS), parquet)
    with pytest.raises(db.DataError, match="looks like Parquet"):
        db.TokenStore(parquet)


def test_empty_file(tmp_path):
    (tmp_path / "e.arrow").write_bytes(b"")
    with pytest.raises(db.DataError, match="is truncated \\(the file is empty\\)"):
        db.read_lengths(tmp_path / "e.arrow")


@pytest.mark.parametrize("stream", [True, False])
def test_truncated_file(tmp_path, stream):
    path = write_ipc(tmp_path / "t.arrow", token_table(ROWS), stream=stream)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 16])
    with pytest.raises(db.DataError, match="is truncated"):
        db.read_lengths(path)
    with pytest.raises(db.DataError, match="is truncated"):
        db.TokenStore(path)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_compressed_file_names_codec_and_fix(tmp_path, codec):
    path = tmp_path / "c.feather"
    feather.write_feather(token_table(ROWS), path, compression=codec)
    name = {"lz4": "LZ4_FRAME", "zstd": "ZSTD"}[codec]
    with pytest.raises(db.DataError, match=f"{name}-compressed .* compression='uncompressed'"):
        db.read_lengths(path)
    with pytest.raises(db.DataError, match=name):
        db.TokenStore(path)


def test_missing_column_lists_columns_and_suggests_the_list_column(tmp_path):
    path = write_ipc(tmp_path / "m.arrow", token_table(ROWS))
    with pytest.raises(
        db.DataError,
        match='no column "length"; its columns are \\["text", "input_ids", "seq_len"\\]; pass column="input_ids"',
    ):
        db.read_lengths(path, "length")
    with pytest.raises(db.DataError, match='no column "tokens"'):
        db.TokenStore(path, "tokens")


@pytest.mark.parametrize(
    "array",
    [
        pa.array([1.0, 2.0]),
        pa.array(["a", "b"]),
        pa.array([{"x": 1}, {"x": 2}]),
        pa.array([[[1], [2]], [[3]]]),
    ],
    ids=["float", "string", "struct", "list_of_lists"],
)
def test_column_of_the_wrong_type(tmp_path, array):
    path = write_ipc(tmp_path / "w.arrow", pa.table({"x": array}))
    with pytest.raises(db.DataError, match=r'has column "x" of type .* but it must be'):
        db.read_lengths(path, "x")
    with pytest.raises(db.DataError, match=r"list \(or large list\) of token ids \(any integer width"):
        db.TokenStore(path, "x")


@pytest.mark.parametrize("width", [pa.int8(), pa.uint8(), pa.int16(), pa.uint16()])
def test_token_values_of_every_integer_width_are_read(tmp_path, width):
    path = write_ipc(tmp_path / "w.arrow", pa.table({"x": pa.array([[1, 2], [3]], pa.list_(width))}))
    np.testing.assert_array_equal(db.read_lengths(path, "x"), [2, 1])
    store = db.TokenStore(path, "x")
    assert store.dtype == np.dtype(width.to_pandas_dtype())
    np.testing.assert_array_equal(db.collate(store, [1, 0])["input_ids"], [[3, 0], [1, 2]])


def test_float_token_values_must_be_whole_numbers_to_collate(tmp_path):
    path = write_ipc(tmp_path / "w.arrow", pa.table({"x": pa.array([[1.0, 2.0], [1.5]], pa.list_(pa.float32()))}))
    store = db.TokenStore(path, "x")
    np.testing.assert_array_equal(db.collate(store, [0])["input_ids"], [[1, 2]])
    with pytest.raises(db.DataError, match=r"token 1\.5 of a float token file is not a whole number that int64"):
        db.collate(store, [1])


def test_nulls_in_the_length_column(tmp_path):
    path = write_ipc(tmp_path / "n.arrow", pa.table({"seq_len": pa.array([3, 4, None, 5])}), batch_rows=2)
    with pytest.raises(db.DataError, match='null in column "seq_len" at row 2'):
        db.read_lengths(path)


def test_null_rows_and_null_tokens_in_a_list_column(tmp_path):
    rows = write_ipc(tmp_path / "r.arrow", pa.table({"ids": pa.array([[1], None, [2, 3]], pa.list_(pa.int32()))}))
    with pytest.raises(db.DataError, match='null in column "ids" at row 1'):
        db.read_lengths(rows, "ids")
    tokens = write_ipc(tmp_path / "t.arrow", pa.table({"ids": pa.array([[1], [2, None]], pa.list_(pa.int32()))}))
    with pytest.raises(db.DataError, match='has a null token in column "ids" at row 1'):
        db.TokenStore(tokens, "ids")


def test_negative_lengths(tmp_path):
    path = write_ipc(tmp_path / "neg.arrow", pa.table({"seq_len": pa.array([3, -4], pa.int32())}))
    with pytest.raises(db.DataError, match='negative length -4 in column "seq_len" at row 1'):
        db.read_lengths(path)


def test_shards_whose_schemas_disagree(tmp_path):
    a = write_ipc(tmp_path / "a.arrow", token_table(ROWS))
    b = write_ipc(tmp_path / "b.arrow", token_table(ROWS, seq_len_type=pa.int32()))
    with pytest.raises(
        db.DataError, match=f'different schema from {a} \\(column "seq_len" is int32 here, int64 there\\)'
    ):
        db.read_lengths([a, b])
    c = write_ipc(tmp_path / "c.arrow", pa.table({"seq_len": pa.array([1], pa.int64())}))
    with pytest.raises(db.DataError, match="different schema"):
        db.TokenStore([a, c])


def test_empty_dataset(tmp_path):
    path = write_ipc(tmp_path / "e.arrow", token_table([]))
    with pytest.raises(db.DataError, match="holds no rows"):
        db.read_lengths(path)
    with pytest.raises(db.DataError, match="holds no rows"):
        db.TokenStore(path)


def test_wrong_source_types():
    with pytest.raises(TypeError, match="a source must be a path"):
        db.read_lengths([1, 2])
    with pytest.raises(TypeError, match="a source must be a path"):
        db.TokenStore(42)


def test_a_fifo_as_a_source_is_refused_instead_of_blocking(tmp_path):
    """Regression: open() on a FIFO waits for a writer forever."""
    import os

    fifo = tmp_path / "lengths.arrow"
    os.mkfifo(fifo)
    for reader in (db.read_lengths, db.TokenStore):
        with pytest.raises(db.DataError, match="is a FIFO, not a regular file"):
            reader(str(fifo))

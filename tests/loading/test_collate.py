"""collate against a numpy reference: exact small cases, generated cases, both dtypes, both forms."""

from __future__ import annotations

import dflash_batch as db
import numpy as np
import pytest
from _arrow import token_rows, token_table, write_ipc
from hypothesis import given, settings
from hypothesis import strategies as st

ROWS = token_rows(40, longest=30)
KEYS = ("input_ids", "attention_mask", "labels", "position_ids")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return db.TokenStore(write_ipc(tmp_path_factory.mktemp("c") / "t.arrow", token_table(ROWS)))


def reference(rows, pad_id=0, label_pad_id=-100, multiple=1, dtype=np.int64):
    """Padding written out one row at a time, the obvious way."""
    width = -(-max((len(r) for r in rows), default=0) // multiple) * multiple
    out = {
        "input_ids": np.full((len(rows), width), pad_id, dtype),
        "attention_mask": np.zeros((len(rows), width), dtype),
        "labels": np.full((len(rows), width), label_pad_id, dtype),
        "position_ids": np.zeros((len(rows), width), dtype),
    }
    for r, tokens in enumerate(rows):
        out["input_ids"][r, : len(tokens)] = tokens
        out["labels"][r, : len(tokens)] = tokens
        out["attention_mask"][r, : len(tokens)] = 1
        out["position_ids"][r, : len(tokens)] = np.arange(len(tokens))
    return out


def assert_equal(got, expected):
    assert set(got) == set(KEYS)
    for key in KEYS:
        assert got[key].dtype == expected[key].dtype, key
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


def test_exact_small_batch(tmp_path):
    path = write_ipc(tmp_path / "s.arrow", token_table([np.array([5, 6, 7]), np.array([8])]))
    got = db.collate(db.TokenStore(path), [1, 0], pad_to_multiple_of=4)
    np.testing.assert_array_equal(got["input_ids"], [[8, 0, 0, 0], [5, 6, 7, 0]])
    np.testing.assert_array_equal(got["attention_mask"], [[1, 0, 0, 0], [1, 1, 1, 0]])
    np.testing.assert_array_equal(got["labels"], [[8, -100, -100, -100], [5, 6, 7, -100]])
    np.testing.assert_array_equal(got["position_ids"], [[0, 0, 0, 0], [0, 1, 2, 0]])


@settings(max_examples=60, deadline=None)
@given(
    picks=st.lists(st.integers(0, len(ROWS) - 1), min_size=0, max_size=50),
    multiple=st.integers(1, 16),
    pad_id=st.integers(-5, 50_000),
    dtype=st.sampled_from(["int64", "int32"]),
)
def test_matches_reference_new_and_into(store, picks, multiple, pad_id, dtype):
    expected = reference([ROWS[p] for p in picks], pad_id, -100, multiple, np.dtype(dtype))
    indices = np.array(picks, dtype=np.uint32)
    got = db.collate(store, indices, pad_id=pad_id, pad_to_multiple_of=multiple, dtype=dtype)
    assert_equal(got, expected)
    size = expected["input_ids"].size + 11
    out = {key: np.full(size, 99, dtype=dtype) for key in KEYS}
    views = db.collate(store, indices, pad_id=pad_id, pad_to_multiple_of=multiple, out=out)
    assert_equal(views, expected)
    for key in KEYS:
        assert np.shares_memory(views[key], out[key]) or views[key].size == 0
        assert (out[key][expected[key].size :] == 99).all(), "wrote past rows × L"


def test_large_batches_use_the_pool_and_agree(store):
    picks = np.arange(len(ROWS)).repeat(60)  # 2400 rows: split over threads
    assert_equal(db.collate(store, picks), reference([ROWS[p] for p in picks]))


def test_torch_buffers_are_written_in_place(store):
    torch = pytest.importorskip("torch")
    tensors = {key: torch.zeros(4096, dtype=torch.int32) for key in KEYS}
    views = db.collate(store, [3, 4], out={k: t.numpy() for k, t in tensors.items()})
    rows, width = views["input_ids"].shape
    assert torch.equal(tensors["labels"][: rows * width].view(rows, width), torch.from_numpy(views["labels"]))


def test_in_memory_store_collates_the_same(store):
    datasets = pytest.importorskip("datasets")
    memory = db.TokenStore(datasets.Dataset.from_dict({"input_ids": [r.tolist() for r in ROWS]}))
    for kwargs in ({}, {"pad_to_multiple_of": 8, "dtype": "int32"}):
        assert_equal(db.collate(memory, [5, 2, 9], **kwargs), db.collate(store, [5, 2, 9], **kwargs))


def test_dtype_names(store):
    torch = pytest.importorskip("torch")
    for dtype in (np.int32, "int32", torch.int32):
        assert db.collate(store, [0], dtype=dtype)["labels"].dtype == np.int32
    with pytest.raises(ValueError, match=r"dtype=.* is invalid; use int64"):
        db.collate(store, [0], dtype="float32")


class TestBufferValidation:
    def buffers(self, size=4096, dtype=np.int64):
        return {key: np.zeros(size, dtype=dtype) for key in KEYS}

    def test_too_small(self, store):
        out = self.buffers()
        out["labels"] = np.zeros(3, dtype=np.int64)
        with pytest.raises(ValueError, match="buffer labels holds 3 elements but the batch needs"):
            db.collate(store, [0, 1], out=out)

    def test_wrong_dtype(self, store):
        with pytest.raises(TypeError, match="int64 or int32 numpy array, got float64"):
            db.collate(store, [0], out=self.buffers(dtype=np.float64))

    def test_mixed_dtypes(self, store):
        out = self.buffers()
        out["position_ids"] = np.zeros(4096, dtype=np.int32)
        with pytest.raises(TypeError, match="buffer position_ids must be a writeable int64"):
            db.collate(store, [0], out=out)

    def test_same_array_twice(self, store):
        out = self.buffers()
        out["labels"] = out["input_ids"]
        with pytest.raises(TypeError, match="different array"):
            db.collate(store, [0], out=out)

    def test_not_contiguous(self, store):
        out = self.buffers()
        out["attention_mask"] = np.zeros(8192, dtype=np.int64)[::2]
        with pytest.raises(ValueError, match="attention_mask must be C-contiguous"):
            db.collate(store, [0], out=out)

    def test_read_only(self, store):
        out = self.buffers()
        out["input_ids"].flags.writeable = False
        with pytest.raises(TypeError, match="writeable"):
            db.collate(store, [0], out=out)

    def test_missing_key(self, store):
        out = self.buffers()
        del out["labels"]
        with pytest.raises(TypeError, match="exactly the keys"):
            db.collate(store, [0], out=out)


def test_bad_settings_and_indices(store, tmp_path):
    with pytest.raises(ValueError, match="pad_to_multiple_of=0 is invalid"):
        db.collate(store, [0], pad_to_multiple_of=0)
    with pytest.raises(ValueError, match=r"pad_id=.* is invalid"):
        db.collate(store, [0], pad_id=2**40, dtype="int32")
    with pytest.raises(IndexError, match="row 40 is out of range"):
        db.collate(store, [0, 40])
    # More than any machine holds (terabytes): a MemoryError naming the fix, not an aborted process.
    for dtype in ("int64", "int32"):
        with pytest.raises(MemoryError, match=f"40 rows padded to 4294967295 tokens .* {dtype} arrays; lower pad"):
            db.collate(store, range(40), pad_to_multiple_of=2**32 - 1, dtype=dtype)
    with pytest.raises(TypeError, match="TokenStore"):
        db.collate(np.zeros(3), [0])
    import pyarrow as pa

    wide = db.TokenStore(write_ipc(tmp_path / "w.arrow", token_table([np.array([2**40, 1])], value_type=pa.int64())))
    with pytest.raises(db.DataError, match="token id 1099511627776 does not fit in int32; collate with dtype=int64"):
        db.collate(wide, [0], dtype="int32")
    assert db.collate(wide, [0])["input_ids"][0, 0] == 2**40


def test_fortran_ordered_buffers_are_refused(store):
    out = {key: np.zeros((64, 64), dtype=np.int64) for key in KEYS}
    out["labels"] = np.asfortranarray(out["labels"])
    with pytest.raises(ValueError, match="labels must be C-contiguous"):
        db.collate(store, [0], out=out)


class TestCollator:
    """``db.Collator`` pads what a DataLoader fetched with the same Rust code as ``collate``."""

    def call(self, examples, **kwargs):
        pytest.importorskip("torch")
        return {key: value.numpy() for key, value in db.Collator(**kwargs)(examples).items()}

    @settings(max_examples=30, deadline=None)
    @given(
        lengths=st.lists(st.integers(0, 9), min_size=1, max_size=8),
        dtype=st.sampled_from(["int16", "uint16", "int32", "uint32", "int64", "uint64"]),
        as_list=st.booleans(),
        multiple=st.sampled_from([1, 8]),
    )
    def test_rows_of_any_integer_type_pad_like_the_reference(self, lengths, dtype, as_list, multiple):
        rows = [np.arange(n, dtype=dtype) + 1 for n in lengths]
        examples = [{"input_ids": r.tolist() if as_list else r} for r in rows]
        got = self.call(examples, pad_to_multiple_of=multiple, dtype="int32")
        assert_equal(got, reference(rows, multiple=multiple, dtype=np.int32))

    def test_bad_rows_are_type_errors_and_no_rows_a_value_error(self):
        with pytest.raises(TypeError, match=r"integer token ids in column 'input_ids'.*dtype float64"):
            self.call([{"input_ids": [1.5, 2.0]}])
        with pytest.raises(TypeError, match=r"shape \(1, 2\)"):
            self.call([[[1, 2]]])
        with pytest.raises(ValueError, match="Collator got no examples"):
            self.call([])
        with pytest.raises(ValueError, match="which no output dtype holds"):
            self.call([np.array([2**63], dtype=np.uint64)])

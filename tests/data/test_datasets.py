"""Hugging Face `datasets` as a real client: every length and every token row equals what it returns."""

from __future__ import annotations

import dflash_batch as db
import numpy as np
import pytest

datasets = pytest.importorskip("datasets")

N = 600


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 80, N)
    rows = [rng.integers(0, 32_000, k).tolist() for k in lengths]
    ds = datasets.Dataset.from_dict({"input_ids": rows, "seq_len": lengths, "id": np.arange(N)})
    path = tmp_path_factory.mktemp("hf") / "ds"
    ds.save_to_disk(str(path), num_shards=3, max_shard_size=None)
    return path


def assert_matches(source, ds: datasets.Dataset, column: str = "input_ids") -> None:
    """Every length and every row of ``source`` equals what ``ds`` returns, and so does a gather."""
    expected_lengths = np.array([len(r) for r in ds[column]])
    np.testing.assert_array_equal(db.read_lengths(source, column), expected_lengths)
    store = db.TokenStore(source, column)
    assert len(store) == len(ds)
    np.testing.assert_array_equal(store.lengths(), expected_lengths)
    for i, row in enumerate(ds[column]):
        np.testing.assert_array_equal(store[i], row)
    picks = np.random.default_rng(2).integers(0, len(ds), 40)
    tokens, offsets = store.gather(picks)
    np.testing.assert_array_equal(tokens, np.concatenate([np.asarray(r) for r in ds[picks.tolist()][column]]))
    assert offsets[-1] == len(tokens)


def test_save_to_disk_shards_in_state_json_order(saved):
    loaded = datasets.load_from_disk(str(saved))
    assert len(loaded.cache_files) == 3
    np.testing.assert_array_equal(db.read_lengths(saved), loaded["seq_len"])
    assert_matches(saved, loaded)
    assert_matches(loaded, loaded)


def test_map_cache_file(saved, tmp_path):
    loaded = datasets.load_from_disk(str(saved))
    mapped = loaded.map(
        lambda b: {"doubled": [r + r for r in b["input_ids"]]},
        batched=True,
        cache_file_name=str(tmp_path / "mapped.arrow"),
    )
    assert [f["filename"] for f in mapped.cache_files] == [str(tmp_path / "mapped.arrow")]
    assert_matches(mapped, mapped, "doubled")
    assert_matches(str(tmp_path / "mapped.arrow"), mapped, "doubled")


def test_indices_mapping_from_shuffle_select_and_filter(saved):
    loaded = datasets.load_from_disk(str(saved))
    shuffled = loaded.shuffle(seed=3).select(range(150))
    assert shuffled._indices is not None
    assert_matches(shuffled, shuffled)
    filtered = loaded.filter(lambda r: r["seq_len"] % 3 == 0)
    assert filtered._indices is not None
    assert_matches(filtered, filtered)
    np.testing.assert_array_equal(db.read_lengths(filtered), filtered["seq_len"])


def test_lazy_operations_fall_back_to_pyarrow(saved):
    loaded = datasets.load_from_disk(str(saved))
    sliced = loaded.select(range(100, 300))  # contiguous: recorded as a slice of the table, not indices
    assert_matches(sliced, sliced)
    renamed = loaded.rename_column("input_ids", "tokens")
    assert_matches(renamed, renamed, "tokens")


def test_in_memory_dataset(saved):
    in_memory = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4], [5, 6]]})
    assert in_memory.cache_files == []
    assert_matches(in_memory, in_memory)
    # One default rule for every reader: seq_len when the data has it, else input_ids.
    assert db.read_lengths(in_memory).tolist() == [3, 1, 2]
    with pytest.raises(db.DataError, match=r'the in-memory table has no column "seq_len".*pass column="input_ids"'):
        db.read_lengths(in_memory, "seq_len")


def test_sampler_and_store_from_one_dataset_agree(saved):
    loaded = datasets.load_from_disk(str(saved)).shuffle(seed=5)
    sampler = db.BucketSampler(loaded, max_tokens=512, seed=1)
    store = db.TokenStore(loaded)
    for batch in sampler:
        _, offsets = store.gather(batch)
        assert np.diff(offsets).max() * len(batch) <= 512
        np.testing.assert_array_equal(np.diff(offsets), np.asarray(loaded["seq_len"])[batch])

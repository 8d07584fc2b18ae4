"""Megatron-LM indexed datasets (``.bin`` + ``.idx``): read by prefix, half, list, glob or directory;
checked against megatron-core's own writer and reader (``IndexedDatasetBuilder``, ``IndexedDataset``);
every kind of bad pair a ``DataError`` naming the file and the fix."""

from __future__ import annotations

import os
import pickle
import struct

import dflash_batch as db
import numpy as np
import pytest
from _megatron import CODES, read_with_megatron, write_pair, write_with_megatron
from _mutate import mutate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

DTYPES = list(CODES)


def documents_of(rng: np.random.Generator, sequences: int, dtype: np.dtype) -> list[list[np.ndarray]]:
    """Random documents of 1–3 sequences each, with token ids the dtype holds (some sequences empty, not all)."""
    high = 100 if np.dtype(dtype).itemsize == 1 else 30_000
    docs, left = [], sequences
    while left:
        k = min(left, int(rng.integers(1, 4)))
        docs.append([rng.integers(0, high, int(rng.integers(0, 60))) for _ in range(k)])
        left -= k
    if not any(len(sequence) for doc in docs for sequence in doc):  # megatron-core cannot map an empty .bin
        docs[0][0] = rng.integers(0, high, 1)
    return docs


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_matches_megatron_cores_reader(tmp_path, dtype):
    docs = documents_of(np.random.default_rng(CODES[dtype]), 40, dtype)
    prefix = write_with_megatron(tmp_path / "data_text_document", docs, dtype)
    theirs = read_with_megatron(prefix)
    lengths = db.read_lengths(prefix)
    np.testing.assert_array_equal(lengths, theirs.sequence_lengths)
    np.testing.assert_array_equal(db.read_documents(prefix), theirs.document_indices)
    store = db.TokenStore(prefix)
    assert store.dtype == dtype and len(store) == len(theirs) == 40
    for i in range(len(theirs)):
        np.testing.assert_array_equal(store[i], theirs[i])
        assert store[i].dtype == dtype
    order = np.random.default_rng(1).permutation(40)
    tokens, offsets = store.gather(order)
    np.testing.assert_array_equal(tokens, np.concatenate([theirs[int(i)] for i in order]))
    np.testing.assert_array_equal(np.diff(offsets), theirs.sequence_lengths[order])
    # The layout writer the mutation tests use writes what megatron-core writes, byte for byte.
    ours = write_pair(tmp_path / "layout", [s for d in docs for s in d], dtype, list(theirs.document_indices))
    for suffix in (".idx", ".bin"):
        assert open(ours + suffix, "rb").read() == open(prefix + suffix, "rb").read()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    seed=st.integers(0, 2**32 - 1), sequences=st.integers(1, 30), dtype=st.sampled_from([np.uint16, np.int32, np.int64])
)
def test_collated_batches_hold_megatron_cores_rows(tmp_path_factory, seed, sequences, dtype):
    rng = np.random.default_rng(seed)
    prefix = write_with_megatron(tmp_path_factory.mktemp("m") / "d", documents_of(rng, sequences, dtype), dtype)
    theirs, store = read_with_megatron(prefix), db.TokenStore(prefix)
    indices = rng.permutation(sequences)[: int(rng.integers(1, sequences + 1))]
    batch = db.collate(store, indices, pad_id=7)
    for r, i in enumerate(indices):
        row = theirs[int(i)]
        np.testing.assert_array_equal(batch["input_ids"][r, : len(row)], row)
        assert (batch["input_ids"][r, len(row) :] == 7).all()
        assert batch["attention_mask"][r].sum() == len(row)


def test_sources_name_pairs_by_prefix_half_list_glob_and_directory(tmp_path):
    a = write_pair(tmp_path / "a_text_document", [[1, 2, 3], [4]])
    b = write_pair(tmp_path / "b_text_document", [[5, 6]])
    both = [3, 1, 2]
    for source in (
        [a, b],
        [a + ".idx", b + ".bin"],
        str(tmp_path / "*_text_document"),
        str(tmp_path / "*"),  # both halves match; each pair is read once
        tmp_path,
    ):
        np.testing.assert_array_equal(db.read_lengths(source), both, err_msg=str(source))
    np.testing.assert_array_equal(db.read_lengths(a + ".bin"), [3, 1])
    # A pair listed twice is read twice, as an Arrow file listed twice is: nothing is dropped silently.
    np.testing.assert_array_equal(db.read_lengths([a, a + ".bin"]), [3, 1, 3, 1])
    np.testing.assert_array_equal(db.read_documents([a, b]), [0, 1, 2, 3])
    assert db.TokenStore(str(tmp_path / "*")).paths == (a + ".idx", b + ".idx")


def test_documents_left_open_are_closed_at_the_pair_end(tmp_path):
    a = write_pair(tmp_path / "a", [[1], [2], [3]], documents=[0, 2])
    b = write_pair(tmp_path / "b", [[4], [5]], documents=[0, 1, 2])
    np.testing.assert_array_equal(db.read_documents([a, b]), [0, 2, 3, 4, 5])


def test_the_sampler_plans_a_megatron_dataset_and_the_loader_collates_it(tmp_path):
    rng = np.random.default_rng(3)
    rows = [rng.integers(0, 50_000, int(n)) for n in rng.integers(1, 400, 300)]
    prefix = write_pair(tmp_path / "d", rows, np.uint16)
    sampler = db.BucketSampler(prefix, max_tokens=2048, seed=1)
    planned = np.concatenate(list(sampler))
    assert sorted(planned.tolist()) == list(range(300))  # every sample once
    store = db.TokenStore(prefix)
    batch = next(iter(sampler))
    out = db.collate(store, batch)
    for r, i in enumerate(batch):
        np.testing.assert_array_equal(out["input_ids"][r, : len(rows[i])], rows[i])
    pytest.importorskip("torch")
    seen = []
    with db.Loader(store, sampler) as loader:  # the uint16 tokens widened to int64 tensors
        for batch, planned in zip(loader, sampler.plan(), strict=True):
            for r, i in enumerate(planned):
                np.testing.assert_array_equal(batch["input_ids"][r, : len(rows[i])].numpy(), rows[i])
            seen.extend(planned.tolist())
    assert sorted(seen) == list(range(300))


def test_analyze_reads_a_megatron_prefix(tmp_path, capsys):
    from dflash_batch.tools.cli import main

    prefix = write_pair(tmp_path / "data_text_document", [np.arange(n % 50 + 1) for n in range(200)])
    assert main(["analyze", prefix, "--batch-size", "8"]) == 0
    assert "200 samples" in capsys.readouterr().out


def test_a_store_pickles_as_its_pair(tmp_path):
    prefix = write_pair(tmp_path / "d", [[1, 2], [3]], np.int16)
    store = pickle.loads(pickle.dumps(db.TokenStore(prefix)))
    np.testing.assert_array_equal(store[0], [1, 2])
    assert store.dtype == np.int16


def test_float_tokens_collate_when_whole_and_fail_clearly_when_not(tmp_path):
    prefix = write_pair(tmp_path / "f", [[1.0, 2.0], [3.5]], np.float32)
    store = db.TokenStore(prefix)
    np.testing.assert_array_equal(db.collate(store, [0])["input_ids"], [[1, 2]])
    with pytest.raises(db.DataError, match=r"token 3\.5 of a float token file is not a whole number"):
        db.collate(store, [1])


# One test per kind of bad pair: a DataError (or FileNotFoundError) naming the file and the fix.

ROWS = [[1, 2, 3], [4], [5, 6]]


def damaged(tmp_path, at: int | None = None, data: bytes = b"", *, idx_cut=None, bin_extra=b"", bin_cut=None):
    prefix = write_pair(tmp_path / "bad", ROWS, np.int32, [0, 3])
    idx = bytearray(open(prefix + ".idx", "rb").read())
    if at is not None:
        idx[at : at + len(data)] = data
    if idx_cut is not None:
        del idx[idx_cut:]
    open(prefix + ".idx", "wb").write(idx)
    binary = open(prefix + ".bin", "rb").read()
    open(prefix + ".bin", "wb").write(binary[:bin_cut] + bin_extra)
    return prefix


POINTERS = 9 + 8 + 1 + 8 + 8 + 4 * len(ROWS)
DOCUMENTS = POINTERS + 8 * len(ROWS)
BAD = [
    ("magic", dict(at=0, data=b"ARROW1"), r"is not a Megatron index .*IndexedDatasetBuilder"),
    ("version", dict(at=9, data=struct.pack("<Q", 3)), r"version 3; only version 1"),
    ("dtype", dict(at=17, data=b"\x09"), r"token dtype code 9, which the format does not define"),
    ("header cut", dict(idx_cut=30), r"is truncated \(the header needs 34 bytes"),
    ("index cut", dict(idx_cut=DOCUMENTS + 4), r"is truncated \(its header counts 3 sequences and 2 document"),
    ("counts", dict(at=18, data=struct.pack("<Q", 2)), r"bytes past the 2 sequences .* the header or the file"),
    (
        "bin cut",
        dict(bin_cut=20),
        r"is truncated \(its data file .*bad\.bin holds 20 bytes, but its 3 sequences fill 24",
    ),
    ("bin long", dict(bin_extra=b"\0" * 8), r"holds 32 bytes, 8 more than its 3 sequences fill"),
    ("pointer", dict(at=POINTERS + 8, data=struct.pack("<q", 4)), r"sequence 1 starts at byte 4 .* end at byte 12"),
    ("negative", dict(at=9 + 8 + 1 + 16 + 4, data=struct.pack("<i", -1)), r"negative length -1 .* at row 1"),
    ("documents", dict(at=DOCUMENTS + 8, data=struct.pack("<q", 9)), r"document boundary 1 is 9 after 0"),
]


@pytest.mark.parametrize(("what", "damage", "message"), BAD, ids=[b[0] for b in BAD])
def test_each_bad_pair_is_a_data_error_naming_the_file(tmp_path, what, damage, message):
    prefix = damaged(tmp_path, **damage)
    for read in (db.read_lengths, db.TokenStore, db.read_documents, lambda p: db.BucketSampler(p, batch_size=2)):
        with pytest.raises(db.DataError, match=message) as caught:
            read(prefix)
        assert "bad.idx" in str(caught.value)


@pytest.mark.parametrize("half", [".bin", ".idx"])
def test_a_missing_half_is_a_data_error_naming_both(tmp_path, half):
    prefix = write_pair(tmp_path / "d", ROWS)
    os.remove(prefix + half)
    other = ".idx" if half == ".bin" else ".bin"
    with pytest.raises(db.DataError, match=rf"d\{half} is missing beside .*d\{other}; .* copy both files"):
        db.read_lengths(prefix)


def test_a_missing_pair_is_file_not_found(tmp_path):
    message = r"nope does not exist; .* a Megatron prefix \(the path before \.bin/\.idx\)"
    with pytest.raises(FileNotFoundError, match=message):
        db.read_lengths(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no files match"):
        db.read_lengths(str(tmp_path / "*_document"))


def test_documents_of_an_arrow_file_or_table_are_refused(tmp_path):
    import pyarrow as pa
    from _arrow import token_table, write_ipc

    path = write_ipc(tmp_path / "d.arrow", token_table([np.arange(3)]))
    with pytest.raises(db.DataError, match=r"only Megatron \.bin/\.idx datasets record them"):
        db.read_documents(path)
    with pytest.raises(db.DataError, match="only Megatron"):
        db.read_documents(pa.table({"input_ids": [[1, 2]]}))


def test_a_renamed_index_is_recognised(tmp_path):
    prefix = write_pair(tmp_path / "d", ROWS)
    os.rename(prefix + ".idx", tmp_path / "d.arrow")
    with pytest.raises(db.DataError, match="looks like a Megatron index: pass its prefix"):
        db.read_lengths(tmp_path / "d.arrow")


# Damaged indexes, read in a capped child (tests/_adversary_child.py ``run_megatron``).

WORDS = [0, 1, 2, 7, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 1 << 40]


def mutation():
    return st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 2**40)),
        st.tuples(st.just("word"), st.integers(0, 2**40), st.sampled_from(WORDS), st.sampled_from([4, 8])),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("repeat"), st.floats(0, 1), st.integers(1, 16)),
    )


def damage_index(data: bytes, ops) -> bytes:
    def word(out: bytearray, op) -> bytearray:  # a count, a length, a pointer or a boundary set to an edge value
        at = op[1] % len(out)
        out[at : at + op[3]] = (op[2] % (1 << (8 * op[3]))).to_bytes(op[3], "little")[: len(out) - at]
        return out

    return mutate(data, ops, word)


@pytest.mark.fuzz
@pytest.mark.skipif(os.name != "posix", reason="RLIMIT_AS")
@settings(
    max_examples=int(os.environ.get("DFLASH_FUZZ_EXAMPLES", "6")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(DTYPES),
    damages=st.lists(st.lists(mutation(), min_size=1, max_size=3), min_size=24, max_size=24),
)
def test_damaged_indexes_never_lose_rows_silently(tmp_path_factory, seed, dtype, damages):
    from _adversary import run_cases

    rng = np.random.default_rng(seed)
    rows = [s for d in documents_of(rng, int(rng.integers(1, 40)), dtype) for s in d]
    root = tmp_path_factory.mktemp("damaged")
    original = write_pair(root / "original", rows, dtype, None)
    index = open(original + ".idx", "rb").read()
    cases = []
    for i, ops in enumerate(damages):
        prefix = write_pair(root / f"d{i}", rows, dtype, None)
        open(prefix + ".idx", "wb").write(damage_index(index, ops))
        cases.append({"kind": "megatron", "prefix": prefix, "lengths": [len(r) for r in rows], "ops": ops})
    outcomes, failures = run_cases(cases, {})
    assert not failures, "\n\n".join(failures)
    assert len(outcomes) == len(cases)

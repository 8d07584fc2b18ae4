"""Reading a tokenized dataset: lengths and token batches, against datasets and pyarrow in the same run.

    python benchmarks/read.py                 # the seed workload: 902,087 rows, ~8 GB of int32 tokens
    python benchmarks/read.py --rows 100000   # scaled down (figures per row are reported too)

The dataset is a Hugging Face ``save_to_disk`` directory (Arrow stream shards of 1000-row record batches,
``state.json``, ``dataset_info.json``), written once under ``--cache-dir`` and reused; ``datasets``
loads it like any saved dataset. Files are warm in the page cache for every reader alike (each reader
runs once untimed first).

Gathers run twice over the same batches: the first pass pays the page faults of a fresh mapping (a first
epoch), the second shows a long-lived store. Correctness is asserted before timing: lengths equal the
generated ones, gathered tokens equal what ``datasets`` returns. Targets: lengths from
``seq_len`` for 902K rows ≤ 50 ms, from ``input_ids`` offsets ≤ 100 ms, ``TokenStore.gather`` of a
16K-token batch ≥ 20× faster than ``ds[list_of_indices]``.

A Megatron-LM copy of the same rows (the same int32 tokens, written by megatron-core's
``IndexedDatasetBuilder``) is read beside it: lengths from its ``.idx``, and the same batches gathered
(checked against megatron-core's ``IndexedDataset``). Lengths are also timed over a full-size seed
index (902,087 sequences) whose ``.bin`` is sparse: the lengths never read it, only its size. Targets:
Megatron lengths of 902,087 sequences ≤ 20 ms; its gather at least as fast as Arrow's.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import logging
import os
import shutil
import statistics
import sys
import time
import warnings

import dflash_batch as db
import numpy as np
import pyarrow as pa
from _figures import write
from _timing import timings

BATCH_ROWS = 1000  # what datasets writes
SHARD_BYTES = 500 << 20  # datasets' default max_shard_size
MAX_TOKENS = 16384


def token_values(start_row: int, lengths: np.ndarray) -> np.ndarray:
    """Deterministic token ids for consecutive rows (cheap to make, distinct per row and position)."""
    total = int(lengths.sum())
    row_of = np.repeat(np.arange(start_row, start_row + len(lengths), dtype=np.int64), lengths)
    return ((row_of * 7919 + np.arange(total)) % 32_000).astype(np.int32)


def template(directory: str) -> tuple[pa.Schema, dict]:
    """Schema and state.json that `datasets` itself writes for these features (from a 1-row dataset)."""
    import datasets

    features = datasets.Features(
        {"input_ids": datasets.List(datasets.Value("int32")), "seq_len": datasets.Value("int64")}
    )
    tiny = datasets.Dataset.from_dict({"input_ids": [[1]], "seq_len": [1]}, features=features)
    tiny.save_to_disk(os.path.join(directory, "template"))
    with open(os.path.join(directory, "template", "state.json")) as f:
        state = json.load(f)
    schema = pa.ipc.open_stream(pa.memory_map(glob.glob(os.path.join(directory, "template", "*.arrow"))[0])).schema
    shutil.copy(os.path.join(directory, "template", "dataset_info.json"), directory)
    shutil.rmtree(os.path.join(directory, "template"))
    return schema, state


def generate(directory: str, lengths: np.ndarray) -> None:
    """Writes the save_to_disk directory shard by shard, never holding more than one record batch."""
    os.makedirs(directory, exist_ok=True)
    schema, state = template(directory)
    per_shard = max(BATCH_ROWS, int(SHARD_BYTES // (4 * lengths.mean())) // BATCH_ROWS * BATCH_ROWS)
    starts = list(range(0, len(lengths), per_shard))
    files = []
    for s, start in enumerate(starts):
        name = f"data-{s:05d}-of-{len(starts):05d}.arrow"
        files.append({"filename": name})
        with pa.OSFile(os.path.join(directory, name), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            for b in range(start, min(start + per_shard, len(lengths)), BATCH_ROWS):
                part = lengths[b : b + BATCH_ROWS]
                offsets = np.zeros(len(part) + 1, dtype=np.int32)
                np.cumsum(part, out=offsets[1:])
                ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(token_values(b, part)))
                batch = pa.record_batch([ids, pa.array(part.astype(np.int64))], schema=schema)
                writer.write_batch(batch)
        print(f"  wrote {name}", file=sys.stderr)
    state["_data_files"] = files
    with open(os.path.join(directory, "state.json"), "w") as f:
        json.dump(state, f)


def dataset_dir(cache_dir: str, rows: int) -> tuple[str, np.ndarray]:
    lengths = db.seed_workload(rows).astype(np.int64)
    directory = os.path.join(cache_dir, f"seed-hf-{rows}")
    if not complete(directory, lengths):
        shutil.rmtree(directory, ignore_errors=True)
        gigabytes = 4 * lengths.sum() / 1e9
        print(f"generating {directory} ({rows:,} rows, {gigabytes:.1f} GB of tokens) ...", file=sys.stderr)
        generate(directory, lengths)
        complete(directory, lengths, mark=True)
    return directory, lengths


def complete(directory: str, lengths: np.ndarray, mark: bool = False) -> bool:
    """Whether ``directory`` holds a copy of exactly these lengths (a cache written from another seed
    workload is rewritten); with ``mark``, records that it does."""
    done = os.path.join(directory, "COMPLETE")
    digest = hashlib.sha256(np.ascontiguousarray(lengths, dtype=np.int64).tobytes()).hexdigest()
    if mark:
        with open(done, "w") as f:
            f.write(digest)
    if not os.path.exists(done):
        return False
    with open(done) as f:
        return f.read() == digest


def megatron_copy(cache_dir: str, lengths: np.ndarray) -> str:
    """The rows as a Megatron pair (same tokens, int32), written once by megatron-core's builder."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    directory = os.path.join(cache_dir, f"seed-megatron-{len(lengths)}")
    prefix = os.path.join(directory, "data_text_document")
    if not complete(directory, lengths):
        os.makedirs(directory, exist_ok=True)
        print(f"generating {prefix} with megatron-core ...", file=sys.stderr)
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
        for start in range(0, len(lengths), BATCH_ROWS):
            part = lengths[start : start + BATCH_ROWS]
            tokens = np.split(token_values(start, part), np.cumsum(part)[:-1])
            for row in tokens:
                builder.add_item(torch.from_numpy(row))
                builder.end_document()
        builder.finalize(prefix + ".idx")
        complete(directory, lengths, mark=True)
    return prefix


def sparse_seed_index(cache_dir: str) -> tuple[str, np.ndarray]:
    """A full-size seed index (902,087 sequences, uint16 tokens) over a sparse ``.bin`` of the right
    size, for timing lengths alone. Written with megatron-core's own index writer."""
    from megatron.core.datasets.indexed_dataset import _IndexWriter

    lengths = db.seed_workload(db.SEED_SAMPLES).astype(np.int64)
    directory = os.path.join(cache_dir, "seed-megatron-sparse")
    prefix = os.path.join(directory, "data_text_document")
    if not complete(directory, lengths):
        os.makedirs(directory, exist_ok=True)
        with open(prefix + ".bin", "wb") as f:
            f.truncate(int(lengths.sum()) * 2)
        with _IndexWriter(prefix + ".idx", np.uint16) as writer:
            writer.write(lengths, None, np.arange(len(lengths) + 1))
        complete(directory, lengths, mark=True)
    return prefix, lengths


def level_page_cache(paths: list[str]) -> None:
    """Evicts ``paths`` from the page cache and reads them once, front to back, so every reader's files
    are cached the way a machine that read them once caches them. How a file was written decides the
    size of its cached pages (pyarrow's large writes leave 2 MB folios that one page fault maps whole,
    a builder's small writes leave 4 KB pages): without this, a first pass measures the writer."""
    if not hasattr(os, "posix_fadvise"):
        return
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            while os.read(fd, 1 << 24):
                pass
        finally:
            os.close(fd)


def warm(fn) -> object:
    """Runs ``fn`` once untimed (page cache, imports), returning its result for the correctness checks."""
    return fn()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=db.SEED_SAMPLES)
    parser.add_argument("--cache-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "dflash_batch", "bench"))
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--batches", type=int, default=300, help="16K-token batches gathered per reader")
    parser.add_argument("--json", metavar="FILE", help="record the figures under 'read' of FILE")
    args = parser.parse_args()

    import datasets

    directory, lengths = dataset_dir(args.cache_dir, args.rows)
    files = sorted(glob.glob(os.path.join(directory, "*.arrow")))
    size = sum(os.path.getsize(f) for f in files)
    print(f"dataset: {directory}: {args.rows:,} rows, {len(files)} shards, {size / 1e9:.2f} GB; cores={os.cpu_count()}")

    # -- lengths ---------------------------------------------------------------------------------------
    ds = datasets.load_from_disk(directory)
    rows = {}

    def pyarrow_column():
        parts = [pa.ipc.open_stream(pa.memory_map(f)).read_all().column("seq_len").to_numpy() for f in files]
        return np.concatenate(parts)

    readers = {
        "dflash_batch read_lengths(seq_len)": lambda: db.read_lengths(directory),
        "dflash_batch read_lengths(input_ids offsets)": lambda: db.read_lengths(directory, "input_ids"),
        "datasets ds['seq_len'][:]": lambda: ds["seq_len"][:],
        "pyarrow ipc.open_stream(...).column('seq_len')": pyarrow_column,
    }
    for name, fn in readers.items():
        start = time.perf_counter()
        np.testing.assert_array_equal(np.asarray(warm(fn)), lengths, err_msg=name)
        slow = time.perf_counter() - start > 1.0  # a few repeats are enough to time the slow baselines
        median, best = timings(lambda _, fn=fn: fn(), 3 if slow else args.repeats)
        rows[name] = (median, best)

    with warnings.catch_warnings():  # megatron-core warns that Transformer Engine and Apex are absent
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        prefix = megatron_copy(args.cache_dir, lengths)
        sparse, seed_lengths = sparse_seed_index(args.cache_dir)

    def their_lengths(prefix: str) -> np.ndarray:
        # Copied while the dataset lives: its lengths are a view of a map that its __del__ closes, so
        # `IndexedDataset(p).sequence_lengths` used after the dataset is gone reads unmapped memory.
        dataset = IndexedDataset(prefix)
        return np.array(dataset.sequence_lengths)

    megatron_rows = {
        "dflash_batch read_lengths(megatron prefix)": (lambda: db.read_lengths(prefix), lengths),
        "megatron-core IndexedDataset(...).sequence_lengths": (lambda: their_lengths(prefix), lengths),
        "dflash_batch read_lengths, 902,087 (sparse .bin)": (lambda: db.read_lengths(sparse), seed_lengths),
        "megatron-core, 902,087 (sparse .bin)": (lambda: their_lengths(sparse), seed_lengths),
    }
    logging.getLogger("megatron").setLevel(logging.WARNING)
    for name, (fn, expected) in megatron_rows.items():
        np.testing.assert_array_equal(np.asarray(warm(fn)), expected, err_msg=name)
        rows[name] = timings(lambda _, fn=fn: fn(), args.repeats)

    # -- token batches -----------------------------------------------------------------------------------
    level_page_cache([*files, prefix + ".bin"])
    store = db.TokenStore(directory)
    sampler = db.BucketSampler(store.lengths(), max_tokens=MAX_TOKENS, seed=0)
    batches = list(sampler.plan(0))[: args.batches]
    tokens_per_batch = statistics.mean(int(lengths[b].sum()) for b in batches)
    for b in batches[:5]:
        flat, _ = store.gather(b)
        expected = ds[b.tolist()]["input_ids"]
        np.testing.assert_array_equal(flat, np.concatenate([np.asarray(r) for r in expected]))

    megatron_store, theirs = db.TokenStore(prefix), IndexedDataset(prefix)
    for b in batches[:5]:
        flat, _ = megatron_store.gather(b)
        np.testing.assert_array_equal(flat, np.concatenate([theirs[int(i)] for i in b]))

    np_ds = ds.with_format("numpy")
    gatherers = {
        "dflash_batch TokenStore.gather": store.gather,
        "dflash_batch TokenStore.gather (megatron)": megatron_store.gather,
        "megatron-core np.concatenate(ds[i] for i)": lambda b: np.concatenate([theirs[int(i)] for i in b]),
        "datasets ds[list_of_indices]": lambda b: ds[b.tolist()]["input_ids"],
        "datasets (numpy format) ds[indices]": lambda b: np_ds[b]["input_ids"],
    }
    # Each reader maps the files itself; the first pass over the batches pays the page faults of a fresh
    # mapping (as in a first epoch), the second does not (later epochs of a long-lived store).
    batch_rows = {}
    for name, fn in gatherers.items():
        batch_rows[name] = [timings(lambda i, fn=fn: fn(batches[i]), len(batches))[0] for _ in range(2)]
    one = timings(lambda i: store[(i * 104_729) % len(store)], 2000)
    hf_one = timings(lambda i: ds[(i * 104_729) % len(ds)]["input_ids"], 200)

    # -- report -----------------------------------------------------------------------------------------
    scale = db.SEED_SAMPLES / args.rows
    print(f"\n{'reading every length':48} {'median ms':>10} {'best ms':>9} {'ns/row':>7} {'× dflash':>9}")
    base = rows["dflash_batch read_lengths(seq_len)"][0]
    for name, (median, best) in rows.items():
        print(f"{name:48} {median * 1e3:10.1f} {best * 1e3:9.1f} {median / args.rows * 1e9:7.1f} {median / base:9.1f}")
    title = f"one 16K-token batch ({tokens_per_batch:,.0f} tokens)"
    print(f"\n{title:48} {'1st pass µs':>11} {'2nd pass µs':>11} {'M tok/s':>8} {'× dflash':>9}")
    base = batch_rows["dflash_batch TokenStore.gather"]
    for name, (first, second) in batch_rows.items():
        rate = tokens_per_batch / second / 1e6
        ratios = f"{first / base[0]:.0f}/{second / base[1]:.0f}"
        print(f"{name:48} {first * 1e6:11.1f} {second * 1e6:11.1f} {rate:8.1f} {ratios:>9}")
    print(
        f"\none sample: store[i] {one[0] * 1e6:.2f} µs median; datasets ds[i]['input_ids'] {hf_one[0] * 1e6:.0f} µs "
        f"({hf_one[0] / one[0]:.0f}×); the seed measured ~3.4 ms"
    )

    seq = rows["dflash_batch read_lengths(seq_len)"][0] * scale
    offs = rows["dflash_batch read_lengths(input_ids offsets)"][0] * scale
    hf = batch_rows["datasets ds[list_of_indices]"]
    ratio, warm_ratio = hf[0] / base[0], hf[1] / base[1]
    note = "" if scale == 1 else f" (scaled ×{scale:.2f} to 902,087 rows)"
    print(f"\ntargets (medians){note}")
    print(f"  seq_len lengths ≤ 50 ms:         {seq * 1e3:.1f} ms  {'met' if seq <= 0.05 else 'MISSED'}")
    print(f"  input_ids offsets ≤ 100 ms:      {offs * 1e3:.1f} ms  {'met' if offs <= 0.1 else 'MISSED'}")
    verdict = "met" if ratio >= 20 else "MISSED"
    print(f"  gather ≥ 20× ds[list]:           {ratio:.0f}× first pass, {warm_ratio:.0f}× second  {verdict}")
    mega = rows["dflash_batch read_lengths, 902,087 (sparse .bin)"][0]
    print(f"  megatron lengths (902,087) ≤ 20 ms: {mega * 1e3:.1f} ms  {'met' if mega <= 0.02 else 'MISSED'}")
    arrow, megatron = base, batch_rows["dflash_batch TokenStore.gather (megatron)"]
    faster = megatron[1] <= arrow[1] * 1.05  # within the noise of a shared machine counts as as fast
    print(
        f"  megatron gather ≤ Arrow gather:   {megatron[0] / arrow[0]:.2f}× first pass, "
        f"{megatron[1] / arrow[1]:.2f}× second  {'met' if faster else 'MISSED'}"
    )
    figures = {
        "rows": args.rows,
        "gigabytes": size / 1e9,
        "batch_tokens": tokens_per_batch,
        "lengths": {
            key: {"median": m, "best": b}
            for key, (m, b) in zip(
                (
                    "seq_len",
                    "offsets",
                    "datasets",
                    "pyarrow",
                    "megatron",
                    "megatron_core",
                    "megatron_sparse",
                    "megatron_core_sparse",
                ),
                rows.values(),
                strict=True,
            )
        },
        "gather": {
            key: {"first": f, "second": s}
            for key, (f, s) in zip(
                ("dflash", "dflash_megatron", "megatron_core", "datasets", "datasets_numpy"),
                batch_rows.values(),
                strict=True,
            )
        },
        "one": {"store": one[0], "datasets": hf_one[0]},
    }
    command = "python benchmarks/read.py" + ("" if args.rows == db.SEED_SAMPLES else f" --rows {args.rows}")
    write(args.json, "read", figures, command)


if __name__ == "__main__":
    main()

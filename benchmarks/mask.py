"""Collation with a loss mask beside the tokens against the same collation without one, in the same run.

    python benchmarks/mask.py                   # 20,000 seed-workload rows, 300 16K-token batches
    python benchmarks/mask.py --rows 5000 --batches 50 --rounds 3

A prompt-completion Arrow file (int32 tokens, a 0/1 ``completion_mask`` of int8, prompts a random 5–50% of
each row) is written once into a temporary directory and mapped twice: ``TokenStore(path, mask=None)`` and
``TokenStore(path)`` (the mask found by convention). Each round times the first ``--batches`` batches of an
epoch's plan (max_tokens=16384) collated into reused int32 buffers — padded (``db.collate(out=)``) and
packed rows (``db.collate_packed``) — without the mask and then with it, the order alternating; the ratio
is taken within each round and the median of the rounds' ratios is the figure (shared machines drift).
Correctness first: the masked labels equal the unmasked ones with -100 where the mask is 0.
Target: collation with the mask within 1.3× of the time without. (Opening the masked store indexes the
mask's runs once: one pass over it, about 1 ns a token here.)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import dflash_batch as db
import numpy as np
import pyarrow as pa
from _figures import write

MAX_TOKENS = 16384
TARGET = 1.3


def write_dataset(path: Path, rows: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    lengths = np.minimum(db.seed_workload(rows, seed=seed), MAX_TOKENS).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = rng.integers(1, 32000, int(offsets[-1]), dtype=np.int32)
    prompts = (lengths * rng.uniform(0.05, 0.5, rows)).astype(np.int64)
    positions = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], lengths)
    mask = (positions >= np.repeat(prompts, lengths)).astype(np.int8)
    table = pa.table(
        {
            "input_ids": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(tokens)),
            "completion_mask": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(mask)),
        }
    )
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1000)


def padded(store: db.TokenStore, batches: list[np.ndarray], out: dict[str, np.ndarray]) -> float:
    start = time.perf_counter()
    for batch in batches:
        db.collate(store, batch, out=out)
    return time.perf_counter() - start


def packed(store: db.TokenStore, batches: list[np.ndarray], _: object) -> float:
    start = time.perf_counter()
    for batch in batches:
        db.collate_packed(store, batch, capacity=MAX_TOKENS, dtype="int32")
    return time.perf_counter() - start


def compare(rows: int, batches: int, rounds: int) -> dict[str, float]:
    """Prints the table (see the module docs) and returns each collation's median ratio."""
    ratios_by_name = {}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "prompt_completion.arrow"
        write_dataset(path, rows)
        plain, masked = db.TokenStore(str(path), mask=None), db.TokenStore(str(path))
        assert plain.mask is None and masked.mask == "completion_mask"
        lengths = plain.lengths()
        plans = {
            "padded": db.BucketSampler(lengths, max_tokens=MAX_TOKENS, seed=0).plan(0),
            "packed": db.BucketSampler(lengths, max_tokens=MAX_TOKENS, seed=0, mode="packed").plan(0),
        }
        keys = ("input_ids", "attention_mask", "labels", "position_ids")
        out = {key: np.empty(MAX_TOKENS, dtype=np.int32) for key in keys}
        check = plans["padded"][0]
        a, b = db.collate(plain, check), db.collate(masked, check)
        expected = np.where(b["attention_mask"] == 1, np.where(b["labels"] == -100, -100, a["labels"]), -100)
        assert np.array_equal(b["labels"], expected) and (b["labels"] != a["labels"]).any(), "the mask is not applied"
        print(f"{rows:,} rows, {int(lengths.sum()):,} tokens; {batches} batches of ≤ {MAX_TOKENS:,} tokens")
        print(f"{'collation':<10} {'without ms':>11} {'with mask ms':>13} {'ratio':>7}   target ≤ {TARGET}×")
        for name, collate in (("padded", padded), ("packed", packed)):
            chosen = [plans[name][i] for i in range(min(batches, len(plans[name])))]
            collate(plain, chosen, out), collate(masked, chosen, out)  # map the pages in
            without, with_mask, ratios = [], [], []
            for round_ in range(rounds):
                order = (plain, masked) if round_ % 2 == 0 else (masked, plain)
                times = {id(store): collate(store, chosen, out) for store in order}
                without.append(times[id(plain)])
                with_mask.append(times[id(masked)])
                ratios.append(times[id(masked)] / times[id(plain)])
            ratio = ratios_by_name[name] = statistics.median(ratios)
            verdict = "MET" if ratio <= TARGET else "MISSED"
            print(
                f"{name:<10} {statistics.median(without) * 1e3:>11.1f} {statistics.median(with_mask) * 1e3:>13.1f} "
                f"{ratio:>6.2f}×   {verdict}"
            )
    return ratios_by_name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", metavar="FILE", help="record the ratios under 'mask' of FILE")
    args = parser.parse_args()
    ratios = compare(args.rows, args.batches, args.rounds)
    write(args.json, "mask", ratios, "python benchmarks/mask.py")


if __name__ == "__main__":
    main()

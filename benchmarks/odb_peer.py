"""Online Dynamic Batching (ODB, PyPI ``online-dynamic-batching``) beside dflash_batch on the same data, the same
token budget and the same DataLoader processes.

    python benchmarks/odb_peer.py                         # 100,000 seed-workload samples, budget 16,384, 2 workers
    python benchmarks/odb_peer.py --samples 20000         # a quick look
    python benchmarks/odb_peer.py --json docs/figures.json

One process, a map-style dataset whose examples are token tensors of the seed workload's lengths (made in
the DataLoader's workers, as a tokenizing dataset would), one padding collator. Each way runs one epoch through
a ``torch`` DataLoader with 2 worker processes and records which examples each batch holds:

* **dflash_batch**: ``DataLoader(dataset, batch_sampler=db.BucketSampler(lengths, max_tokens=budget,
  accumulation=4))`` — the plan made up front from the lengths — at its default and at
  ``target_efficiency=0.99`` (padding near ODB's large buffer's);
* **ODB**: ``odb.ODBDataLoader(dataset, token_budget=budget, shuffle=True, num_workers=2, ...)`` — batches formed
  online from a buffer of processed examples: the README's setting (``prefetch_factor=64``: a buffer of 128
  examples) and a large buffer (``buffer_size=8192``).

Per way: examples trained once (missing / repeated), padding efficiency (real tokens over rows × longest),
the budget's fill (padded tokens over the budget), ``window_tv`` over windows of 4 batches (one optimizer step
of accumulation 4), batches, seconds for the epoch and per batch, and whether it resumes exactly: dflash_batch
has ``state_dict``/``load_state_dict`` (tests/planning/test_crash_resume.py); ODB's loader has no state to save.
Rank balance across ranks needs several processes and is not measured here.
"""

from __future__ import annotations

import argparse
import sys
import time

import dflash_batch as db
import dflash_batch._core as _core
import numpy as np
import torch
from _figures import command_of, write

BUDGET = 16384
ACCUMULATION = 4
WORKERS = 2


class Tokens(torch.utils.data.Dataset):
    """Example ``i``: ``lengths[i]`` tokens (made in the worker, as a tokenizing dataset makes them) and its index."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": torch.full((int(self.lengths[i]),), 7, dtype=torch.int32), "idx": int(i)}

    def pop(self) -> Tokens:
        # ODB 0.1.2 starts torch's worker loop with the dataset itself where this torch passes a one-item
        # holder the worker pops the dataset from; answering pop() with itself lets ODB run here unchanged.
        return self


def collate(examples: list[dict]) -> dict:
    longest = max(len(e["input_ids"]) for e in examples)
    ids = torch.zeros((len(examples), longest), dtype=torch.int32)
    for row, e in enumerate(examples):
        ids[row, : len(e["input_ids"])] = e["input_ids"]
    return {"input_ids": ids, "idx": torch.tensor([e["idx"] for e in examples], dtype=torch.int64)}


def epoch_of(loader, odb: bool) -> tuple[list[np.ndarray], float]:
    began, batches = time.perf_counter(), []
    for batch in loader:
        if odb:
            import odb as peer

            peer.pop_step_info(batch)
        batches.append(batch["idx"].numpy().astype(np.uint32))
    return batches, time.perf_counter() - began


def scored(lengths: np.ndarray, batches: list[np.ndarray], seconds: float) -> dict:
    indices = np.concatenate(batches) if batches else np.zeros(0, np.uint32)
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in batches])]).astype(np.uint32)
    seen = np.bincount(indices, minlength=len(lengths))
    rows = np.diff(offsets).astype(np.int64)
    longest = np.maximum.reduceat(lengths[indices].astype(np.int64), offsets[:-1].astype(np.int64))
    return {
        "missing": int((seen == 0).sum()),
        "repeated": int((seen > 1).sum()),
        "efficiency": _core.efficiency(offsets, indices, lengths),
        "fill": float((rows * longest).mean() / BUDGET),
        "over_budget": int((rows * longest > BUDGET).sum()),
        "window_tv": _core.window_tv(offsets, indices, lengths, ACCUMULATION),
        "batches": len(batches),
        "seconds": seconds,
        "us_per_batch": seconds / max(1, len(batches)) * 1e6,
    }


def collect(samples: int) -> dict:
    import odb

    lengths = db.seed_workload(samples, seed=0)
    lengths = np.minimum(lengths, BUDGET).astype(np.uint32)  # one example fits the budget in both
    dataset = Tokens(lengths)
    print(f"seed workload: {samples:,} examples, budget {BUDGET:,} tokens, {WORKERS} DataLoader workers")
    ways = {}
    sampler = db.BucketSampler(lengths, max_tokens=BUDGET, accumulation=ACCUMULATION, world_size=1, rank=0, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=WORKERS, collate_fn=collate)
    ways["dflash_batch"] = scored(lengths, *epoch_of(loader, odb=False))
    # At ODB's padding: the planner's efficiency target raised (mixing traded for padding, as ODB's buffer does).
    tight = db.BucketSampler(
        lengths, max_tokens=BUDGET, accumulation=ACCUMULATION, world_size=1, rank=0, seed=0, target_efficiency=0.99
    )
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=tight, num_workers=WORKERS, collate_fn=collate)
    ways["dflash_batch_099"] = scored(lengths, *epoch_of(loader, odb=False))
    for name, extra in (("odb", {"prefetch_factor": 64}), ("odb_buffer_8192", {"buffer_size": 8192})):
        peer = odb.ODBDataLoader(
            dataset, token_budget=BUDGET, batch_size=1, shuffle=True, num_workers=WORKERS, collate_fn=collate, **extra
        )
        ways[name] = scored(lengths, *epoch_of(peer, odb=True))
    print(
        f"\n{'way':<18} {'missing':>7} {'repeated':>8} {'efficiency':>10} {'fill':>6} {'over':>5} {'window_tv':>9} "
        f"{'batches':>8} {'seconds':>8} {'µs/batch':>9}"
    )
    for name, w in ways.items():
        print(
            f"{name:<18} {w['missing']:>7} {w['repeated']:>8} {w['efficiency']:>10.4f} {w['fill']:>6.3f} "
            f"{w['over_budget']:>5} {w['window_tv']:>9.4f} {w['batches']:>8,} {w['seconds']:>8.1f} "
            f"{w['us_per_batch']:>9.0f}"
        )
    print("resume: dflash_batch exact (state_dict / load_state_dict); ODB: no loader state to save or load")
    return {"samples": samples, "budget": BUDGET, "workers": WORKERS, "odb_version": odb.__version__, "ways": ways}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--json", metavar="FILE", help="record the figures under 'odb_peer' of FILE")
    given = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(given)
    write(args.json, "odb_peer", collect(args.samples), command_of("odb_peer.py", given))
    return 0


if __name__ == "__main__":
    sys.exit(main())

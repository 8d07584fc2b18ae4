"""Rank balance of ODB (online-dynamic-batching) and dflash_batch across ranks, under an attention price: the
same seed-workload examples, token budget and DataLoader workers as ``odb_peer.py``, on 2 ranks.

    python benchmarks/odb_ranks.py                        # 20,000 examples, 2 ranks (gloo), 2 workers each
    python benchmarks/odb_ranks.py --json docs/figures.json

ODB runs as its docs say for DDP: one process per rank in a gloo process group, each with
``ODBDataLoader(dataset, sampler=DistributedSampler(...), token_budget=16384, num_workers=2,
prefetch_factor=64)``; its collate processes align the ranks' batch counts with an ``all_gather`` every grouping
round. Each rank records the examples of its batches; step ``s`` is every rank's batch ``s``. dflash_batch's
ranks take the steps of one global plan (``BucketSampler(world_size=2, accumulation=4)``), planned here, at its
default and balanced by the attention price (``rank_cost``).

Per way: examples trained once, steps per rank, the p99 over steps of max/min padded tokens across the ranks,
and the synchronous efficiency — the share of GPU time that does work when ranks wait for the slowest every
micro-batch — with a row costing ``rows × (L + L²/(6·5120))`` for its longest length ``L`` (a 27B-class width).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import dflash_batch as db
import dflash_batch._core as _core
import numpy as np
from _figures import command_of, write

BUDGET = 16384
RANKS = 2
ACCUMULATION = 4
ATTENTION = (1.0, 1.0 / (6 * 5120))

RANK = r"""
import json, os, sys
import numpy as np
import torch
import torch.distributed as dist
sys.path.insert(0, sys.argv[4])
import dflash_batch as db
import odb
from odb_peer import BUDGET, Tokens, collate

rank, meet, out, _, samples = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
dist.init_process_group("gloo", init_method=f"file://{meet}", rank=rank, world_size=2)
lengths = np.minimum(db.seed_workload(samples, seed=0), BUDGET).astype(np.uint32)
dataset = Tokens(lengths)
sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=0)
loader = odb.ODBDataLoader(dataset, token_budget=BUDGET, batch_size=1, sampler=sampler, num_workers=2,
                           prefetch_factor=64, collate_fn=collate)
batches = []
for batch in loader:
    odb.pop_step_info(batch)
    batches.append(batch["idx"].tolist())
with open(out, "w") as f:
    json.dump(batches, f)
dist.barrier()
os._exit(0)  # no gloo teardown at exit: it has aborted (SIGABRT) after all work was recorded
"""


def odb_steps(samples: int) -> list[list[list[int]]]:
    """Each rank's batches under ODB, from RANKS processes in a gloo group."""
    with tempfile.TemporaryDirectory() as scratch:
        meet, outs = os.path.join(scratch, "meet"), [os.path.join(scratch, f"rank{r}.json") for r in range(RANKS)]
        here = str(Path(__file__).resolve().parent)
        runs = [
            subprocess.Popen([sys.executable, "-c", RANK, str(r), meet, outs[r], here, str(samples)])
            for r in range(RANKS)
        ]
        if [p.wait(timeout=1800) for p in runs] != [0] * RANKS:
            raise SystemExit("an ODB rank failed")
        return [json.loads(Path(out).read_text()) for out in outs]


def scored(lengths: np.ndarray, offsets: np.ndarray, indices: np.ndarray) -> dict:
    seen = np.bincount(indices, minlength=len(lengths))
    imbalance = _core.rank_imbalance(offsets, indices, lengths, RANKS, 1)
    sync = _core.sync_efficiency(offsets, indices, lengths, RANKS, ACCUMULATION, 1, ATTENTION)
    return {
        "missing": int((seen == 0).sum()),
        "repeated": int((seen > 1).sum()),
        "steps": (len(offsets) - 1) // RANKS,
        "efficiency": _core.efficiency(offsets, indices, lengths),
        "p99": imbalance[1] if imbalance else None,
        "sync": sync[0] if sync else None,
    }


def csr(batches: list) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in batches])]).astype(np.uint32)
    indices = np.concatenate([np.asarray(b, np.uint32) for b in batches]) if batches else np.zeros(0, np.uint32)
    return offsets, indices


def collect(samples: int) -> dict:
    lengths = np.minimum(db.seed_workload(samples, seed=0), BUDGET).astype(np.uint32)
    print(f"seed workload: {samples:,} examples, budget {BUDGET:,}, {RANKS} ranks, attention price {ATTENTION}")
    ways = {}
    for name, extra in (("dflash_batch", {}), ("dflash_batch_rank_cost", {"rank_cost": ATTENTION})):
        sampler = db.BucketSampler(
            lengths, max_tokens=BUDGET, world_size=RANKS, rank=0, accumulation=ACCUMULATION, seed=0, **extra
        )
        plan = sampler.plan(0)
        ways[name] = scored(lengths, plan.offsets, plan.indices)
    per_rank = odb_steps(samples)
    counts = [len(b) for b in per_rank]
    steps = min(counts)
    interleaved = [per_rank[r][s] for s in range(steps) for r in range(RANKS)]
    ways["odb"] = {**scored(lengths, *csr(interleaved)), "batches_per_rank": counts}
    # Batches past the shortest rank's count (none when ODB aligns them) are counted as trained, not in steps.
    extra = [i for r in range(RANKS) for b in per_rank[r][steps:] for i in b]
    if extra:
        ways["odb"]["unaligned_examples"] = len(extra)
    print(f"\n{'way':<24} {'missing':>7} {'repeated':>8} {'steps':>7} {'efficiency':>10} {'p99 imb':>8} {'sync':>7}")
    for name, w in ways.items():
        print(
            f"{name:<24} {w['missing']:>7} {w['repeated']:>8} {w['steps']:>7,} {w['efficiency']:>10.4f} "
            f"{w['p99']:>8.2f} {w['sync']:>7.3f}"
        )
    return {"samples": samples, "ranks": RANKS, "ways": ways}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--json", metavar="FILE", help="record the figures under 'odb_ranks' of FILE")
    given = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(given)
    write(args.json, "odb_ranks", collect(args.samples), command_of("odb_ranks.py", given))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""accelerate with 2 processes (torchrun, gloo): ``accelerator.prepare`` on a ``DataLoader(batch_sampler=
batch_sampler(sampler))`` and a wrapped ``db.Loader`` gives each rank exactly its share of every epoch's
plan, the epoch advancing; the bare sampler (which accelerate would shard again) and a sampler planned for
other ranks are refused with the fix. Checked on the rows trained."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")
pytest.importorskip("datasets")

import dflash_batch as db

pytestmark = pytest.mark.multiprocess  # several processes: `make test-all`, not the fast lane

HERE = Path(__file__).parents[1]  # the shared helpers


@pytest.fixture(scope="module")
def lines(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("accelerate")
    data, record = str(root / "data"), root / "rec"
    env = {**os.environ, "PYTHONPATH": str(HERE), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(HERE / "_trainer_run.py")], env={**env, "MAKE_DATASET": data}, check=True)
    command = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(HERE / "_accelerate_run.py")]
    done = subprocess.run(
        [sys.executable, *command, data, str(record)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = []
    for rank in range(2):
        found += [json.loads(line) for line in Path(f"{record}.{rank}").read_text().splitlines()]
    found.append({"data": data})
    return found


def shares(lines, kind, data):
    store = db.TokenStore(data)
    for rank in range(2):
        sampler = db.BucketSampler(store.lengths(), max_tokens=128, seed=5, world_size=2, rank=rank)
        for epoch in sorted({line["epoch"] for line in lines if line.get("kind") == kind}):
            got = [
                sorted(line["rows"])
                for line in lines
                if line.get("kind") == kind and line["rank"] == rank and line["epoch"] == epoch
            ]
            plan = sampler.plan(epoch)
            yield rank, epoch, got, [sorted(plan[s * 2 + rank].tolist()) for s in range(plan.steps)]


def test_prepared_dataloader_gives_each_rank_its_share_once_per_epoch(lines):
    data = lines[-1]["data"]
    seen = {}
    for rank, epoch, got, expected in shares(lines, "dataloader", data):
        assert got == expected, f"rank {rank} epoch {epoch}"
        seen[rank, epoch] = got
    assert {epoch for _, epoch in seen} == {0, 1, 5}
    assert seen[0, 0] != seen[0, 1], "the epoch did not advance"
    lengths = {line["value"] for line in lines if line.get("kind") == "dataloader_len"}
    assert lengths == {len(db.BucketSampler(db.TokenStore(data).lengths(), max_tokens=128, world_size=2, rank=0))}


def test_prepared_loader_gives_each_rank_its_share(lines):
    for rank, epoch, got, expected in shares(lines, "loader", lines[-1]["data"]):
        assert got == expected, f"rank {rank} epoch {epoch}"


def test_a_sampler_for_other_ranks_is_refused_naming_the_fix(lines):
    errors = [line["error"] for line in lines if line.get("kind") == "one_rank"]
    assert len(errors) == 2 and all("world_size=accelerator.num_processes" in (e or "") for e in errors)


def test_the_bare_sampler_sharded_again_by_accelerate_is_refused_naming_the_adapter(lines):
    """accelerate's shard would give each rank every 2nd batch of its own share: half the data, silently."""
    errors = [line["error"] for line in lines if line.get("kind") == "bare"]
    assert len(errors) == 2 and all("db.adapters.accelerate.batch_sampler(sampler)" in (e or "") for e in errors)

"""Real multi-process runs with the gloo backend on the CPU: ranks default to the process group, share the
epoch without overlap, and a rank with a different seed makes every rank raise instead of hanging."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")


def _worker(rank: int, world: int, init_file: str, out_dir: str, bad_seed_rank: int | None) -> None:
    import dflash_batch as db
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        lengths = db.seed_workload(3000, seed=4)
        seed = 1 if rank == bad_seed_rank else 0
        sampler = db.BucketSampler(lengths, max_tokens=8192, seed=seed)  # world_size/rank from the group
        result: dict = {"world": sampler.world_size, "rank": sampler.rank}
        try:
            seen = []
            for epoch in range(2):
                sampler.set_epoch(epoch)
                rows = [batch.tolist() for batch in sampler]
                seen.append(sorted(i for batch in rows for i in batch))
                result[f"steps{epoch}"] = len(rows)
                # A collective per step, as DDP does: equal step counts or this would hang.
                for _ in rows:
                    dist.all_reduce(torch.zeros(1))
            result["seen"] = seen
        except db.PlanError as e:
            result["error"] = str(e)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _run(tmp_path: Path, world: int, bad_seed_rank: int | None = None) -> list[dict]:
    init = tmp_path / "init"
    mp.spawn(_worker, args=(world, str(init), str(tmp_path), bad_seed_rank), nprocs=world, join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built in")
def test_ranks_share_every_epoch_without_overlap(tmp_path):
    results = _run(tmp_path, 3)
    assert [r["rank"] for r in results] == [0, 1, 2] and {r["world"] for r in results} == {3}
    for epoch in range(2):
        assert len({r[f"steps{epoch}"] for r in results}) == 1, "ranks ran different step counts"
        union = sorted(i for r in results for i in r["seen"][epoch])
        assert union == list(range(3000)), "a sample was lost or repeated across ranks"


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built in")
def test_a_rank_with_another_seed_makes_every_rank_raise(tmp_path):
    results = _run(tmp_path, 2, bad_seed_rank=1)
    for r in results:
        assert "error" in r, r
        assert "ranks disagree on the plan" in r["error"]
        assert "seed: rank 0 0, rank 1 1" in r["error"]


def test_no_process_group_no_check():
    import dflash_batch as db

    sampler = db.BucketSampler([5, 6, 7, 8], batch_size=2)
    assert sampler.world_size == 1 and len(list(sampler)) == 2
    with pytest.raises(TypeError, match="check_ranks must be a bool"):
        db.BucketSampler([5, 6], batch_size=2, check_ranks="yes")


def test_torchrun_environment_gives_the_ranks(monkeypatch):
    import dflash_batch as db

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    sampler = db.BucketSampler(list(range(1, 41)), batch_size=2)
    assert (sampler.world_size, sampler.rank) == (4, 2)
    explicit = db.BucketSampler(list(range(1, 41)), batch_size=2, world_size=2, rank=0)
    assert (explicit.world_size, explicit.rank) == (2, 0)
    monkeypatch.setenv("RANK", "two")
    with pytest.raises(db.PlanError, match="RANK='two'"):
        db.BucketSampler([5, 6], batch_size=2)

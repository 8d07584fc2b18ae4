"""Real multi-process runs with the gloo backend on the CPU: 4 ranks train a tiny model under DDP from the
Loader, default to the process group, share every epoch without overlap, and a rank with a different seed
makes every rank raise instead of hanging."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")
pytest.importorskip("pyarrow")

SAMPLES = 600


def _worker(rank: int, world: int, init_file: str, out_dir: str, bad_seed_rank: int | None, settings: dict) -> None:
    import dflash_batch as db
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        store = db.TokenStore(str(Path(out_dir) / "tokens.arrow"))
        given = {"seed": 0, **settings.get("all", {}), **(settings.get("bad", {}) if rank == bad_seed_rank else {})}
        schedule = given.pop("schedule", None)
        if schedule is not None:  # the rows as a two-source mixture whose weights change by epoch
            import pyarrow as pa

            table = pa.ipc.open_file(str(Path(out_dir) / "tokens.arrow")).read_all()
            halves = {"a": table.slice(0, SAMPLES // 2), "b": table.slice(SAMPLES // 2)}
            points = {int(epoch): weights for epoch, weights in schedule.items()}
            sources = {name: (db.TokenStore(part), 0.5) for name, part in halves.items()}
            store = db.Mixture(sources, unit="samples", schedule=points)
            sampler = db.BucketSampler(store, max_tokens=256, **given)
        else:
            sampler = db.BucketSampler(store.lengths(), max_tokens=256, **given)  # world_size/rank from the group
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Embedding(64, 8), torch.nn.Linear(8, 64))
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        result: dict = {"world": sampler.world_size, "rank": sampler.rank}
        try:
            seen = []
            with db.Loader(store, sampler, prefetch=2) as loader:
                for epoch in range(2):
                    loader.set_epoch(epoch)
                    plan, rows = sampler.plan(epoch), []
                    for step, batch in enumerate(loader):
                        rows.extend(plan[step * world + rank].tolist())
                        logits = model(batch["input_ids"])  # DDP: gradients all-reduced every step
                        loss = torch.nn.functional.cross_entropy(
                            logits.reshape(-1, 64), batch["input_ids"].reshape(-1) % 64
                        )
                        optimizer.zero_grad()
                        loss.backward()
                        optimizer.step()
                    seen.append(sorted(rows))
                    result[f"steps{epoch}"] = len(loader)
            result["seen"] = seen
        except db.PlanError as e:
            result["error"] = str(e)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        # Every rank's last collective has completed on every rank, then the process leaves without
        # tearing the group down: gloo's threads sometimes aborted the process (SIGABRT) in that
        # teardown, after every result was written (seen in CI and under load here).
        dist.barrier()
    import os

    os._exit(0)


def _run(tmp_path: Path, world: int, bad_seed_rank: int | None = None, settings: dict | None = None) -> list[dict]:
    """``world`` ranks: ``settings["all"]`` on every one, ``settings["bad"]`` on ``bad_seed_rank`` (seed 1)."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(1)
    rows = [rng.integers(1, 64, n).astype(np.int32) for n in rng.integers(3, 60, SAMPLES)]
    table = pa.table({"input_ids": pa.array(rows, type=pa.list_(pa.int32()))})
    with pa.ipc.new_file(str(tmp_path / "tokens.arrow"), table.schema) as writer:
        writer.write_table(table)
    init = tmp_path / "init"
    settings = settings if settings is not None else {"bad": {"seed": 1}}
    mp.spawn(_worker, args=(world, str(init), str(tmp_path), bad_seed_rank, settings), nprocs=world, join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built in")
@pytest.mark.multiprocess  # 4 processes
def test_four_ranks_train_under_ddp_on_disjoint_shares_of_every_epoch(tmp_path):
    results = _run(tmp_path, 4)
    assert [r["rank"] for r in results] == [0, 1, 2, 3] and {r["world"] for r in results} == {4}
    for epoch in range(2):
        assert len({r[f"steps{epoch}"] for r in results}) == 1, "ranks ran different step counts"
        union = sorted(i for r in results for i in r["seen"][epoch])
        assert union == list(range(SAMPLES)), "a sample was lost or repeated across ranks"


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built in")
@pytest.mark.multiprocess  # 2 processes
def test_a_rank_with_another_seed_makes_every_rank_raise(tmp_path):
    results = _run(tmp_path, 2, bad_seed_rank=1)
    for r in results:
        assert "error" in r, r
        assert "ranks disagree on the plan" in r["error"]
        assert "seed: rank 0 0, rank 1 1" in r["error"]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built in")
@pytest.mark.multiprocess  # 2 processes
def test_a_rank_with_another_cap_on_samples_per_row_makes_every_rank_raise(tmp_path):
    """``max_docs_per_row`` shapes the plan: it is in the plan's key, so ranks that disagree on it refuse, naming it."""
    settings = {"all": {"mode": "packed", "max_docs_per_row": 8}, "bad": {"max_docs_per_row": 4}}
    results = _run(tmp_path, 2, bad_seed_rank=1, settings=settings)
    for r in results:
        assert "error" in r, r
        assert "ranks disagree on the plan" in r["error"]
        assert "max_docs_per_row: rank 0 8, rank 1 4" in r["error"]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built in")
@pytest.mark.multiprocess  # 2 processes, twice
def test_ranks_share_each_epoch_of_a_weight_schedule_and_refuse_another(tmp_path):
    """A mixture's schedule shapes the plan (issue 63): two ranks with the same schedule train disjoint shares of
    each epoch, at its weights; a rank with another schedule makes both refuse, naming the mixture."""
    import collections

    schedule = {"1": {"a": 0.2, "b": 0.8}}
    results = _run(tmp_path, 2, settings={"all": {"schedule": schedule}})
    for epoch, share_a in ((0, 0.5), (1, 0.2)):
        trained = collections.Counter(i for r in results for i in r["seen"][epoch])
        from_a = sum(count for row, count in trained.items() if row < SAMPLES // 2)
        assert sum(trained.values()) == SAMPLES and from_a == round(share_a * SAMPLES), f"epoch {epoch}'s weights"
    other = tmp_path / "other"
    other.mkdir()
    settings = {"all": {"schedule": schedule}, "bad": {"schedule": {"1": {"a": 0.3, "b": 0.7}}}}
    for r in _run(other, 2, bad_seed_rank=1, settings=settings):
        assert "error" in r and "ranks disagree on the plan" in r["error"] and "mixture" in r["error"], r


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

"""Per-source losses under several processes (issue 59): ``loss/<source>`` covered rank 0's micro-batches
only (7 of 13 steps missed a source rank 1 trained), while ``loss`` was averaged over ranks. Now the
Trainer's logging sums every rank's losses and tokens per source: the same means on every rank, over
every token trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import dflash_batch as db
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        losses = db.SourceLosses(["a", "b"])
        generator = torch.Generator().manual_seed(rank)
        # Rank 0 trains only source a, rank 1 both: a rank-0 mean would miss b altogether.
        for _ in range(3):
            logits = torch.randn(2, 6, 11, generator=generator)
            labels = torch.randint(0, 11, (2, 6), generator=generator)
            source = torch.tensor([0, 0]) if rank == 0 else torch.tensor([0, 1])
            losses.add(logits, {"labels": labels, "source": source})
        own = {"sums": losses._sums.tolist(), "tokens": losses._tokens.tolist()}
        result = {"own": own, "mine": losses.means(reset=False), "all": losses.means(all_ranks=True)}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.barrier()
    import os

    os._exit(0)


@pytest.mark.multiprocess  # 2 processes
def test_every_ranks_tokens_count_in_each_sources_mean(tmp_path):
    mp = pytest.importorskip("torch.multiprocessing")
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not built in")
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0]["all"] == results[1]["all"], "every rank logs the same means"
    sums = [sum(r["own"]["sums"][s] for r in results) for s in range(2)]
    tokens = [sum(r["own"]["tokens"][s] for r in results) for s in range(2)]
    assert results[0]["all"] == pytest.approx({"a": sums[0] / tokens[0], "b": sums[1] / tokens[1]})
    assert results[0]["mine"]["b"] != results[0]["mine"]["b"], "rank 0 alone trained no token of b (nan)"


def test_without_a_process_group_all_ranks_is_this_processs_own():
    import dflash_batch as db

    losses = db.SourceLosses(["a"])
    logits, labels = torch.zeros(1, 4, 3), torch.tensor([[0, 1, 2, 0]])
    losses.add(logits, {"labels": labels, "source": torch.tensor([0])})
    assert losses.means(reset=False, all_ranks=True) == losses.means(reset=False)

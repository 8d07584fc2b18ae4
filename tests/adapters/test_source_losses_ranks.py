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


@pytest.mark.multiprocess  # torchrun, 2 processes
def test_the_hf_trainer_under_torchrun_logs_each_source_every_rank_trained(tmp_path):
    """The real Trainer, 2 processes, GA 2: every log line's loss/<source> keys are the sources some rank
    trained a label of in that optimizer step (before: rank 0's alone, missing sources only rank 1 had)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("transformers")
    here = Path(__file__).parents[1]  # the shared helpers
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(here)}
    done = subprocess.run(
        [*command, str(here / "_hf_mixture_run.py"), str(tmp_path)], env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    log = [line for line in ranks[0]["log"] if "loss" in line and "grad_norm" in line]
    source = {r: ("chat" if r < 90 else "code") for r in range(150)}
    differing = 0
    for step, line in enumerate(log):
        trained = set()
        for rank in ranks:
            for batch in rank["micro_batches"][2 * step : 2 * step + 2]:
                trained |= {source[r] for r in batch}  # every row has ≥ 2 tokens: a label to train
        mine = {source[r] for batch in ranks[0]["micro_batches"][2 * step : 2 * step + 2] for r in batch}
        differing += mine != trained
        assert {k.removeprefix("loss/") for k in line if k.startswith("loss/")} == trained, f"step {step}: {line}"
    assert differing > 0, "no step where rank 1 trained a source rank 0 did not: the test shows nothing"

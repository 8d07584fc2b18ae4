"""A stream's exact resume after a real crash, as users run it: two processes in a gloo process group read
Parquet shards through ``db.Windows`` (the ranks comparing every window's lengths), checkpoint, train a few
more steps and are SIGKILLed; new processes resume from the checkpoints. Per rank, the examples trained up
to the checkpoint and after the resume are the uninterrupted run's, in its order; together, every example
of the stream once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import dflash_batch as db
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")]

SETTINGS = {"window": 700, "max_tokens": 16384, "world_size": 2, "seed": 5, "accumulation": 2}

TRAIN = r"""
import json, os, sys
import torch.distributed as dist
import dflash_batch as db

rank, shards, log, ckpt, mode, save_at, meet = sys.argv[1:8]
rank, save_at = int(rank), int(save_at)
dist.init_process_group("gloo", init_method=f"file://{meet}", rank=rank, world_size=2)
windows = db.Windows(json.loads(shards), column="seq_len", rank=rank, **json.loads(sys.argv[8]))
windows.set_epoch(1)
if mode == "resume":
    with open(ckpt) as f:
        windows.load_state_dict(json.load(f))
workers = int(sys.argv[9])
if workers:  # DataLoader workers split the batches; the checkpoint takes the loop's count
    import torch

    batches = torch.utils.data.DataLoader(windows.iterable(), batch_size=None, num_workers=workers, collate_fn=list)
else:
    batches = windows
step = 0
with open(log, "a") as out:
    for batch in batches:
        step += 1
        out.write(json.dumps({"mode": mode, "step": step, "ids": [e["id"] for e in batch]}) + "\n")
        out.flush()
        os.fsync(out.fileno())
        if mode == "first" and step == save_at:  # a checkpoint, atomically
            with open(ckpt + ".tmp", "w") as f:
                json.dump(windows.state_dict(step=step) if workers else windows.state_dict(), f)
            os.replace(ckpt + ".tmp", ckpt)
        if mode == "first" and step == save_at + 3:  # three steps past it, then wait to be killed
            print("ready", flush=True)
            sys.stdin.readline()
dist.barrier()
os._exit(0)  # no gloo teardown at exit: it has aborted (SIGABRT) after all work was recorded
"""


def rendezvous(tmp_path: Path, name: str) -> str:
    """A file the processes meet at (no port to race another test for)."""
    return str(tmp_path / f"rendezvous-{name}")


def shards(tmp_path: Path, n: int) -> list[str]:
    lengths = db.seed_workload(n, seed=4)
    paths = []
    for f, part in enumerate(np.array_split(np.arange(n), 3)):
        path = tmp_path / f"part-{f}.parquet"
        pq.write_table(pa.table({"id": part, "seq_len": lengths[part]}), path, row_group_size=128)
        paths.append(str(path))
    return paths


def launch(
    tmp_path: Path, paths: list[str], mode: str, save_at: int, workers: int = 0, **popen
) -> list[subprocess.Popen]:
    meet = rendezvous(tmp_path, mode)
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                TRAIN,
                str(rank),
                json.dumps(paths),
                str(tmp_path / f"log{rank}.jsonl"),
                str(tmp_path / f"ckpt{rank}.json"),
                mode,
                str(save_at),
                str(meet),
                json.dumps(SETTINGS),
                str(workers),
            ],
            **popen,
        )
        for rank in range(2)
    ]


# In the first window, mid-stream, near a window's end; and mid-stream through 2 DataLoader workers per rank,
# which skip the rank check (the process group is the training process's) and never hang it.
@pytest.mark.parametrize(("save_at", "workers"), [(1, 0), (37, 0), (64, 0), (37, 2)])
def test_two_ranks_killed_after_a_checkpoint_resume_to_exactly_the_uninterrupted_stream(tmp_path, save_at, workers):
    paths = shards(tmp_path, 3000)
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    first = launch(tmp_path, paths, "first", save_at, workers, **pipes)
    for process in first:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    for process in first:
        process.send_signal(signal.SIGKILL)
    assert [p.wait(timeout=60) for p in first] == [-signal.SIGKILL] * 2
    resumed = launch(tmp_path, paths, "resume", save_at, workers)
    assert [p.wait(timeout=180) for p in resumed] == [0, 0]

    trained = []
    for rank in range(2):
        records = [json.loads(line) for line in (tmp_path / f"log{rank}.jsonl").read_text().splitlines()]
        got = [r["ids"] for r in records if r["mode"] == "first" and r["step"] <= save_at]
        got += [r["ids"] for r in records if r["mode"] == "resume"]
        whole = db.Windows(paths, column="seq_len", rank=rank, check_ranks=False, **SETTINGS)
        whole.set_epoch(1)
        assert got == [[e["id"] for e in batch] for batch in whole], f"rank {rank} trained another stream"
        trained += [i for ids in got for i in ids]
    assert sorted(trained) == list(range(3000)), "an example lost or trained twice"


DISAGREE = r"""
import json, os, sys
import torch.distributed as dist
import dflash_batch as db

rank, meet, paths = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
dist.init_process_group("gloo", init_method=f"file://{meet}", rank=rank, world_size=2)
# Rank 1 reads the shards in another order (a stream split by node would do the same): its windows differ.
windows = db.Windows(paths if rank == 0 else paths[::-1], column="seq_len", rank=rank, **json.loads(sys.argv[4]))
try:
    next(iter(windows))
except db.PlanError as error:
    print("refused:", error, flush=True)
dist.barrier()
os._exit(0)  # no gloo teardown at exit: it has aborted (SIGABRT) after all work was recorded
"""


def test_ranks_reading_different_streams_all_refuse_the_window_instead_of_training_it(tmp_path):
    paths, meet = shards(tmp_path, 3000), rendezvous(tmp_path, "disagree")
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", DISAGREE, str(rank), str(meet), json.dumps(paths), json.dumps(SETTINGS)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in runs]
    assert [p.returncode for p in runs] == [0, 0]
    for out in outs:
        assert "refused: ranks disagree on the plan (lengths:" in out, out

"""Issue 46: the HF Trainer's checkpoints across a change of the number of processes or of gradient
accumulation, and ``predict``. The Trainer counts an epoch in optimizer steps of the processes it runs on,
so a checkpoint cannot continue its epoch exactly on another number of processes: every rank refuses,
before anything trains, naming the way forward — never a silent skip (it used to train 81 of 240 samples
twice-or-never on 1 → 2, and end short of ``max_steps`` on 2 → 1). Real Trainer, torchrun, kill -9."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import dflash_batch as db
from test_trainer import RUN, planned, records, run

pytestmark = pytest.mark.multiprocess

SAVE = 4  # optimizer steps: mid epoch 0 on 1 and on 2 processes (GA 4)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    import os
    import subprocess
    import sys

    path = str(tmp_path_factory.mktemp("worlds") / "data")
    subprocess.run([sys.executable, str(RUN)], env={**os.environ, "MAKE_DATASET": path}, check=True, timeout=300)
    return path


def killed(data: str, tmp_path, nproc: int, accumulation: int = 4) -> None:
    steps = len(planned(data, nproc, 0, accumulation))
    assert SAVE < math.ceil(steps / accumulation), "the checkpoint must fall mid epoch 0"
    options = ("--accumulation", str(accumulation), "--epochs", "2", "--save-steps", str(SAVE))
    run(data, tmp_path / "out", tmp_path / "first", *options, "--kill-at", str(SAVE + 1), nproc=nproc,
        expect=-9 if nproc == 1 else 1)  # fmt: skip


def resumed(data: str, tmp_path, nproc: int, accumulation: int = 4) -> list[dict]:
    options = ("--accumulation", str(accumulation), "--epochs", "2", "--save-steps", str(SAVE), "--resume")
    run(data, tmp_path / "out", tmp_path / "rec", *options, nproc=nproc)
    return records(tmp_path / "rec", nproc)


@pytest.mark.parametrize(("before", "after"), [(1, 2), (2, 1)])
def test_a_checkpoint_resumed_on_another_number_of_processes_is_refused_on_every_rank(data, tmp_path, before, after):
    killed(data, tmp_path, before)
    lines = resumed(data, tmp_path, after)
    refused = [line["refused"] for line in lines if "refused" in line]
    assert len(refused) == after, "every rank refuses, none skips"
    assert all(f"written by {before} process(es) and this run has {after}" in r for r in refused), refused[0]
    assert all(f"torchrun --nproc_per_node {before}" in r for r in refused), "the way forward is named"
    assert not [line for line in lines if "rows" in line], "nothing trained"


def test_a_checkpoint_resumed_with_another_gradient_accumulation_is_refused(data, tmp_path):
    killed(data, tmp_path, 2, accumulation=4)
    lines = resumed(data, tmp_path, 2, accumulation=2)
    refused = [line["refused"] for line in lines if "refused" in line]
    assert len(refused) == 2 and all("accumulation 4 vs 2" in r for r in refused), refused
    assert not [line for line in lines if "rows" in line]


def test_the_same_processes_and_accumulation_resume_exactly(data, tmp_path):
    """2 → 2: the rest of the epoch once, and the Trainer's step count is the plan's."""
    killed(data, tmp_path, 2)
    first = [line for line in records(tmp_path / "first", 2) if "rows" in line and line["global_step"] < SAVE]
    lines = resumed(data, tmp_path, 2)
    trained = first + [line for line in lines if "rows" in line]
    for rank in range(2):
        sampler = planned(data, 2, rank, 4)
        for epoch in range(2):
            plan = sampler.plan(epoch)
            got = [sorted(line["rows"]) for line in trained if line["rank"] == rank and line["epoch"] == epoch]
            assert got == [sorted(plan[s * 2 + rank].tolist()) for s in range(plan.steps)], (rank, epoch)
    finals = {line["final_step"] for line in lines if "final_step" in line}
    assert finals == {2 * math.ceil(len(planned(data, 2, 0, 4)) / 4)}


@pytest.mark.parametrize("nproc", [1, 2])
def test_predict_returns_one_prediction_per_row_in_order(data, tmp_path, nproc):
    """Ragged rows crashed in torch's default collate; now the library pads them, in order."""
    rows = 37  # not a multiple of the processes or the batch size: accelerate's even batches are dropped
    run(data, tmp_path / "out", tmp_path / "rec", "--accumulation", "1", "--epochs", "1", "--predict", str(rows),
        nproc=nproc)  # fmt: skip
    predicted = [line for line in records(tmp_path / "rec", nproc) if "predicted" in line]
    assert len(predicted) == nproc
    for line in predicted:
        assert line["predicted"] == list(range(rows)), "one prediction per row, in the rows' order"
        assert line["shape"][0] == rows
    assert db.TokenStore(data).lengths()[:rows].min() < db.TokenStore(data).lengths()[:rows].max(), "ragged"

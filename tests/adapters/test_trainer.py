"""BucketTrainer as users run it — gradient accumulation, several epochs, one and two processes
(torchrun, gloo), SIGKILL and resume, evaluation, packed rows — checked against the plan: which rows
every micro-batch trained on, in which order, the loss normalization, and the step counts.

Each run is a child process (tests/_trainer_run.py) under a time limit; a hang fails the test."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("datasets")

import dflash_batch as db

pytestmark = pytest.mark.multiprocess  # several processes: `make test-all`, not the fast lane

RUN = Path(__file__).parents[1] / "_trainer_run.py"
TIMEOUT = 300


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("trainer") / "data")
    subprocess.run([sys.executable, str(RUN)], env={**os.environ, "MAKE_DATASET": path}, check=True, timeout=TIMEOUT)
    return path


def run(data: str, out: Path, record: Path, *options: str, nproc: int = 1, expect: int = 0) -> None:
    command = [str(RUN), data, str(out), str(record), *options]
    if nproc > 1:
        command = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *command]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, *command], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == expect, done.stdout[-3000:] + done.stderr[-3000:]


def records(record: Path, nproc: int = 1) -> list[dict]:
    lines = []
    for rank in range(nproc):
        path = Path(f"{record}.{rank}")
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


def planned(
    data: str, world: int, rank: int, accumulation: int, mode: str = "padded", trim_steps: bool = False, prices=()
) -> db.BucketSampler:
    """The sampler the run builds, as the test's oracle (with the rank ``prices`` its StepTimer set)."""
    store = db.TokenStore(data)
    sampler = db.BucketSampler(
        store.lengths(),
        max_tokens=128,
        seed=5,
        mode=mode,
        world_size=world,
        rank=rank,
        accumulation=accumulation,
        trim_steps=trim_steps,
    )
    for first, price in prices:
        sampler.position.price_from(first, tuple(price))
    return sampler


def check_against_plan(
    lines: list[dict], data: str, nproc: int, accumulation: int, epochs: int, mode="padded", trim_steps=False,
    prices=(),
):  # fmt: skip
    """Every rank trained on exactly its share of every epoch's plan, in plan order, on intact batches;
    ``num_items_in_batch`` is the label count of the whole optimizer step; global steps are right."""
    steps = None
    for rank in range(nproc):
        sampler = planned(data, nproc, rank, accumulation, mode, trim_steps, prices)
        steps = len(sampler)
        trained = [line for line in lines if line.get("rank") == rank and "rows" in line]
        assert all(line["intact"] for line in trained), "a micro-batch's labels disagree with its tokens"
        for epoch in range(epochs):
            plan = sampler.plan(epoch)
            expected = [sorted(plan[s * nproc + rank].tolist()) for s in range(plan.steps)]
            got = [sorted(line["rows"]) for line in trained if line["epoch"] == epoch]
            assert got == expected, f"rank {rank} epoch {epoch} did not train on the plan"
            assert plan.steps == steps
    # Every optimizer step's num_items_in_batch is its label tokens over all ranks and micro-batches.
    window = defaultdict(int)
    for line in lines:
        if "rows" in line:
            window[line["epoch"], line["global_step"]] += line["labels"]
    for line in lines:
        if "rows" in line:
            assert line["num_items"] == window[line["epoch"], line["global_step"]]
    finals = {line["final_step"] for line in lines if "final_step" in line}
    assert finals == {epochs * math.ceil(steps / accumulation)}


@pytest.mark.parametrize("nproc", [1, 2])
def test_accumulation_over_epochs_trains_exactly_the_plan(data, tmp_path, nproc):
    run(data, tmp_path / "out", tmp_path / "rec", "--accumulation", "4", "--epochs", "3", nproc=nproc)
    check_against_plan(records(tmp_path / "rec", nproc), data, nproc, accumulation=4, epochs=3)


def test_packed_rows_with_accumulation_train_exactly_the_plan(data, tmp_path):
    run(data, tmp_path / "out", tmp_path / "rec", "--accumulation", "2", "--epochs", "2", "--mode", "packed")
    check_against_plan(records(tmp_path / "rec"), data, 1, accumulation=2, epochs=2, mode="packed")


def test_trimmed_steps_on_two_processes_train_exactly_the_plan(data, tmp_path):
    """trim_steps=True under torchrun without accumulation (where it helps): the ranks train the trimmed
    plan, whose extra steps change the step count the Trainer schedules."""
    trimmed, plain = planned(data, 2, 0, 1, trim_steps=True), planned(data, 2, 0, 1)
    assert len(trimmed) > len(plain), "the data must give trimming something to do"
    run(data, tmp_path / "out", tmp_path / "rec", "--accumulation", "1", "--epochs", "2", "--trim-steps", nproc=2)
    check_against_plan(records(tmp_path / "rec", 2), data, 2, accumulation=1, epochs=2, trim_steps=True)


@pytest.mark.parametrize(("nproc", "masked"), [(1, False), (2, False), (2, True)])
def test_killed_mid_epoch_and_resumed_trains_every_sample_once(data, tmp_path, nproc, masked):
    """SIGKILL two optimizer steps after the checkpoint at step 12 (mid epoch 1): the resumed run trains the
    rest of that epoch from the checkpoint — nothing replayed, nothing skipped — and ends where an
    uninterrupted run ends, having trained the same micro-batches in the same order. Masked: TRL's
    SFTTrainer on a prompt-completion dataset, every micro-batch's labels its rows' masks."""
    extra = ()
    if masked:
        pytest.importorskip("trl")
        data = masked_dataset(tmp_path / "masked")
        extra = ("--sft",)
    steps = len(planned(data, nproc, 0, 4))
    checkpoint = 12 if nproc == 1 else 8
    assert math.ceil(steps / 4) < checkpoint < 2 * math.ceil(steps / 4), "the checkpoint must fall mid epoch 1"
    options = ("--accumulation", "4", "--epochs", "3", "--save-steps", str(checkpoint), *extra)
    run(data, tmp_path / "base", tmp_path / "base", *options, nproc=nproc)
    before, after = killed_and_resumed(data, tmp_path, options, checkpoint, nproc)
    assert min(line["global_step"] for line in after if "rows" in line) == checkpoint
    baseline = records(tmp_path / "base", nproc)
    for rank in range(nproc):
        assert sequence(before, rank) + sequence(after, rank) == sequence(baseline, rank), f"rank {rank}"
    check_against_plan(before + after, data, nproc, accumulation=4, epochs=3)


@pytest.mark.parametrize(("mode", "sft"), [("padded", False), ("packed", False), ("padded", True), ("packed", True)])
def test_a_masked_dataset_on_two_processes_trains_its_mask_exactly(tmp_path, mode, sft):
    """A prompt-completion dataset (``completion_mask``), GA 4, 2 epochs, torchrun, through BucketTrainer
    and through ``class SFT(BucketTrainer, SFTTrainer)``: every micro-batch's labels are -100 exactly where
    the rows' masks say, and ``num_items_in_batch`` is the step's unmasked label tokens over both ranks."""
    if sft:
        pytest.importorskip("trl")
    masked = masked_dataset(tmp_path / "masked")
    options = ("--accumulation", "4", "--epochs", "2", "--mode", mode, *(["--sft"] if sft else []))
    run(masked, tmp_path / "out", tmp_path / "rec", *options, nproc=2)
    lines = records(tmp_path / "rec", 2)
    check_against_plan(lines, masked, 2, accumulation=4, epochs=2, mode=mode)
    assert sum(line["labels"] for line in lines if "rows" in line) < sum(
        len(db.TokenStore(masked)[row]) - 1 for line in lines if "rows" in line for row in line["rows"]
    ), "the prompts were trained"


def masked_dataset(path: Path) -> str:
    """A prompt-completion dataset with a ``completion_mask`` column, written by the runner."""
    env = {**os.environ, "MAKE_DATASET": str(path), "MASKED": "1"}
    subprocess.run([sys.executable, str(RUN)], env=env, check=True, timeout=TIMEOUT)
    assert db.TokenStore(str(path)).mask == "completion_mask"
    return str(path)


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_step_timer_reprices_the_next_epochs_and_a_resume_keeps_the_price(data, tmp_path, nproc):
    """step_timer=: the Trainer times every training micro-batch and refits the rank price at every epoch's
    end (a collective on 2 processes: one price on both); epoch 0 trains the tokens-balanced plan, the next
    epochs the plan balanced by the fit — checked row by row against the sampler re-priced the same way.
    Killed after the checkpoint mid epoch 1 and resumed, the run restores the price from the checkpoint
    and trains exactly what the uninterrupted run trained."""
    steps = len(planned(data, nproc, 0, 4))
    checkpoint = 12 if nproc == 1 else 8
    assert math.ceil(steps / 4) < checkpoint < 2 * math.ceil(steps / 4), "the checkpoint must fall mid epoch 1"
    options = ("--accumulation", "4", "--epochs", "3", "--save-steps", str(checkpoint), "--step-timer")
    run(data, tmp_path / "base", tmp_path / "base", *options, nproc=nproc)
    baseline = records(tmp_path / "base", nproc)
    ends = [line for line in baseline if "prices" in line]
    assert len(ends) == nproc and all(line["prices"] == ends[0]["prices"] for line in ends), ends
    prices = ends[0]["prices"]
    assert [first for first, _ in prices] == [1] and ends[0]["applied"][0], ends[0]
    assert prices[0][1][1] / prices[0][1][0] == pytest.approx(1 / 16, rel=1e-3)
    check_against_plan(baseline, data, nproc, accumulation=4, epochs=3, prices=prices)
    if nproc == 2:  # the price changed what the ranks train: the check above could tell
        assert not np.array_equal(
            planned(data, 2, 0, 4).plan(1).indices, planned(data, 2, 0, 4, prices=prices).plan(1).indices
        )
    saved = json.loads((tmp_path / "base" / f"checkpoint-{checkpoint}" / "dflash_batch.json").read_text())
    assert saved["rank_costs"] == [[first, *price] for first, price in prices]
    before, after = killed_and_resumed(data, tmp_path, options, checkpoint, nproc)
    assert all(line["prices"] == prices for line in after if "prices" in line)
    for rank in range(nproc):
        assert sequence(before, rank) + sequence(after, rank) == sequence(baseline, rank), f"rank {rank}"


def test_two_processes_sharing_one_plan_per_machine_train_exactly_each_ones_own_plan(data, tmp_path, monkeypatch):
    """plan_dir=: under torchrun both ranks map the plan the first of them made (and the next epoch made
    ahead), with the step timer re-pricing epoch 1 on (a new fingerprint, new files); every micro-batch is
    checked against the plan each rank would make alone; killed mid epoch 1 and resumed through the same
    directory, the run trains what the uninterrupted run trained."""
    plans = tmp_path / "plans"
    options = ("--accumulation", "4", "--epochs", "3", "--save-steps", "8", "--step-timer", "--plan-dir", str(plans))
    monkeypatch.setenv("DFLASH_BATCH_KEEP_PLANS", "1")  # the files stay after the run, to be counted
    run(data, tmp_path / "base", tmp_path / "base", *options, nproc=2)
    monkeypatch.delenv("DFLASH_BATCH_KEEP_PLANS")
    baseline = records(tmp_path / "base", 2)
    prices = next(line["prices"] for line in baseline if "prices" in line)
    check_against_plan(baseline, data, 2, accumulation=4, epochs=3, prices=prices)
    files = sorted(p.name for p in plans.iterdir() if p.name.endswith(".plan"))
    assert len(files) >= 2 and all(name.startswith("dflash-") for name in files), files
    before, after = killed_and_resumed(data, tmp_path, options, 8, 2)
    for rank in range(2):
        assert sequence(before, rank) + sequence(after, rank) == sequence(baseline, rank), f"rank {rank}"


def killed_and_resumed(data: str, tmp_path: Path, options: tuple, checkpoint: int, nproc: int):
    """A run SIGKILLed two optimizer steps after its checkpoint at ``checkpoint``, then resumed from it: the
    micro-batches trained before the checkpoint, and those of the resumed run."""
    kill = -9 if nproc == 1 else 1  # torchrun reports a killed worker as its own failure
    run(data, tmp_path / "out", tmp_path / "rec", *options, "--kill-at", str(checkpoint + 2), nproc=nproc, expect=kill)
    before = [line for line in records(tmp_path / "rec", nproc) if line.get("global_step", 0) < checkpoint]
    for rank in range(nproc):
        Path(f"{tmp_path / 'rec'}.{rank}").unlink()
    run(data, tmp_path / "out", tmp_path / "rec", *options, "--resume", nproc=nproc)
    return before, records(tmp_path / "rec", nproc)


def sequence(lines: list[dict], rank: int) -> list[tuple[int, list[int]]]:
    """The micro-batches ``rank`` trained, in order: (epoch, rows)."""
    return [(line["epoch"], sorted(line["rows"])) for line in lines if line.get("rank") == rank and "rows" in line]


def test_evaluation_goes_through_the_library(data, tmp_path):
    """eval_strategy="steps" with variable-length rows (the default collator failed): every evaluation
    covers each eval row exactly once, in the same deterministic batches every time."""
    run(data, tmp_path / "out", tmp_path / "rec", "--accumulation", "2", "--epochs", "1", "--eval", nproc=2)
    lines = records(tmp_path / "rec", 2)
    store = db.TokenStore(data)
    passes = defaultdict(list)
    for rank in range(2):
        evals = [line["eval"] for line in lines if line.get("rank") == rank and "eval" in line]
        sampler = db.BucketSampler(store.lengths()[:40], max_tokens=128, shuffle=False, world_size=2, rank=rank)
        per_pass = len(sampler)
        assert len(evals) % per_pass == 0 and len(evals) >= 2 * per_pass
        expected = [sorted(b.tolist()) for b in sampler]
        for p in range(len(evals) // per_pass):
            chunk = evals[p * per_pass : (p + 1) * per_pass]
            assert [sorted(b) for b in chunk] == expected
            passes[p] += [row for batch in chunk for row in batch]
    assert all(sorted(rows) == list(range(40)) for rows in passes.values())

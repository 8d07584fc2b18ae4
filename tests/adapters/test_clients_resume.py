"""Every client's own checkpoint mechanism saves the batches its loop trained on, no more, no less.

accelerate, Lightning and plain torch DDP as users run them (tests/_clients_run.py): 2 processes (torchrun, gloo),
gradient accumulation 4, 2 epochs of 21 micro-batches per rank (the last accumulation window of each
epoch is short), a checkpoint through the client's mechanism mid epoch 1, SIGKILL two optimizer steps
later, and a resume. Checked against the plan: which rows every micro-batch of every rank trained on, in
order; every sample exactly once per epoch; the optimizer steps of an uninterrupted run. Rows 5–7 of
issue 27 are the named regressions among them. Each run is a child under a time limit: a hang fails.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("accelerate")
pytest.importorskip("lightning")
pytest.importorskip("datasets")

import dflash_batch as db

pytestmark = pytest.mark.multiprocess  # several processes: `make test-all`, not the fast lane

HERE = Path(__file__).parents[1]  # the shared helpers
RUN = HERE / "_clients_run.py"
NPROC, ACCUMULATION, EPOCHS = 2, 4, 2
SAVE_AT, KILL_AT = 8, 10  # optimizer steps: epoch 0 has 6 (21 micro-batches), so both fall in epoch 1
TIMEOUT = 300


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("clients") / "data")
    env = {**os.environ, "MAKE_DATASET": path, "PYTHONPATH": str(HERE)}
    subprocess.run([sys.executable, str(HERE / "_trainer_run.py")], env=env, check=True, timeout=TIMEOUT)
    return path


@pytest.fixture(scope="module")
def masked_data(tmp_path_factory) -> str:
    """The same kind of rows with a ``completion_mask`` column (a prompt, then a completion)."""
    path = str(tmp_path_factory.mktemp("clients") / "masked")
    env = {**os.environ, "MAKE_DATASET": path, "MASKED": "1", "PYTHONPATH": str(HERE)}
    subprocess.run([sys.executable, str(HERE / "_trainer_run.py")], env=env, check=True, timeout=TIMEOUT)
    assert db.TokenStore(path).mask == "completion_mask"
    return path


def run(data: str, tmp: Path, scenario: str, *options: str) -> int:
    command = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={NPROC}", str(RUN)]
    command += [data, str(tmp / "out"), str(tmp / "rec"), "--scenario", scenario, "--save-at", str(SAVE_AT), *options]
    env = {**os.environ, "PYTHONPATH": str(HERE), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, *command], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    if done.returncode not in (0, 1) or ("--kill-at" not in options and done.returncode):
        pytest.fail(f"{scenario} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.returncode


def records(tmp: Path) -> list[dict]:
    lines = []
    for rank in range(NPROC):
        lines += [json.loads(line) for line in Path(f"{tmp / 'rec'}.{rank}").read_text().splitlines()]
        Path(f"{tmp / 'rec'}.{rank}").unlink()
    return lines


def killed_and_resumed(data: str, tmp: Path, scenario: str) -> None:
    """Runs ``scenario`` to the kill, then resumed; checks the micro-batches of both runs against the plan."""
    assert run(data, tmp, scenario, "--kill-at", str(KILL_AT)) == 1, "torchrun reports the killed ranks"
    first = records(tmp)
    assert max(line["optimizer_steps"] for line in first if "rows" in line) == KILL_AT - 1, "killed where asked"
    before = [line for line in first if "rows" in line and line["optimizer_steps"] < SAVE_AT]
    run(data, tmp, scenario, "--resume")
    after = records(tmp)
    trained = [line for line in after if "rows" in line]
    assert min(line["optimizer_steps"] for line in trained) == SAVE_AT, "the resume starts at the checkpoint"
    intact = [line.get("intact", True) for line in before + trained]
    assert all(intact), f"{scenario}: {intact.count(False)} micro-batches' labels disagree with their rows (or masks)"
    store = db.TokenStore(data)
    for rank in range(NPROC):
        sampler = db.BucketSampler(
            store.lengths(), max_tokens=128, seed=5, world_size=NPROC, rank=rank, accumulation=ACCUMULATION
        )
        mine = [line for line in before + trained if line["rank"] == rank]
        for epoch in range(EPOCHS):
            plan = sampler.plan(epoch)
            expected = [sorted(plan[s * NPROC + rank].tolist()) for s in range(plan.steps)]
            got = [sorted(line["rows"]) for line in mine if line["epoch"] == epoch]
            assert got == expected, f"{scenario}: rank {rank} epoch {epoch} did not train exactly its share"
        # Optimizer steps as in an uninterrupted run: each epoch's last window closes at its end.
        steps = sampler.plan(0).steps
        assert steps % ACCUMULATION, "the data must leave each epoch a short last window"
        finals = {line["final_steps"] for line in after if "final_steps" in line and line["rank"] == rank}
        assert finals == {EPOCHS * math.ceil(steps / ACCUMULATION)}, f"{scenario}: optimizer steps"
        windows = [line["optimizer_steps"] for line in mine]
        assert windows == sorted(windows), "micro-batches ran in optimizer-step order"
        per_epoch = math.ceil(steps / ACCUMULATION)
        for step in set(windows):
            last = step % per_epoch == per_epoch - 1
            assert windows.count(step) == (steps % ACCUMULATION if last else ACCUMULATION), f"window {step}"


def test_case5_accelerate_stateful_loader_saves_only_what_was_trained(data, tmp_path):
    """A prepared ``DataLoader(batch_sampler=batch_sampler(sampler))`` reads one batch ahead; accelerate's
    stateful loader saves the position of the batches trained, not one past them."""
    killed_and_resumed(data, tmp_path, "accelerate-stateful")


def test_accelerate_resumed_in_epoch_1_continues_from_the_samplers_epoch(data, tmp_path):
    """Regression (issue 59): after accelerate's load_state with the checkpoint in epoch 1, sampler.epoch read
    0, and a loop continuing from it retrained the rest of epoch 0, then epoch 1 (146 + 157 samples twice).
    With epoch_state(sampler) registered, the sampler's epoch is the checkpoint's."""
    killed_and_resumed(data, tmp_path, "accelerate-epoch")


def test_torchdata_resumed_in_epoch_1_continues_from_the_samplers_epoch(data, tmp_path):
    """The same for torchdata's StatefulDataLoader (which applies a loaded state lazily): the loop sets the
    sampler's epoch from the state (resume_epoch) and continues from it."""
    killed_and_resumed(data, tmp_path, "torch-workers-epoch")


def test_accelerate_skip_first_batches_resumes_exactly(data, tmp_path):
    killed_and_resumed(data, tmp_path, "accelerate-skip")


def test_case6_accelerate_prepared_loader_closes_each_epochs_last_window(data, tmp_path):
    """``accelerator.prepare(db.Loader)`` under ``accumulate``: accelerate learns where the epoch ends, so
    the short last window of each epoch is an optimizer step of its own (no gradient spills over)."""
    killed_and_resumed(data, tmp_path, "accelerate-loader")


def test_lightning_with_the_loader_as_train_dataloader_resumes_exactly(data, tmp_path):
    killed_and_resumed(data, tmp_path, "lightning-loader")


def test_case7_lightning_with_the_sampler_in_checkpoint_hooks_resumes_exactly(data, tmp_path):
    """``DataLoader(batch_sampler=sampler)`` with the sampler's state in the module's checkpoint hooks:
    ``len()`` after the resume is still the epoch's, which Lightning reads once as every epoch's length."""
    killed_and_resumed(data, tmp_path, "lightning-sampler")


def test_torchrun_ddp_with_the_loader_resumes_exactly(data, tmp_path):
    killed_and_resumed(data, tmp_path, "torch-loader")


def test_torchrun_ddp_with_the_loader_trains_a_masked_dataset_and_resumes_exactly(masked_data, tmp_path):
    """Issue 28 through the Loader on 2 processes: every micro-batch's labels are -100 exactly where its
    rows' ``completion_mask`` says, through a kill -9 and a resume."""
    killed_and_resumed(masked_data, tmp_path, "torch-loader")


def test_stateful_dataloader_with_workers_resumes_exactly_from_its_state(data, tmp_path):
    """The workers fetch batches ahead of the loop; torchdata's ``StatefulDataLoader`` does not count them."""
    killed_and_resumed(data, tmp_path, "torch-workers")


def test_plain_dataloader_with_workers_resumes_exactly_from_the_step_the_loop_says(data, tmp_path):
    """A plain torch ``DataLoader`` publishes nothing about what it fetched ahead: the loop's count, passed
    as ``state_dict(step=...)``, is the position."""
    killed_and_resumed(data, tmp_path, "torch-workers-step")


def test_torchrun_ddp_with_a_mixture_resumes_exactly_with_every_rows_source(data, tmp_path):
    """Issue 41: a mixture through a kill -9 and a resume on 2 processes — every micro-batch the plan's
    rows (repeated where a source is up-sampled), each row's ``source`` id its source's."""
    from _clients_run import MAX_TOKENS, SEED, mixture_of

    assert run(data, tmp_path, "torch-mixture", "--kill-at", str(KILL_AT)) == 1
    before = [line for line in records(tmp_path) if "rows" in line and line["optimizer_steps"] < SAVE_AT]
    run(data, tmp_path, "torch-mixture", "--resume")
    after = records(tmp_path)
    trained = before + [line for line in after if "rows" in line]
    mix = mixture_of(data)
    for rank in range(NPROC):
        sampler = db.BucketSampler(
            mix, max_tokens=MAX_TOKENS, seed=SEED, world_size=NPROC, rank=rank, accumulation=ACCUMULATION
        )
        mine = [line for line in trained if line["rank"] == rank]
        for epoch in range(EPOCHS):
            plan = sampler.plan(epoch)
            got = [line for line in mine if line["epoch"] == epoch]
            assert [sorted(line["rows"]) for line in got] == [
                sorted(plan[s * NPROC + rank].tolist()) for s in range(plan.steps)
            ], f"rank {rank} epoch {epoch}"
            for line in got:
                assert line["sources"] == mix.source_of(line["rows"]).tolist(), "each row's own source"
        finals = {line["final_steps"] for line in after if "final_steps" in line and line["rank"] == rank}
        assert finals == {EPOCHS * math.ceil(len(sampler) / ACCUMULATION)}
    # Both sources trained in their shares: 0.3 and 0.7 of epoch 0's samples, 0.2 and 0.8 of epoch 1's (the
    # schedule's change, before the kill and the resume); the down-sampled source's cycle carries on.
    chosen = {}
    for epoch, weight in ((0, 0.3), (1, 0.2)):
        rows = np.concatenate([line["rows"] for line in trained if line["epoch"] == epoch])
        sources = mix.source_of(rows)
        share = round(weight * len(mix))
        assert np.bincount(sources).tolist() == [share, len(mix) - share], f"epoch {epoch}'s shares"
        chosen[epoch] = set(rows[sources == 0].tolist())
    assert not chosen[0] & chosen[1], "a row of the down-sampled source twice within its cycle, across the change"

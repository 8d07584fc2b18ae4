"""A stream through the HF Trainer (``BucketTrainer(sampler=db.Windows(...), use_data_collator=True)``, issue 62):
no dataset, no lengths up front — windows of text rows measured by the tokenizer as they are read, batches made
by a user's collator — checked as users run it: which rows every micro-batch trained on against a ``Windows``
iterated pass by pass, over several passes, with DataLoader workers, on one and two processes; resumed from a
checkpoint mid pass, after a pass's last step, and after SIGKILL; a collator over the budget; every refusal."""

from __future__ import annotations

import json

import dflash_batch as db
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
datasets = pytest.importorskip("datasets")

from _hf_rows import tiny_llama as model  # noqa: E402
from _trainer_run import Pad, stream_windows, text_rows  # noqa: E402
from dflash_batch.hf import BucketTrainer  # noqa: E402
from test_trainer import data, killed_and_resumed, records, run, sequence  # noqa: E402, F401


def row_of(text: str) -> int:
    first, second = text.split()[:2]
    return (int(first[1:]) - 1) * 90 + int(second[1:]) - 1


def oracle(rows: list, passes: int, accumulation: int, **ranks) -> list[tuple[int, list[int]]]:
    """The (pass, rows) of every batch a Windows hands out, pass after pass."""
    windows = stream_windows(rows, accumulation, check_ranks=False, **ranks)
    out = []
    for epoch in range(passes):
        windows.set_epoch(epoch)
        out += [(epoch, sorted(row_of(e["text"]) for e in batch)) for batch in windows]
    return out


# -- as users run it: child processes (tests/_trainer_run.py --collator --stream STEPS) --------------------------


@pytest.mark.multiprocess
@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_on_two_processes_trains_each_ranks_windows_in_order(data, tmp_path, workers):  # noqa: F811
    """Without workers the ranks compare every window before training it (a collective inside the Trainer's
    iteration, between its own); with workers they read ahead on their own."""
    options = ("--collator", "--stream", "40", "--workers", str(workers), "--accumulation", "2")
    run(data, tmp_path / "out", tmp_path / "rec", *options, nproc=2)
    lines = records(tmp_path / "rec", 2)
    rows = list(text_rows(data))
    for rank in range(2):
        trained = sequence(lines, rank)
        expected = oracle(rows, 4, 2, world_size=2, rank=rank)
        assert len(trained) == 80 and trained == expected[:80], f"rank {rank}"
        assert trained[-1][0] >= 2, "the run must cross passes"


@pytest.mark.multiprocess
@pytest.mark.parametrize("nproc", [1, 2])
def test_a_stream_killed_with_workers_and_resumed_trains_what_the_uninterrupted_run_did(data, tmp_path, nproc):  # noqa: F811
    """Checkpoints every 6 steps with two DataLoader workers reading ahead; SIGKILL two steps after the one in
    the second pass; the resumed run (from the Windows state, ``ignore_data_skip=True``) trains exactly the rest
    of the uninterrupted run, micro-batch by micro-batch, on every rank."""
    steps = 40 if nproc == 1 else 30
    options = ("--collator", "--stream", str(steps), "--workers", "2", "--accumulation", "2", "--save-steps", "6")
    run(data, tmp_path / "base", tmp_path / "base", *options, nproc=nproc)
    baseline = records(tmp_path / "base", nproc)
    checkpoint = next(
        s for s in range(6, steps, 6) if {line["epoch"] for line in baseline if line.get("global_step") == s} == {1}
    )
    before, after = killed_and_resumed(data, tmp_path, options, checkpoint, nproc)
    assert not [line["refused"] for line in after if "refused" in line]
    for rank in range(nproc):
        assert sequence(before, rank) + sequence(after, rank) == sequence(baseline, rank), f"rank {rank}"
        assert (
            sequence(baseline, rank)
            == oracle(list(text_rows(data)), 4, 2, world_size=nproc, rank=rank)[: len(sequence(baseline, rank))]
        )


# -- in this process ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rows(data):  # noqa: F811
    return list(text_rows(data))


def arguments(tmp_path, **kwargs):
    kwargs = {
        "output_dir": str(tmp_path / "out"), "report_to": [], "use_cpu": True, "save_strategy": "no",
        "remove_unused_columns": False, "disable_tqdm": True, "gradient_accumulation_steps": 2, "max_steps": 60,
        "ignore_data_skip": True, "logging_steps": 1000, **kwargs,
    }  # fmt: skip
    return transformers.TrainingArguments(**kwargs)


def trainer(rows, args, seen, **kwargs):
    class Recording(BucketTrainer):
        def training_step(self, model, inputs, *rest, **kw):
            ids = inputs["input_ids"]
            seen.append((self.bucket_sampler.epoch, sorted((int(r[0]) - 1) * 90 + int(r[1]) - 1 for r in ids)))
            return super().training_step(model, inputs, *rest, **kw)

    options = {"sampler": stream_windows(rows, args.gradient_accumulation_steps), "data_collator": Pad(), **kwargs}
    return Recording(model=model(), args=args, use_data_collator=True, **options)


def test_a_stream_trains_its_windows_pass_after_pass_and_resumes_anywhere(rows, tmp_path):
    """60 optimizer steps over two passes and more, a checkpoint at every step: resumed mid pass 0, right after
    pass 0's last step, and mid pass 1, each run trains exactly what the uninterrupted run trained from there."""
    expected = oracle(rows, 3, 2)
    per_pass = sum(1 for epoch, _ in expected if epoch == 0) // 2  # optimizer steps: windows end on whole ones
    assert 60 > 2 * per_pass, "the run must reach a third pass"
    seen: list = []
    trainer(rows, arguments(tmp_path, save_strategy="steps", save_steps=1), seen).train()
    assert seen == expected[:120]
    for checkpoint in (per_pass // 2, per_pass, per_pass + 3):
        tail: list = []
        resumed = trainer(rows, arguments(tmp_path, save_strategy="no"), tail)
        resumed.train(resume_from_checkpoint=str(tmp_path / "out" / f"checkpoint-{checkpoint}"))
        assert tail == seen[2 * checkpoint :], f"resumed at step {checkpoint}"
    state = json.loads((tmp_path / "out" / f"checkpoint-{per_pass}" / "dflash_batch.json").read_text())
    assert state["epoch"] == 0 and state["format"] == "dflash_batch.Windows"


def test_a_stream_with_dataloader_workers_trains_the_same_batches(rows, tmp_path):
    seen: list = []
    trainer(rows, arguments(tmp_path, dataloader_num_workers=2, max_steps=40), seen).train()
    assert seen == oracle(rows, 2, 2)[:80]


def test_train_called_again_after_a_resume_starts_the_stream_over(rows, tmp_path):
    """The Trainer counts from step 0 again in a second ``train()``: the stream starts from pass 0 again, as a
    sampler's epoch 0 does — not from the pass a resume placed it in."""
    seen: list = []
    trainer(rows, arguments(tmp_path, save_strategy="steps", save_steps=30, max_steps=30), seen).train()
    again: list = []
    resumed = trainer(rows, arguments(tmp_path, max_steps=40), again)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-30"))
    assert again == oracle(rows, 2, 2)[60:80] and again[0][0] == 1
    again.clear()
    resumed.train()
    assert again == oracle(rows, 2, 2)[:80]


def test_a_collator_over_the_budget_stops_at_that_batch(rows, tmp_path):
    """Lengths measured as one token each: the plan packs many rows a batch, which the collator makes far longer
    than ``max_tokens``."""
    windows = db.Windows(rows, window=50, length=lambda e: 1, max_tokens=128, accumulation=2, world_size=1, rank=0)
    with pytest.raises(db.DataError, match=r"over max_tokens 128: the Windows measured these examples shorter"):
        trainer(rows, arguments(tmp_path), [], sampler=windows).train()


@pytest.mark.parametrize(
    ("change", "error", "says"),
    [
        ({"use_data_collator": False}, TypeError, "pass data_collator=... and use_data_collator=True"),
        ({"train_dataset": "rows"}, TypeError, "leave train_dataset out"),
        ({"step_timer": True}, TypeError, "a Windows plans each window unpriced"),
        ({"args": {"max_steps": -1}}, db.PlanError, r"pass TrainingArguments\(max_steps=...\)"),
        ({"args": {"gradient_accumulation_steps": 4}}, db.PlanError, "build the Windows with accumulation=4"),
        ({"args": {"dataloader_num_workers": 2, "dataloader_persistent_workers": True}}, db.PlanError, "persistent"),
        ({"args": {"dataloader_num_workers": 2, "dataloader_multiprocessing_context": "spawn"}}, db.PlanError, "fork"),
    ],
)
def test_each_setting_a_stream_cannot_take_is_refused_naming_the_fix(rows, tmp_path, change, error, says):
    args = arguments(tmp_path, **change.pop("args", {}))
    kwargs = {key: rows if value == "rows" else value for key, value in change.items()}
    sampler = stream_windows(rows, 2)
    with pytest.raises(error, match=says):
        BucketTrainer(
            model=model(), args=args, data_collator=Pad(), **{"sampler": sampler, "use_data_collator": True, **kwargs}
        )


@pytest.mark.parametrize("kind", ["windows", "sampler"])
def test_a_sampler_of_other_ranks_than_the_trainers_is_refused(rows, lengths_of_rows, tmp_path, kind):
    if kind == "windows":
        sampler = stream_windows(rows, 2, world_size=2, rank=1, check_ranks=False)
        kwargs = {"sampler": sampler, "args": arguments(tmp_path)}
    else:
        sampler = db.BucketSampler(lengths_of_rows, max_tokens=128, world_size=2, rank=1, check_ranks=False)
        kwargs = {"sampler": sampler, "args": arguments(tmp_path, max_steps=-1), "train_dataset": rows}
    with pytest.raises(db.PlanError, match="plans for world_size=2, rank=1, but this Trainer runs process 0"):
        BucketTrainer(model=model(), data_collator=Pad(), use_data_collator=True, **kwargs)


@pytest.fixture(scope="module")
def lengths_of_rows(rows):
    return [len(row["text"].split()) for row in rows]


def test_trl_which_requires_a_train_dataset_is_refused_naming_the_trainer_to_use(rows, tmp_path):
    trl = pytest.importorskip("trl")

    class SFT(BucketTrainer, trl.SFTTrainer):
        pass

    with pytest.raises(TypeError, match=r"train the stream with dflash_batch\.hf\.BucketTrainer"):
        SFT(model=model(), args=arguments(tmp_path), sampler=stream_windows(rows, 2), data_collator=Pad(),
            use_data_collator=True)  # fmt: skip


def test_a_resume_the_trainer_would_replay_or_cannot_place_is_refused(rows, tmp_path):
    seen: list = []
    trainer(rows, arguments(tmp_path, save_strategy="steps", save_steps=5, max_steps=10), seen).train()
    with pytest.raises(db.PlanError, match=r"pass TrainingArguments\(ignore_data_skip=True\)"):
        trainer(rows, arguments(tmp_path, ignore_data_skip=False), []).train(
            resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-5")
        )
    (tmp_path / "out" / "checkpoint-5" / "dflash_batch.json").unlink()
    with pytest.raises(db.PlanError, match=r"holds no dflash_batch\.json"):
        trainer(rows, arguments(tmp_path), []).train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-5"))
    assert len(seen) == 20

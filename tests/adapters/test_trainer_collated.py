"""BucketTrainer over your own dataset and data_collator (``use_data_collator=True``, issue 62): raw rows a
collator tokenizes, lengths measured with ``db.measure_lengths``, no token store. Checked as users run it:
which rows every micro-batch trained on against the plan, on one and two processes, with DataLoader workers
reading ahead of the Trainer, killed with SIGKILL and resumed; padding-free rows of transformers'
``DataCollatorWithFlattening``; TRL's SFTTrainer with its own collator; and every refusal."""

from __future__ import annotations

import math
import warnings

import dflash_batch as db
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
datasets = pytest.importorskip("datasets")

from _hf_rows import tiny_llama as model  # noqa: E402
from _trainer_run import Pad, text_rows, tokenizer  # noqa: E402
from dflash_batch.adapters.hf_checkpoints import trained_position  # noqa: E402
from dflash_batch.hf import BucketTrainer  # noqa: E402
from test_trainer import check_against_plan, data, killed_and_resumed, planned, records, run, sequence  # noqa: E402, F401

ROWS = 160


# -- as users run it: child processes (tests/_trainer_run.py --collator) ---------------------------------------


@pytest.mark.multiprocess
@pytest.mark.parametrize(("nproc", "workers"), [(1, 2), (2, 0), (2, 2)])
def test_text_rows_through_a_data_collator_train_exactly_the_plan(data, tmp_path, nproc, workers):  # noqa: F811
    options = ("--collator", "--workers", str(workers), "--accumulation", "4", "--epochs", "3")
    run(data, tmp_path / "out", tmp_path / "rec", *options, nproc=nproc)
    check_against_plan(records(tmp_path / "rec", nproc), data, nproc, accumulation=4, epochs=3)


@pytest.mark.multiprocess
def test_flattened_rows_of_a_padding_free_collator_train_exactly_the_packed_plan(data, tmp_path):  # noqa: F811
    options = ("--collator", "--mode", "packed", "--workers", "2", "--accumulation", "2", "--epochs", "2")
    run(data, tmp_path / "out", tmp_path / "rec", *options)
    check_against_plan(records(tmp_path / "rec"), data, 1, accumulation=2, epochs=2, mode="packed")


@pytest.mark.multiprocess
@pytest.mark.parametrize("nproc", [1, 2])
def test_killed_with_workers_reading_ahead_and_resumed_trains_every_sample_once(data, tmp_path, nproc):  # noqa: F811
    """Two DataLoader workers take batches ahead of the Trainer, so the sampler has handed out more than was
    trained when the checkpoint at step 12 (8 on two processes) is written; SIGKILLed two steps later and
    resumed, the run trains exactly what the uninterrupted run trained."""
    steps = len(planned(data, nproc, 0, 4))
    checkpoint = 12 if nproc == 1 else 8
    assert math.ceil(steps / 4) < checkpoint < 2 * math.ceil(steps / 4), "the checkpoint must fall mid epoch 1"
    options = ("--collator", "--workers", "2", "--accumulation", "4", "--epochs", "3", "--save-steps", str(checkpoint))
    run(data, tmp_path / "base", tmp_path / "base", *options, nproc=nproc)
    before, after = killed_and_resumed(data, tmp_path, options, checkpoint, nproc)
    assert not [line["refused"] for line in after if "refused" in line]
    assert min(line["global_step"] for line in after if "rows" in line) == checkpoint
    baseline = records(tmp_path / "base", nproc)
    for rank in range(nproc):
        assert sequence(before, rank) + sequence(after, rank) == sequence(baseline, rank), f"rank {rank}"
    check_against_plan(before + after, data, nproc, accumulation=4, epochs=3)


# -- in this process ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def texts(data):  # noqa: F811
    return text_rows(data)


@pytest.fixture(scope="module")
def lengths(texts):
    return db.measure_lengths(texts, tokenizer=tokenizer(), version="words", add_special_tokens=False, workers=1)


def arguments(tmp_path, config=transformers.TrainingArguments, **kwargs):
    kwargs = {
        "output_dir": str(tmp_path / "out"), "report_to": [], "use_cpu": True, "save_strategy": "no",
        "remove_unused_columns": False, "disable_tqdm": True, **kwargs,
    }  # fmt: skip
    return config(**kwargs)


def recording(cls):
    class Recording(cls):
        seen: list[tuple[int, list[int]]]

        def training_step(self, model, inputs, *rest, **kwargs):
            ids = inputs["input_ids"]
            rows = sorted((int(r[0]) - 1) * 90 + int(r[1]) - 1 for r in ids)
            self.seen.append((self.bucket_sampler.epoch, rows))
            return super().training_step(model, inputs, *rest, **kwargs)

    Recording.seen = []
    return Recording


def expected(lengths, epochs, accumulation):
    sampler = db.BucketSampler(lengths, max_tokens=128, seed=5, accumulation=accumulation)
    return [(e, sorted(sampler.plan(e)[s].tolist())) for e in range(epochs) for s in range(sampler.plan(e).steps)]


def test_text_rows_train_exactly_the_plan_and_evaluate_with_the_collator(texts, lengths, tmp_path):
    cls = recording(BucketTrainer)
    args = arguments(tmp_path, num_train_epochs=2, gradient_accumulation_steps=2, eval_strategy="no")
    sampler = db.BucketSampler(lengths, max_tokens=128, seed=5)
    trainer = cls(
        model=model(), args=args, train_dataset=texts, eval_dataset=texts.select(range(30)), data_collator=Pad(),
        sampler=sampler, use_data_collator=True,
    )  # fmt: skip
    trainer.train()
    assert cls.seen == expected(lengths, 2, 2)
    assert math.isfinite(trainer.evaluate()["eval_loss"])


def test_a_plain_list_of_examples_with_workers_trains_exactly_the_plan(texts, lengths, tmp_path):
    cls = recording(BucketTrainer)
    args = arguments(tmp_path, num_train_epochs=2, gradient_accumulation_steps=3, dataloader_num_workers=2)
    rows = [{"text": text} for text in texts["text"]]
    sampler = db.BucketSampler(lengths, max_tokens=128, seed=5)
    collated = {"data_collator": Pad(), "use_data_collator": True}
    trainer = cls(model=model(), args=args, train_dataset=rows, sampler=sampler, **collated)
    trainer.train()
    assert cls.seen == expected(lengths, 2, 3)


def test_trl_sft_with_its_own_collator_over_text_rows_trains_exactly_the_plan(texts, lengths, tmp_path):
    trl = pytest.importorskip("trl")

    class SFT(BucketTrainer, trl.SFTTrainer):
        pass

    cls = recording(SFT)
    config = trl.SFTConfig
    args = arguments(
        tmp_path, config, num_train_epochs=2, gradient_accumulation_steps=2, max_length=None,
        dataset_kwargs={"skip_prepare_dataset": True},
    )  # fmt: skip
    sampler = db.BucketSampler(lengths, max_tokens=128, seed=5)
    trainer = cls(
        model=model(), args=args, train_dataset=texts, data_collator=Pad(), processing_class=tokenizer(),
        sampler=sampler, use_data_collator=True,
    )  # fmt: skip
    trainer.train()
    assert cls.seen == expected(lengths, 2, 2)


def test_a_collator_making_rows_longer_than_planned_stops_at_that_batch(texts, lengths, tmp_path):
    short = np.maximum(np.asarray(lengths) - 1, 1)  # measured without a token the collator adds
    trainer = BucketTrainer(
        model=model(), args=arguments(tmp_path), train_dataset=texts, data_collator=Pad(),
        sampler=db.BucketSampler(short, max_tokens=128, seed=5), use_data_collator=True,
    )  # fmt: skip
    with pytest.raises(db.DataError, match=r"example \d+ was collated to \d+ tokens but planned at \d+"):
        trainer.train()


def test_text_rows_and_a_collator_without_use_data_collator_name_it(texts, lengths, tmp_path):
    sampler = db.BucketSampler(lengths, max_tokens=128, seed=5)
    with pytest.raises(db.DataError, match="use_data_collator=True") as caught:
        BucketTrainer(
            model=model(), args=arguments(tmp_path), train_dataset=texts, data_collator=Pad(), sampler=sampler
        )
    assert caught.value.kind == "read"


@pytest.mark.parametrize(
    ("change", "error", "says"),
    [
        ({"store": "store"}, TypeError, "store= has nothing to do"),
        ({"loader_kwargs": {"pad_id": 0}}, TypeError, "loader_kwargs= has nothing to do"),
        ({"sampler": {"max_tokens": 128}}, TypeError, "not a dict of its settings"),
        ({"use_data_collator": "yes"}, TypeError, "must be True or False"),
        ({"train_dataset": "fewer"}, ValueError, "plans 160 rows but train_dataset has 100"),
        ({"sampler": "truncated"}, db.PlanError, "oversize='truncate'"),
    ],
)
def test_each_setting_it_cannot_take_is_refused_naming_the_fix(texts, lengths, tmp_path, data, change, error, says):  # noqa: F811
    kwargs = {
        "train_dataset": texts, "data_collator": Pad(), "use_data_collator": True,
        "sampler": db.BucketSampler(lengths, max_tokens=128, seed=5),
    }  # fmt: skip
    values = {
        "store": db.TokenStore(data),
        "fewer": texts.select(range(100)),
        "truncated": db.BucketSampler(np.append(lengths, 300), max_tokens=128, mode="packed", oversize="truncate"),
    }
    kwargs.update({key: values.get(value, value) if isinstance(value, str) else value for key, value in change.items()})
    with pytest.raises(error, match=says):
        BucketTrainer(model=model(), args=arguments(tmp_path), **kwargs)


def test_pruned_evaluation_rows_are_named_once_at_construction(texts, lengths, tmp_path):
    kwargs = {"train_dataset": texts, "data_collator": Pad(), "use_data_collator": True, "eval_dataset": texts}
    sampler = db.BucketSampler(lengths, max_tokens=128, seed=5)
    with pytest.warns(UserWarning, match="pass remove_unused_columns=False") as caught:
        BucketTrainer(model=model(), args=arguments(tmp_path, remove_unused_columns=True), sampler=sampler, **kwargs)
    assert sum("remove_unused_columns" in str(w.message) for w in caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not when evaluation keeps whole rows too
        BucketTrainer(model=model(), args=arguments(tmp_path), sampler=sampler, **kwargs)


# -- the position a checkpoint records, against the Trainer's loop ---------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    count=st.integers(1, 40),
    accumulation=st.integers(1, 5),
    ahead=st.integers(0, 4),
    stop=st.integers(0, 10**6),
)
def test_the_recorded_position_is_what_the_trainers_steps_trained(count, accumulation, ahead, stop):
    """The Trainer takes an epoch in steps of ``accumulation`` micro-batches (the last one what is left) while a
    loader takes ``ahead`` more; the state written at any global step resumes at exactly the micro-batches
    those steps trained."""
    lengths = np.random.default_rng(count).integers(1, 64, count)
    sampler = db.BucketSampler(lengths, max_tokens=64, seed=1)
    per_epoch = math.ceil(len(sampler) / accumulation)
    global_step = stop % (3 * per_epoch) + 1
    done = 0
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = iter(sampler)
        for first in range(0, len(sampler), accumulation):
            trained = min(first + accumulation, len(sampler))
            for _ in range(min(trained + ahead, len(sampler)) - sampler.position.step):
                next(batches)
            done += 1
            if done == global_step:
                state = trained_position(sampler, global_step, accumulation)
                assert (state["epoch"], state["step"]) == (epoch, trained)
                return
    raise AssertionError("the global step was never reached")

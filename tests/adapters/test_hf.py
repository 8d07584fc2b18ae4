"""The transformers Trainer integration: a tiny causal LM trains a few steps on the CPU from a BucketSampler."""

from __future__ import annotations

import dflash_batch as db
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
datasets = pytest.importorskip("datasets")


def test_trainer_trains_on_the_sampler_batches(tmp_path):
    from dflash_batch.hf import BucketTrainer

    rows = [[(7 * i + j) % 90 + 1 for j in range(3 + i % 17)] for i in range(120)]
    path = str(tmp_path / "ds")
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(path)
    store = db.TokenStore(path)
    sampler = db.BucketSampler(store.lengths(), max_tokens=64, seed=3)
    config = transformers.GPT2Config(vocab_size=100, n_positions=64, n_embd=16, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=6,
        num_train_epochs=2,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
    )
    seen = []

    class Recording(BucketTrainer):
        def training_step(self, model, inputs, *rest, **kw):
            seen.append(inputs["input_ids"].shape)
            return super().training_step(model, inputs, *rest, **kw)

    trainer = Recording(
        model=model, args=args, train_dataset=datasets.load_from_disk(path), sampler=sampler, store=store
    )
    result = trainer.train()
    assert result.global_step == 6 and len(seen) == 6
    assert all(rows_ * width <= 64 for rows_, width in seen)
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) >= 3 and all(loss == loss for loss in losses)  # finite, no NaN


def test_trainer_refuses_wrong_types(tmp_path):
    from dflash_batch.hf import BucketTrainer

    with pytest.raises(TypeError, match="BucketSampler"):
        BucketTrainer(sampler=[1, 2], store=None)


def _trainer_args(tmp_path, **kwargs):
    return transformers.TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True, **kwargs)


def _tiny(tmp_path):
    rows = [[(7 * i + j) % 90 + 1 for j in range(3 + i % 17)] for i in range(60)]
    path = str(tmp_path / "ds")
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(path)
    config = transformers.GPT2Config(vocab_size=100, n_positions=64, n_embd=16, n_layer=1, n_head=2)
    return path, db.TokenStore(path), transformers.GPT2LMHeadModel(config)


def test_trainer_sets_the_samplers_accumulation_and_refuses_another(tmp_path):
    from dflash_batch.hf import BucketTrainer

    path, store, model = _tiny(tmp_path)
    sampler = db.BucketSampler(store.lengths(), max_tokens=64)
    args = _trainer_args(tmp_path, gradient_accumulation_steps=3)
    BucketTrainer(model=model, args=args, train_dataset=datasets.load_from_disk(path), sampler=sampler, store=store)
    assert sampler.accumulation == 3
    explicit = db.BucketSampler(store.lengths(), max_tokens=64, accumulation=2)
    with pytest.raises(db.PlanError, match=r"accumulation=2 .* gradient_accumulation_steps=3"):
        BucketTrainer(
            model=model, args=args, train_dataset=datasets.load_from_disk(path), sampler=explicit, store=store
        )
    other_ranks = db.BucketSampler(store.lengths(), max_tokens=64, world_size=2, rank=1)
    with pytest.raises(db.PlanError, match="world_size=2, rank=1"):
        BucketTrainer(
            model=model, args=args, train_dataset=datasets.load_from_disk(path), sampler=other_ranks, store=store
        )


def test_a_checkpoint_state_at_another_position_is_refused_before_training(tmp_path):
    """The checkpoint's dflash_batch position must be where the Trainer's own step count resumes (another
    gradient_accumulation_steps, number of processes or sampler would skip or repeat samples)."""
    import json

    from dflash_batch.hf import STATE_FILE, BucketTrainer

    path, store, model = _tiny(tmp_path)
    sampler = db.BucketSampler(store.lengths(), max_tokens=64)
    trainer = BucketTrainer(
        model=model,
        args=_trainer_args(tmp_path),
        train_dataset=datasets.load_from_disk(path),
        sampler=sampler,
        store=store,
    )
    folder = tmp_path / "out" / "checkpoint-3"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
    other = db.BucketSampler(store.lengths(), max_tokens=64)
    other.position.skip(2)  # the Trainer would resume at step 3 of epoch 0
    (folder / STATE_FILE).write_text(json.dumps(other.state_dict()))
    with pytest.raises(db.PlanError, match=r"step 2 of epoch 0, but the Trainer resumes at step 3 of epoch 0"):
        trainer.train(resume_from_checkpoint=str(folder))
    two = db.BucketSampler(store.lengths(), max_tokens=64, world_size=2, rank=0)
    (folder / STATE_FILE).write_text(json.dumps(two.state_dict()))
    with pytest.raises(db.PlanError, match=r"written by 2 process\(es\) and this run has 1"):
        trainer.train(resume_from_checkpoint=str(folder))
    seeded = db.BucketSampler(store.lengths(), max_tokens=64, seed=9)
    (folder / STATE_FILE).write_text(json.dumps({**seeded.state_dict(), "step": 3}))
    with pytest.raises(db.PlanError, match="seed 9 vs 0"):
        trainer.train(resume_from_checkpoint=str(folder))
    assert trainer.state.global_step == 0, "nothing trained"


def test_step_timer_times_every_training_micro_batch_of_the_plan(tmp_path):
    """step_timer=True: one record per training micro-batch (forward timed with the clock), its features
    those of the plan's batch trained; at each epoch's end a report (logged as rank_price/*)."""
    from dflash_batch.hf import BucketTrainer

    path, store, model = _tiny(tmp_path)
    sampler = db.BucketSampler(store.lengths(), max_tokens=64, seed=3)
    args = _trainer_args(
        tmp_path, num_train_epochs=2, gradient_accumulation_steps=2, save_strategy="no", logging_steps=1
    )
    trainer = BucketTrainer(
        model=model,
        args=args,
        train_dataset=datasets.load_from_disk(path),
        sampler=sampler,
        store=store,
        step_timer=True,
    )
    timer = trainer.step_timer
    seen: list[tuple[float, float]] = []
    record = timer.record

    def spying(batch, seconds, **kw):
        seen.append(timer.features(batch))
        return record(batch, seconds, **kw)

    timer.record = spying
    trainer.train()
    planned = [timer.features(batch) for epoch in range(2) for batch in sampler.plan(epoch)]
    assert seen == planned
    assert [report.epoch for report in timer.history] == [0, 1]
    assert all(report.records + report.dropped == len(sampler) for report in timer.history if report.fitted)
    logged = [log for log in trainer.state.log_history if "rank_price/applied" in log]
    assert len(logged) == 2


def test_step_timer_refuses_a_timer_of_another_sampler(tmp_path):
    from dflash_batch.hf import BucketTrainer

    path, store, model = _tiny(tmp_path)
    sampler = db.BucketSampler(store.lengths(), max_tokens=64)
    other = db.StepTimer(db.BucketSampler(store.lengths(), max_tokens=64))
    dataset = datasets.load_from_disk(path)
    for wrong, error, match in ((other, db.PlanError, "another sampler"), ("yes", TypeError, "step_timer")):
        with pytest.raises(error, match=match):
            BucketTrainer(
                model=model, args=_trainer_args(tmp_path), train_dataset=dataset, sampler=sampler, store=store,
                step_timer=wrong,
            )  # fmt: skip

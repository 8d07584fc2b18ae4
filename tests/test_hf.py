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


def test_a_checkpoint_state_at_another_position_is_refused(tmp_path):
    from dflash_batch.hf import _Resumed

    _, store, _ = _tiny(tmp_path)
    loader = db.Loader(store, db.BucketSampler(store.lengths(), max_tokens=64))
    loader.set_epoch(1)
    loader.skip(2)
    state = loader.state_dict()
    with pytest.raises(db.PlanError, match="step 2 of epoch 1, but the Trainer resumes at step 4 of epoch 1"):
        _Resumed(loader, 4, state).set_epoch(1)
    resumed = _Resumed(loader, 2, state)
    resumed.set_epoch(1)
    assert len(list(resumed)) == len(loader) - 2
    fresh = _Resumed(loader, 3, None)  # no saved state: the plan alone places the epoch
    fresh.set_epoch(2)
    assert len(list(fresh)) == len(loader) - 3 and loader.epoch == 2

"""The epoch an outside loader resumes in (issue 59), read from what its own protocol saved."""

from __future__ import annotations

import dflash_batch as db
import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("torchdata")

from dflash_batch.adapters.torch import resume_epoch


class Rows:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def test_the_epoch_of_a_stateful_dataloaders_state_is_the_samplers_at_the_checkpoint():
    from torchdata.stateful_dataloader import StatefulDataLoader

    lengths = np.random.default_rng(0).integers(16, 400, 300)
    sampler = db.BucketSampler(lengths, max_tokens=1024, seed=1)
    loader = StatefulDataLoader(Rows(300), batch_sampler=sampler, collate_fn=list)
    sampler.set_epoch(2)
    for k, _ in enumerate(loader):
        if k == 3:
            state = loader.state_dict()
            break
    fresh = db.BucketSampler(lengths, max_tokens=1024, seed=1)
    again = StatefulDataLoader(Rows(300), batch_sampler=fresh, collate_fn=list)
    again.load_state_dict(state)
    assert fresh.epoch == 0, "torchdata applies a loaded state at the next iteration"
    assert resume_epoch(state) == 2
    fresh.set_epoch(resume_epoch(state))
    rest = [sorted(b) for b in again]
    expected = [sorted(fresh.plan(2)[s].tolist()) for s in range(4, fresh.plan(2).steps)]
    assert rest == expected and fresh.epoch == 2


def test_a_state_without_a_samplers_or_with_several_epochs_is_refused():
    with pytest.raises(db.PlanError, match="holds no dflash_batch sampler state"):
        resume_epoch({"_num_yielded": 3, "_sampler_iter_state": None})
    shape = {"version": 1, "step": 0, "fingerprint": "0" * 16, "world_size": 1}
    with pytest.raises(db.PlanError, match=r"several epochs \(\[1, 2\]\)"):
        resume_epoch({"a": {**shape, "epoch": 1}, "b": [{**shape, "epoch": 2}]})
    assert resume_epoch({"a": {**shape, "epoch": 1}, "b": [{**shape, "epoch": 1}]}) == 1


def test_accelerates_epoch_state_sets_the_samplers_epoch():
    pytest.importorskip("accelerate")
    from dflash_batch.adapters.accelerate import epoch_state

    sampler = db.BucketSampler([5, 6, 7] * 20, max_tokens=64)
    sampler.set_epoch(3)
    saved = epoch_state(sampler).state_dict()
    fresh = db.BucketSampler([5, 6, 7] * 20, max_tokens=64)
    epoch_state(fresh).load_state_dict(saved)
    assert fresh.epoch == 3
    with pytest.raises(TypeError, match=r"must be a dflash_batch\.BucketSampler"):
        epoch_state(object())
    with pytest.raises(TypeError, match="epoch must be an int"):
        epoch_state(fresh).load_state_dict({"epoch": "3"})

"""Elastic resume: a checkpoint taken on W ranks resumes on W' ranks with nothing lost or repeated."""

from __future__ import annotations

import dflash_batch as db
import numpy as np
import pytest

LENGTHS = db.seed_workload(6000, seed=8)


def samplers(world: int, **kwargs) -> list[db.BucketSampler]:
    return [
        db.BucketSampler(LENGTHS, max_tokens=16384, world_size=world, rank=r, seed=5, **kwargs) for r in range(world)
    ]


def run(sampler: db.BucketSampler, steps: int | None = None) -> list[int]:
    """Samples of this rank's next `steps` batches (all of the epoch's rest when None)."""
    seen: list[int] = []
    if steps == 0:
        return seen
    for k, batch in enumerate(sampler):
        seen.extend(batch.tolist())
        if steps is not None and k + 1 == steps:
            break
    return seen


@pytest.mark.parametrize(("before", "after", "steps"), [(4, 2, 5), (2, 3, 7), (3, 3, 4), (2, 5, 0)])
def test_resuming_on_another_number_of_ranks_loses_and_repeats_nothing(before, after, steps):
    old = samplers(before)
    for s in old:
        s.set_epoch(2)
    trained = [i for s in old for i in run(s, steps)]
    state = old[0].state_dict()
    assert state["step"] == steps and state["world_size"] == before

    new = samplers(after)
    for s in new:
        s.load_state_dict(state)
    rest = [run(s) for s in new]
    assert len({len(r) > 0 for r in rest}) <= 2
    lengths_of_steps = {s.plan().steps for s in new}
    assert len(lengths_of_steps) == 1, "ranks would run different step counts"
    everything = trained + [i for r in rest for i in r]
    assert sorted(everything) == list(range(len(LENGTHS))), "a sample was lost or repeated"
    # The next epoch is an ordinary plan on the new ranks.
    for s in new:
        s.set_epoch(3)
    nxt = [i for s in new for i in run(s)]
    assert sorted(nxt) == list(range(len(LENGTHS)))
    assert np.array_equal(new[0].plan(3).indices, samplers(after)[0].plan(3).indices)


def test_a_checkpoint_inside_the_resumed_epoch_resumes_there():
    old = samplers(4)
    for s in old:
        s.set_epoch(1)
    trained = [i for s in old for i in run(s, 3)]
    state = old[0].state_dict()
    new = samplers(2)
    for s in new:
        s.load_state_dict(state)
    trained += [i for s in new for i in run(s, 4)]
    second = new[0].state_dict()
    assert second["elastic"] == {"world_size": 4, "step": 3} and second["step"] == 4
    again = samplers(2)
    for s in again:
        s.load_state_dict(second)
    trained += [i for s in again for i in run(s)]
    assert sorted(trained) == list(range(len(LENGTHS)))
    # Resuming that state on yet another number of ranks is refused, naming the way out.
    with pytest.raises(db.PlanError, match="finish that epoch on world_size 2"):
        samplers(3)[0].load_state_dict(second)


def test_another_dataset_or_setting_is_still_refused():
    state = samplers(4)[0].state_dict()
    other = db.BucketSampler(LENGTHS[:-1], max_tokens=16384, world_size=2, rank=0, seed=5)
    with pytest.raises(db.PlanError, match="different dataset or configuration"):
        other.load_state_dict(state)
    reseeded = db.BucketSampler(LENGTHS, max_tokens=16384, world_size=2, rank=0, seed=6)
    with pytest.raises(db.PlanError, match="seed 5 vs 6"):
        reseeded.load_state_dict(state)


def test_a_sampler_pickled_after_an_elastic_resume_keeps_the_replanned_rest():
    """Regression: the pickled copy (DataLoader workers, spawn) replayed the whole epoch."""
    import pickle

    old = samplers(2)
    for s in old:
        s.set_epoch(1)
    trained = [i for s in old for i in run(s, 4)]
    new = samplers(3)
    for s in new:
        s.load_state_dict(old[0].state_dict())
    copies = [pickle.loads(pickle.dumps(s)) for s in new]
    rest = [i for s in copies for i in run(s)]
    assert sorted(trained + rest) == list(range(len(LENGTHS))), "a sample was lost or repeated"

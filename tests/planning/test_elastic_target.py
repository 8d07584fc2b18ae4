"""Elastic resumes where the default target depends on the step shape (issue 61, rules 5): padded batches left
to the default aim at 0.93 in optimizer steps of 2 to 7 micro-batches (ranks × accumulation) and at 0.97
otherwise, so another number of ranks can plan with other buckets. The epoch resumed is re-made as it was
planned on the old ranks (checked against the state's fingerprint), the later ones are planned for the new ranks;
a mixture, whose cycles follow its buckets, is refused where the target would move; and a target given or left
to the default is never mistaken for the other."""

from __future__ import annotations

import collections
import itertools
import warnings

import dflash_batch as db
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

LENGTHS = db.seed_workload(3_000, seed=5)


def ranks(world: int, accumulation: int = 4, lengths=LENGTHS, **kw) -> list[db.BucketSampler]:
    return [
        db.BucketSampler(lengths, max_tokens=16384, world_size=world, rank=r, seed=2, accumulation=accumulation, **kw)
        for r in range(world)
    ]


def run(sampler: db.BucketSampler, steps: int | None = None) -> list[int]:
    """The rows of this rank's next ``steps`` batches (all that are left: None), taking no more."""
    return [i for batch in itertools.islice(sampler, steps) for i in batch.tolist()]


def target(sampler: db.BucketSampler) -> float:
    return sampler.state_dict()["settings"]["target_efficiency"]


@settings(max_examples=25, deadline=None)
@given(
    before=st.integers(1, 3), after=st.integers(1, 3), accumulation=st.integers(1, 4), steps=st.integers(0, 8),
    epoch=st.integers(0, 2),
)  # fmt: skip
def test_an_epoch_resumed_on_other_ranks_trains_each_sample_once_whatever_the_targets(
    before, after, accumulation, steps, epoch
):
    old = ranks(before, accumulation)
    for s in old:
        s.set_epoch(epoch)
    trained = [i for s in old for i in run(s, steps)]
    state = old[0].state_dict()
    new = ranks(after, accumulation)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*carried into epoch")  # may or may not come
        for s in new:
            s.load_state_dict(state)
    rest = [i for s in new for i in run(s)]
    counts = collections.Counter(trained + rest)
    carried = len(LENGTHS) - len(counts)
    assert set(counts.values()) <= {1}
    if carried:  # too few left for whole steps on the new ranks: carried into the next epoch, with a warning
        nxt = collections.Counter()
        for s in new:
            s.set_epoch(epoch + 1)
            nxt.update(run(s))
        assert set(counts) | set(nxt) == set(range(len(LENGTHS)))
    else:
        assert sorted(counts) == list(range(len(LENGTHS)))
        # Later epochs are the new ranks' own plans, at the target their step shape resolves to.
        for s in new:
            s.set_epoch(epoch + 1)
        mine = [i for s in new for i in run(s)]
        assert sorted(mine) == list(range(len(LENGTHS)))
        fresh = ranks(after, accumulation)[0].plan(epoch + 1)
        assert np.array_equal(new[0].plan(epoch + 1).indices, fresh.indices)


def test_one_rank_in_steps_of_4_resumed_on_two_ranks_moves_to_the_wider_step_target():
    old = ranks(1)
    assert target(old[0]) == 0.93
    trained = run(old[0], 5)
    state = old[0].state_dict()
    new = ranks(2)
    assert target(new[0]) == 0.97
    for s in new:
        s.load_state_dict(state)
    assert sorted(trained + [i for s in new for i in run(s)]) == list(range(len(LENGTHS)))


def test_a_mixture_is_refused_where_the_target_would_move_and_resumes_with_it_given():
    def mix():
        return db.Mixture({"a": (LENGTHS[:2000], 0.7), "b": (LENGTHS[2000:], 0.3)})

    old = db.BucketSampler(mix(), max_tokens=16384, world_size=1, rank=0, seed=2, accumulation=4)
    run(old, 3)
    state = old.state_dict()
    moved = db.BucketSampler(mix(), max_tokens=16384, world_size=2, rank=0, seed=2, accumulation=4)
    refused = r"mixture .* target_efficiency 0\.97.*ran at 0\.93.*pass target_efficiency=0\.93"
    with pytest.raises(db.PlanError, match=refused):
        moved.load_state_dict(state)
    assert moved.position.step == 0
    given = [
        db.BucketSampler(mix(), max_tokens=16384, world_size=2, rank=r, seed=2, accumulation=4, target_efficiency=0.93)
        for r in range(2)
    ]
    for s in given:
        s.load_state_dict(state)
    planned = collections.Counter(old.plan(0).indices.tolist())
    trained = collections.Counter(old.plan(0).indices[: old.plan(0).offsets[3]].tolist())
    trained.update(i for s in given for i in run(s))
    assert trained == planned


def test_a_target_given_is_not_taken_for_the_default_on_the_old_ranks():
    # Planned at 0.97 given, on one rank in steps of 4, where the default is 0.93: resumed on two ranks with the
    # default (0.97 there), the old plan re-made with the default would be another one.
    old = ranks(1, target_efficiency=0.97)
    run(old[0], 4)
    state = old[0].state_dict()
    new = ranks(2)
    with pytest.raises(db.PlanError, match=r"on its world_size 1\): target_efficiency 0\.97 vs 0\.93"):
        new[0].load_state_dict(state)
    for s in ranks(2, target_efficiency=0.97):
        s.load_state_dict(state)  # the target it ran at resumes it


def test_an_epoch_resumed_elastically_is_re_made_with_the_target_it_began_with():
    # One rank (default 0.93) → two ranks (default 0.97) → a checkpoint inside that epoch → resumed on two ranks
    # with 0.97 given: same fingerprint on two ranks, but the epoch began at 0.93 on one; refused.
    first = ranks(1)
    done = run(first[0], 3)
    second = ranks(2)
    for s in second:
        s.load_state_dict(first[0].state_dict())
    done += [i for s in second for i in run(s, 2)]  # every rank its 2 steps
    inside = second[0].state_dict()
    assert inside["elastic"]["world_size"] == 1 and "fingerprint" in inside["elastic"]
    with pytest.raises(db.PlanError, match=r"began on world_size 1, where these settings plan it differently"):
        ranks(2, target_efficiency=0.97)[0].load_state_dict(inside)
    again = ranks(2)
    for s in again:
        s.load_state_dict(inside)
    assert sorted(done + [i for s in again for i in run(s)]) == list(range(len(LENGTHS)))


def test_an_edited_origin_fingerprint_is_refused():
    first = ranks(1)
    run(first[0], 3)
    second = ranks(2)
    for s in second:
        s.load_state_dict(first[0].state_dict())
    run(second[0], 1)
    inside = second[0].state_dict()
    with pytest.raises(db.PlanError, match="elastic fingerprint=5 is not what state_dict"):
        ranks(2)[0].load_state_dict({**inside, "elastic": {**inside["elastic"], "fingerprint": 5}})

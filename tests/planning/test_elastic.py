"""Elastic resume: a checkpoint taken on W ranks resumes on W' ranks with nothing lost or repeated."""

from __future__ import annotations

import warnings

import dflash_batch as db
import numpy as np
import pytest
from _trained import run
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

LENGTHS = db.seed_workload(6000, seed=8)


def samplers(world: int, **kwargs) -> list[db.BucketSampler]:
    return [
        db.BucketSampler(LENGTHS, max_tokens=16384, world_size=world, rank=r, seed=5, **kwargs) for r in range(world)
    ]


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
    assert second["elastic"] == {"world_size": 4, "step": 3, "fingerprint": state["fingerprint"]}
    assert second["step"] == 4
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


def epoch_of(new: list[db.BucketSampler], epoch: int) -> list[int]:
    for s in new:
        s.set_epoch(epoch)
    return [i for s in new for i in run(s)]


def test_a_rest_too_small_for_the_new_ranks_is_carried_into_the_next_epoch():
    """Regression: 3 → 8 ranks with one step left raised PlanError (and suggested drop_last, which then
    failed the fingerprint check). Now that epoch ends, and the next plans the rest with its samples."""
    lengths = db.seed_workload(200, seed=2)
    old = [db.BucketSampler(lengths, max_tokens=16384, world_size=3, rank=r, seed=1) for r in range(3)]
    steps = old[0].plan().steps
    trained = [i for s in old for i in run(s, steps - 1)]
    state = old[0].state_dict()
    new = [db.BucketSampler(lengths, max_tokens=16384, world_size=8, rank=r, seed=1) for r in range(8)]
    for s in new:
        with pytest.warns(
            UserWarning,
            match=r"left in epoch 0 after step \d+ on world_size 3 cannot give each of "
            r"world_size 8 ranks a batch in whole steps; epoch 0 ends here and they are carried "
            r"into epoch 1",
        ):
            s.load_state_dict(state)
    # len() stays every epoch's steps (trainers read it once); this epoch's rest has none.
    assert [s.plan().steps for s in new] == [0] * 8 and all(run(s) == [] for s in new)
    assert {len(s) for s in new} == {db.BucketSampler(lengths, max_tokens=16384, world_size=8, seed=1).plan(0).steps}
    carried = sorted(set(range(len(lengths))) - set(trained))
    assert len(carried) > 0
    assert {s.plan(1).steps for s in new} == {new[0].plan(1).steps}, "ranks would run different step counts"
    nxt = epoch_of(new, 1)
    assert sorted(nxt) == sorted(list(range(len(lengths))) + carried), "epoch 1 is every sample plus the rest"
    # Epoch 2 is an ordinary plan again.
    assert np.array_equal(
        new[0].plan(2).indices, db.BucketSampler(lengths, max_tokens=16384, world_size=8, seed=1).plan(2).indices
    )


def carrying(world_before: int = 3, world_after: int = 8) -> tuple[list[db.BucketSampler], list[int], np.ndarray]:
    """Samplers on `world_after` ranks resumed (carrying) from the last step of epoch 0 on `world_before`."""
    lengths = db.seed_workload(200, seed=2)
    make = lambda w, r: db.BucketSampler(lengths, max_tokens=16384, world_size=w, rank=r, seed=1)  # noqa: E731
    old = [make(world_before, r) for r in range(world_before)]
    trained = [i for s in old for i in run(s, old[0].plan().steps - 1)]
    state = old[0].state_dict()
    new = [make(world_after, r) for r in range(world_after)]
    with pytest.warns(UserWarning, match="carried"):
        for s in new:
            s.load_state_dict(state)
    return new, trained, lengths


def test_a_checkpoint_inside_the_carrying_epoch_resumes_there():
    new, _, lengths = carrying()
    for s in new:
        s.set_epoch(1)
    first = [i for s in new for i in run(s, 2)]
    state = new[0].state_dict()
    assert state["epoch"] == 1 and state["step"] == 2
    origin = new[0].position.origin
    assert state["elastic"] == {
        "world_size": 3, "step": origin.step, "carried_from": 0, "fingerprint": origin.fingerprint
    }  # fmt: skip
    again = [db.BucketSampler(lengths, max_tokens=16384, world_size=8, rank=r, seed=1) for r in range(8)]
    with pytest.warns(UserWarning, match="carried"):
        for s in again:
            s.load_state_dict(state)
    rest = [i for s in again for i in run(s)]
    whole = sorted(new[0].plan(1).indices.tolist())
    assert sorted(first + rest) == whole, "the carrying epoch's rest was not resumed exactly"
    with pytest.raises(db.PlanError, match="which also trains samples epoch 0 left when it moved from world_size 3"):
        db.BucketSampler(lengths, max_tokens=16384, world_size=4, seed=1).load_state_dict(state)
    # An edited state that claims a carry the plan does not have is refused.
    with pytest.raises(db.PlanError, match="carried_from=5 is not epoch 1 or the one before"):
        again[0].load_state_dict(dict(state, elastic={**state["elastic"], "carried_from": 5}))


def test_a_sampler_pickled_in_or_before_the_carrying_epoch_carries_the_same_rest():
    import pickle
    import warnings

    new, _, _ = carrying()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a copy (a DataLoader worker) does not warn again
        copies = [pickle.loads(pickle.dumps(s)) for s in new]
    assert all(c.plan().steps == 0 for c in copies)
    for s, c in zip(new, copies, strict=True):
        assert np.array_equal(s.plan(1).indices, c.plan(1).indices)
    for c in copies:
        c.set_epoch(1)
        next(iter(c))
    moved = [pickle.loads(pickle.dumps(c)) for c in copies]
    assert [m.plan().steps for m in moved] == [c.plan().steps for c in copies]
    assert np.array_equal(moved[0].plan().indices, new[0].plan(1).indices)


def test_the_loader_runs_an_epoch_that_was_carried(tmp_path):
    pytest.importorskip("torch")
    from _arrow import token_rows, token_table, write_ipc

    store = db.TokenStore(write_ipc(tmp_path / "t.arrow", token_table(token_rows(120, longest=60))))
    make = lambda w, r: db.BucketSampler(store.lengths(), max_tokens=256, world_size=w, rank=r, seed=3)  # noqa: E731
    steps = make(1, 0).plan().steps
    loaders = [db.Loader(store, make(6, r), num_items_in_batch=True) for r in range(6)]
    state = db.Loader(store, make(1, 0)).state_dict()
    state["step"] = steps - 1
    with pytest.warns(UserWarning, match="carried into epoch 1"):
        for loader in loaders:
            loader.load_state_dict(state)
    assert [len(list(loader)) for loader in loaders] == [0] * 6
    for loader in loaders:
        loader.set_epoch(1)
    plan = loaders[0].sampler.plan()
    assert len(plan.indices) > len(store), "epoch 1 holds the carried rest"
    for rank, loader in enumerate(loaders):
        batches = list(loader)
        assert len(batches) == plan.steps
        for step, batch in enumerate(batches):
            want = db.collate(store, plan[step * 6 + rank])
            assert np.array_equal(batch["input_ids"].numpy(), want["input_ids"]), (rank, step)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(8, 160),
    seed=st.integers(0, 2**16),
    size=st.sampled_from(
        [
            {"max_tokens": 2048},
            {"max_tokens": 700},
            {"batch_size": 3},
            {"max_tokens": 1024, "mode": "packed"},
            {"max_tokens": 1024, "mode": "packed", "cost": (1.0, 1e-3)},  # rows composed by cost
        ]
    ),
    accumulation=st.sampled_from([None, 2]),
    before=st.integers(1, 5),
    after=st.integers(1, 9),
    back=st.integers(0, 3),
)
def test_any_resume_on_any_ranks_trains_every_sample_of_the_epoch_once(
    n, seed, size, accumulation, before, after, back
):
    """Regression: 10 of 175 elastic resumes near an epoch's end raised PlanError. Whatever the ranks and
    the step, epoch 1's samples are trained once — in its steps before the checkpoint, in its rest on the
    new ranks, or carried into epoch 2, which then trains every sample plus the carried ones."""
    lengths = np.random.default_rng(seed).integers(1, 500, n)
    kwargs = dict(size, seed=seed, accumulation=accumulation)
    old = [db.BucketSampler(lengths, world_size=before, rank=r, **kwargs) for r in range(before)]
    for s in old:
        s.set_epoch(1)
    try:
        steps = max(old[0].plan().steps - back, 0)
    except db.PlanError:  # too few samples for the old ranks in the first place
        assume(False)
    trained = [i for s in old for i in run(s, steps)]
    state = old[0].state_dict()
    new = [db.BucketSampler(lengths, world_size=after, rank=r, **kwargs) for r in range(after)]
    try:  # the data must fit the new ranks at all: tiny datasets can have epochs no 'after' ranks can share
        new[0].plan(2)
    except db.PlanError:
        assume(False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in new:
            s.load_state_dict(state)
    rest = [i for s in new for i in run(s)]
    assert len({s.plan().steps for s in new}) == 1
    carried = sorted(set(range(n)) - set(trained) - set(rest))
    assert sorted(trained + rest + carried) == list(range(n)), "a sample was repeated in epoch 1"
    assert bool(carried) == any("carried into epoch 2" in str(w.message) for w in caught)
    event("carried" if carried else "planned on the new ranks")
    try:
        nxt = epoch_of(new, 2)
    except db.PlanError as error:
        # A tiny dataset whose epoch fits the new ranks may not fit them with the carried samples added
        # (8 samples + 1 carried on 7 ranks need 14 batches, or 7 holding 9 samples): a clear refusal.
        assert carried and "ranks a batch without repeating samples" in str(error), str(error)
        event("epoch 2 with the carried samples does not fit the new ranks")
        return
    assert sorted(nxt) == sorted(list(range(n)) + carried)
    assert len({s.plan().steps for s in new}) == 1


def test_a_carrying_epoch_priced_otherwise_than_its_origin_resumes_each_by_its_own_price():
    """Regression (issue 59): a price refitted from epoch 1 on (StepTimer.end_epoch after epoch 1 began),
    an elastic resume near epoch 0's end carrying rows into epoch 1, then a checkpoint in epoch 1: the
    checkpoint was decoded with epoch 1's price and epoch 0 re-planned with it — rows trained twice and
    others never, or the unedited state refused as edited."""
    lengths = np.random.default_rng(0).integers(16, 4000, 200)
    price = (1.0, 1 / 2048)  # attention-dominated: balances the ranks otherwise than tokens
    make = lambda w, r, **k: db.BucketSampler(  # noqa: E731
        lengths, max_tokens=16384, world_size=w, rank=r, seed=1, accumulation=2, **k
    )
    assert not np.array_equal(make(3, 0).plan(0).indices, make(3, 0, rank_cost=price).plan(0).indices)
    old = [make(3, r) for r in range(3)]
    for s in old:
        s.position.price_from(1, price)
    trained = [i for s in old for i in run(s, old[0].plan().steps - 1)]
    state = old[0].state_dict()
    assert state["rank_costs"] == [[1, *price]]
    new = [make(8, r) for r in range(8)]
    with pytest.warns(UserWarning, match="carried"):
        for s in new:
            s.load_state_dict(state)
    carried = sorted(set(range(len(lengths))) - set(trained))
    assert sorted(new[0].position.origin.carried.tolist()) == carried
    for s in new:
        s.set_epoch(1)
    first = [i for s in new for i in run(s, 1)]
    middle = new[0].state_dict()
    assert middle["elastic"]["carried_from"] == 0
    again = [make(8, r) for r in range(8)]
    with pytest.warns(UserWarning, match="carried"):
        for s in again:
            s.load_state_dict(middle)
    assert sorted(again[0].position.origin.carried.tolist()) == carried, "epoch 0 was re-planned by epoch 1's price"
    rest = [i for s in again for i in run(s)]
    assert sorted(first + rest) == sorted(list(range(len(lengths))) + carried), "a row twice or never"
    assert np.array_equal(again[0].plan(1).indices, new[0].plan(1).indices)

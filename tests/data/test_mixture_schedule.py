"""Mixture schedules (issue 63 part 1): weights that change from epoch to epoch, declared up front. Every
epoch's shares are exact for its weights, a down-sampled source's cycle carries on across a change (no row
twice within a cycle, a cycle left only when the next slice does not fit what is left of it), resume and
elastic resume are exact across a change, and a checkpoint of another schedule is refused naming the epoch
where the weights part."""

from __future__ import annotations

import collections
import pickle

import dflash_batch as db
import numpy as np
import pytest
from _trained import run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PARTS = db.seed_mixture(12_000, seed=2)
NAMES = ["chat", "code", "math", "safety"]
FIRST = {"chat": 0.1, "code": 0.4, "math": 0.3, "safety": 0.2}
POINTS = {
    2: {"chat": 0.3, "code": 0.3, "math": 0.2, "safety": 0.2},
    5: {"chat": 0.05, "code": 0.35, "math": 0.3, "safety": 0.3},
}


def mixture(schedule=POINTS, unit: str = "samples", **kwargs) -> db.Mixture:
    return db.Mixture({n: (PARTS[n], FIRST[n]) for n in NAMES}, unit=unit, schedule=schedule, **kwargs)


def largest_remainder(size: int, weights: list[float]) -> list[int]:
    """The shares the planner promises (an independent statement of `quotas.rs`' rule)."""
    total = sum(weights)
    exact = [size * w / total for w in weights]
    shares = [int(x) for x in exact]
    order = sorted((i for i, w in enumerate(weights) if w > 0), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in order[: size - sum(shares)]:
        shares[i] += 1
    return shares


def per_source(sampler: db.BucketSampler, epoch: int) -> collections.Counter:
    plan = sampler.plan(epoch)
    return collections.Counter(sampler.sources_of(plan.indices).tolist())


def test_weights_hold_or_move_in_a_line():
    constant, linear = mixture(), mixture(interpolation="linear")
    assert constant.weights_at(0) == FIRST and constant.weights_at(1) == FIRST
    assert constant.weights_at(3) == POINTS[2] and constant.weights_at(99) == POINTS[5]
    middle = linear.weights_at(3)
    for name in NAMES:
        assert middle[name] == pytest.approx(POINTS[2][name] + (POINTS[5][name] - POINTS[2][name]) / 3)
    assert linear.schedule == POINTS and linear.interpolation == "linear"
    assert "schedule=" in repr(linear)
    assert mixture(schedule=None).schedule is None


@pytest.mark.parametrize("interpolation", ["constant", "linear"])
def test_every_epoch_holds_its_weights_exactly(interpolation):
    mix = mixture(interpolation=interpolation)
    sampler = db.BucketSampler(mix, max_tokens=16384, world_size=2, rank=0, seed=3)
    size = len(mix)
    for epoch in range(8):
        weights = mix.weights_at(epoch)
        want = largest_remainder(size, [weights[n] for n in NAMES])
        counts = per_source(sampler, epoch)
        assert [counts[s] for s in range(4)] == want, f"epoch {epoch}"
        stats = sampler.plan(epoch).stats()["sources"]
        assert {n: stats[n]["weight"] for n in NAMES} == weights
    assert {sampler.plan(e).steps for e in range(8)} == {len(sampler)}


def walk_cycles(total: int, rests: list[int]) -> list[int]:
    """Each epoch's cycle under the walk the docs state: a slice follows the one before in its cycle while
    it fits, else starts the next cycle."""
    cycle, at, out = 0, 0, []
    for rest in rests:
        if at + rest > total:
            cycle, at = cycle + 1, 0
        out.append(cycle)
        at += rest
    return out


def test_a_down_sampled_source_walks_its_cycle_across_weight_changes():
    """'chat' (4,800 rows) is down-sampled at every epoch's weights: across both changes, no row repeats within
    a cycle, and a cycle is left only when the next epoch's slice does not fit what is left of it."""
    mix = mixture(interpolation="linear")
    sampler = db.BucketSampler(mix, max_tokens=16384, seed=6)
    chat_rows = len(PARTS["chat"])
    epochs = 12
    rests = [largest_remainder(len(mix), [mix.weights_at(e)[n] for n in NAMES])[0] for e in range(epochs)]
    assert all(r < chat_rows for r in rests) and len(set(rests)) > 3
    cycles = walk_cycles(chat_rows, rests)
    seen: dict[int, set[int]] = collections.defaultdict(set)
    for epoch in range(epochs):
        plan = sampler.plan(epoch)
        chat = np.asarray(plan.indices)[sampler.sources_of(plan.indices) == 0]
        assert len(np.unique(chat)) == len(chat) == rests[epoch]
        fresh = set(chat.tolist())
        assert not seen[cycles[epoch]] & fresh, f"epoch {epoch} repeats rows of its cycle"
        seen[cycles[epoch]] |= fresh
    for c in range(max(cycles)):
        left_by = rests[cycles.index(c + 1)]
        assert chat_rows - len(seen[c]) < left_by, f"cycle {c} left {chat_rows - len(seen[c])} rows behind"


def test_each_bad_schedule_is_refused_naming_it():
    def refused(schedule, error=db.PlanError, **kwargs):
        with pytest.raises(error) as raised:
            mixture(schedule=schedule, **kwargs)
        return str(raised.value)

    assert "epoch 0" in refused({0: FIRST})
    assert "'poetry', which is not a source" in refused({2: {**FIRST, "poetry": 0.0}})
    assert "no weight for source 'safety'" in refused({2: {n: FIRST[n] for n in NAMES[:3]}})
    assert "sum to" in refused({2: {**FIRST, "chat": 0.5}})
    assert "weight -0.1 at epoch 2" in refused({2: {**FIRST, "chat": -0.1, "code": 0.6}})
    assert "interpolation='cubic'" in refused(POINTS, interpolation="cubic")
    assert "65 points" in refused({e: FIRST for e in range(1, 66)})
    assert "past the last" in refused({1 << 21: FIRST})
    assert "epochs must be ints" in refused({2.5: FIRST}, TypeError)
    assert "epochs must be ints" in refused({True: FIRST}, TypeError)
    assert "dict of epoch" in refused([(2, FIRST)], TypeError)
    assert "dict of name -> weight" in refused({2: [0.25] * 4}, TypeError)
    assert "pass a number" in refused({2: {**FIRST, "chat": "0.1"}}, TypeError)
    with pytest.raises(TypeError, match="epoch must be an int"):
        mixture().weights_at(-1)


def test_a_point_a_source_cannot_fill_is_refused_naming_its_epoch():
    # 'safety' holds 1,195 of 12,000 rows: 0.9 of an epoch is 9 copies, past the cap of 4.
    heavy = {4: {"chat": 0.05, "code": 0.05, "math": 0.0, "safety": 0.9}}
    with pytest.raises(db.PlanError, match=r"source 'safety' .* weight 0\.9 at epoch 4") as raised:
        db.BucketSampler(mixture(heavy), max_tokens=16384)
    assert raised.value.kind == "source_too_small"


def test_a_pickled_sampler_plans_the_same_schedule():
    sampler = db.BucketSampler(mixture(interpolation="linear"), max_tokens=16384, world_size=2, rank=1, seed=2)
    copy = pickle.loads(pickle.dumps(sampler))
    for epoch in (0, 3, 6):
        assert np.array_equal(copy.plan(epoch).indices, sampler.plan(epoch).indices)
    assert copy.mixture.schedule == sampler.mixture.schedule


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    epoch=st.integers(0, 6),
    steps=st.integers(0, 12),
    before=st.integers(1, 3),
    after=st.integers(1, 3),
    linear=st.booleans(),
)
def test_resume_and_elastic_resume_across_a_change_are_exact(epoch, steps, before, after, linear):
    """A checkpoint at a random step of an epoch around the changes, resumed on the same or another number of
    ranks: the samples of the epoch are the plan's, none lost, none twice; the next epoch is the schedule's."""
    interpolation = "linear" if linear else "constant"
    mix = mixture(interpolation=interpolation)

    def ranks(world):
        # A target given: the default's depends on the step shape, and a mixture resumed where it resolves
        # otherwise is refused (test_elastic_target.py).
        return [
            db.BucketSampler(mix, max_tokens=16384, world_size=world, rank=r, seed=9, target_efficiency=0.97)
            for r in range(world)
        ]

    old = ranks(before)
    for s in old:
        s.set_epoch(epoch)
    planned = collections.Counter(old[0].plan(epoch).indices.tolist())
    trained = [i for s in old for i in run(s, steps)]
    state = old[0].state_dict()
    new = ranks(after)
    for s in new:
        s.load_state_dict(state)
    trained += [i for s in new for i in run(s)]
    assert collections.Counter(trained) == planned
    for s in new:
        s.set_epoch(epoch + 1)
    nxt = collections.Counter(i for s in new for i in run(s))
    assert nxt == collections.Counter(ranks(1)[0].plan(epoch + 1).indices.tolist())


def test_a_checkpoint_of_another_schedule_is_refused_naming_the_epoch():
    sampler = db.BucketSampler(mixture(), max_tokens=16384, seed=1)
    sampler.set_epoch(1)
    next(iter(sampler))
    state = sampler.state_dict()
    other_points = {2: POINTS[2], 5: {**POINTS[5], "chat": 0.1, "code": 0.3}}
    cases = {
        "weights at epoch 5: 'chat' 0.05 vs 0.1, 'code' 0.35 vs 0.3": mixture(other_points),
        "schedule interpolation 'constant' vs 'linear'": mixture(interpolation="linear"),
        "the checkpoint's weight schedule vs fixed weights here": mixture(schedule=None),
        "weights at epoch 2:": mixture({3: POINTS[2], 5: POINTS[5]}),
    }
    for expected, mix in cases.items():
        other = db.BucketSampler(mix, max_tokens=16384, seed=1)
        with pytest.raises(db.PlanError, match="checkpoint") as raised:
            other.load_state_dict(state)
        assert expected in str(raised.value), str(raised.value)
    fixed = db.BucketSampler(mixture(schedule=None), max_tokens=16384, seed=1)
    fixed.set_epoch(1)
    next(iter(fixed))
    with pytest.raises(db.PlanError, match="fixed weights in the checkpoint vs a weight schedule here"):
        db.BucketSampler(mixture(), max_tokens=16384, seed=1).load_state_dict(fixed.state_dict())
    # The same schedule resumes.
    again = db.BucketSampler(mixture(), max_tokens=16384, seed=1)
    again.load_state_dict(state)


def test_the_hf_trainer_trains_each_epoch_at_its_scheduled_weights(tmp_path):
    """The real Trainer, GA 2, three epochs across two changes of weights: every micro-batch is the plan's of
    its epoch, each epoch holds its own shares, the steps stay the same (the Trainer reads them once), and the
    down-sampled source's rows do not repeat within its cycle."""
    pytest.importorskip("transformers")
    from _hf_rows import rows, train_recording

    chat, code = rows(0, 90, 20), rows(90, 60, 40)
    schedule = {1: {"chat": 0.5, "code": 0.5}, 2: {"chat": 0.1, "code": 0.9}}
    sources = {"chat": (db.TokenStore(chat), 0.3), "code": (db.TokenStore(code), 0.7)}
    mix = db.Mixture(sources, unit="samples", schedule=schedule)
    trainer, seen = train_recording(mix, [chat, code], str(tmp_path), epochs=3)
    sampler = trainer.bucket_sampler
    chat_rows = {}
    for epoch, shares in enumerate(([45, 105], [75, 75], [15, 135])):
        plan = sampler.plan(epoch)
        assert plan.steps == len(sampler)
        trained = [sorted(r) for e, r in seen if e == epoch]
        assert trained == [sorted(plan[s].tolist()) for s in range(plan.steps)], f"epoch {epoch}"
        sources = mix.source_of(plan.indices)
        assert np.bincount(sources).tolist() == shares, f"epoch {epoch}'s weights"
        chat_rows[epoch] = set(plan.indices[sources == 0].tolist())
    # 'chat' (90 rows): 45 in epoch 0; 75 do not fit the 45 left, so epoch 1 starts a cycle; epoch 2's 15 fit it.
    assert not chat_rows[1] & chat_rows[2], "a 'chat' row twice within a cycle"


KEYS = st.one_of(st.integers(-3, 1 << 66), st.floats(allow_nan=True), st.booleans(), st.text(max_size=3), st.none())
WEIGHT = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2, 3), st.text(max_size=2), st.none())
POINT = st.one_of(
    st.dictionaries(st.sampled_from([*NAMES, "other", 3]), WEIGHT, max_size=5),
    st.fixed_dictionaries({n: st.floats(0, 1) for n in NAMES}),
    st.lists(st.floats(0, 1), max_size=4),
    st.none(),
)


@settings(max_examples=200, deadline=None)
@given(
    schedule=st.one_of(st.dictionaries(KEYS, POINT, max_size=4), st.lists(st.integers(), max_size=2), st.none()),
    interpolation=st.one_of(st.sampled_from(["constant", "linear", "cubic", ""]), st.integers(0, 2)),
)
def test_any_schedule_argument_builds_or_raises_a_documented_error(schedule, interpolation):
    """Whatever is passed as a schedule, the mixture is built (and plans every epoch it names, with its
    weights) or refused with TypeError or PlanError (a ValueError) — never another exception."""
    try:
        mix = db.Mixture(
            {n: (PARTS[n], FIRST[n]) for n in NAMES}, unit="samples", schedule=schedule, interpolation=interpolation
        )
    except (TypeError, db.PlanError):
        return
    for epoch in [0, *(mix.schedule or {})]:
        weights = mix.weights_at(epoch)
        assert abs(sum(weights.values()) - 1) < 1e-6 and min(weights.values()) >= 0

"""Checkpoints planned under other planning rules (issue 31 changed how a window's ranks are evened out on
several ranks with accumulation — rules 1 — and how packed rows under an attention price are composed —
rules 2, and their closing fits, rules 3; issue 63 composed the default packed rows, priced by tokens, that
way too, rules 4; issue 61 made padded batches left to the default target aim at 0.93 in optimizer steps of 2
to 7 micro-batches, rules 5): a state names the rules it was planned under, and a configuration whose
plans changed since refuses to resume it mid-epoch — replaying a different plan would train some samples
twice and skip others without a word — while the next epoch, and configurations whose plans did not change,
resume as before."""

from __future__ import annotations

import hashlib

import dflash_batch as db
import numpy as np
import pytest
from dflash_batch import _core

LENGTHS = db.seed_workload(20_000, seed=5)


def sampler(**settings) -> db.BucketSampler:
    return db.BucketSampler(LENGTHS, max_tokens=16384, world_size=8, rank=0, seed=1, **settings)


def trained(s: db.BucketSampler, steps: int) -> dict:
    it = iter(s)
    for _ in range(steps):
        next(it)
    return s.state_dict()


def test_a_state_records_the_rules_and_resumes_under_them():
    state = trained(sampler(accumulation=4), 5)
    assert state["revision"] == _core.PLAN_REVISION == 5
    s = sampler(accumulation=4)
    s.load_state_dict(state)
    assert [b.tolist() for b in s] == [s.plan(0)[i * 8].tolist() for i in range(5, s.plan(0).steps)]


def test_an_older_state_mid_epoch_is_refused_where_the_plans_changed():
    state = trained(sampler(accumulation=4), 5)
    del state["revision"]  # as every release before revision 1 wrote it
    s = sampler(accumulation=4)
    with pytest.raises(db.PlanError, match=r"planned under planning rules 0.*8 ranks, accumulation 4") as caught:
        s.load_state_dict(state)
    assert "load_state_dict({**state, 'epoch': 0 + 1, 'step': 0})" in str(caught.value)
    assert s.position.epoch == 0 and s.position.step == 0  # a refused state changes nothing
    # What the message offers: the next epoch, whole.
    s.load_state_dict({**state, "epoch": 1, "step": 0})
    assert s.epoch == 1 and len(list(s)) == s.plan(1).steps


@pytest.mark.parametrize(
    "settings", [{"accumulation": 1}, {"accumulation": 4, "world_size": 1, "target_efficiency": 0.97}]
)
def test_an_older_state_resumes_where_the_plans_did_not_change(settings):
    world = settings.pop("world_size", 8)
    make = lambda: db.BucketSampler(LENGTHS, max_tokens=16384, world_size=world, rank=0, seed=1, **settings)  # noqa: E731
    state = trained(make(), 3)
    del state["revision"]
    s = make()
    s.load_state_dict(state)
    assert s.position.step == 3


def test_an_older_state_on_other_data_is_refused_for_the_data():
    state = trained(sampler(accumulation=4), 5)
    del state["revision"]
    other = db.BucketSampler(LENGTHS[:-1], max_tokens=16384, world_size=8, rank=0, seed=1, accumulation=4)
    with pytest.raises(db.PlanError, match="num_samples"):
        other.load_state_dict(state)


@pytest.mark.parametrize(("value", "error"), [("1", TypeError), (-1, db.PlanError), (True, TypeError)])
def test_a_bad_revision_is_refused(value, error):
    state = trained(sampler(accumulation=4), 2)
    with pytest.raises(error, match="state revision"):
        sampler(accumulation=4).load_state_dict({**state, "revision": value})


PACKED_COST = {"mode": "packed", "cost": (1.0, 1 / 30720)}


@pytest.mark.parametrize("revision", [1, 2])
@pytest.mark.parametrize("world", [1, 8])
def test_an_older_state_of_packed_rows_under_attention_is_refused_mid_epoch(world, revision):
    make = lambda: db.BucketSampler(LENGTHS, max_tokens=16384, world_size=world, rank=0, seed=1, **PACKED_COST)  # noqa: E731
    state = trained(make(), 3)
    s = make()
    with pytest.raises(db.PlanError, match=rf"planning rules {revision}.*mode 'packed'"):
        s.load_state_dict({**state, "revision": revision})
    s.load_state_dict({**state, "revision": revision, "epoch": 1, "step": 0})
    assert s.epoch == 1 and len(list(s)) == s.plan(1).steps


@pytest.mark.parametrize(
    "settings",
    [
        {"mode": "packed", "bucketed": True},
        {"mode": "packed", "bucketed": True, "cost": (1.0, 1 / 30720)},
        {"cost": (1.0, 1 / 30720)},
        {"mode": "packed", "shuffle": False},
    ],
)
@pytest.mark.parametrize("revision", [1, 2, 3])
def test_an_older_state_resumes_where_rules_2_to_4_changed_nothing(settings, revision):
    make = lambda: db.BucketSampler(LENGTHS, max_tokens=16384, world_size=8, rank=0, seed=1, **settings)  # noqa: E731
    state = trained(make(), 3)
    s = make()
    s.load_state_dict({**state, "revision": revision})
    assert s.position.step == 3


@pytest.mark.parametrize("revision", [0, 1, 2, 3])
@pytest.mark.parametrize("world", [1, 8])
def test_an_older_state_of_default_packed_rows_is_refused_mid_epoch(world, revision):
    """Default packed rows (cost "tokens") were packed best fit until rules 4: a state of rules 3 mid-epoch would
    replay rows composed another way."""
    make = lambda: db.BucketSampler(LENGTHS, max_tokens=16384, world_size=world, rank=0, seed=1, mode="packed")  # noqa: E731
    state = trained(make(), 3)
    s = make()
    message = rf"planning rules {revision}, and this dflash_batch \(rules {_core.PLAN_REVISION}\).*mode 'packed'"
    message += rf".*PLAN_REVISION is {revision}\)"
    with pytest.raises(db.PlanError, match=message):
        s.load_state_dict({**state, "revision": revision})
    assert s.position.epoch == 0 and s.position.step == 0
    s.load_state_dict({**state, "revision": revision, "epoch": 1, "step": 0})
    assert s.epoch == 1 and len(list(s)) == s.plan(1).steps


def test_a_state_from_newer_rules_is_refused_mid_epoch_and_accepted_at_an_epoch_start():
    state = trained(sampler(), 3)
    newer = {**state, "revision": _core.PLAN_REVISION + 1}
    with pytest.raises(db.PlanError, match=rf"newer than this dflash_batch's \({_core.PLAN_REVISION}\).*Upgrade"):
        sampler().load_state_dict(newer)
    s = sampler()
    s.load_state_dict({**newer, "epoch": 1, "step": 0})
    assert s.epoch == 1 and s.position.step == 0


@pytest.mark.parametrize(
    ("settings", "world", "digest"),
    [
        ({"mode": "packed"}, 1, "c0ad3691be0f1c5a"),
        ({"mode": "packed"}, 8, "ea6463c607d18112"),
        ({"mode": "packed", "context_parallel": 2}, 8, "2ce6a7112291e6eb"),
        ({"mode": "packed", "cost": (1.0, 1 / 30720)}, 8, "8d0ed449d4cbb306"),
        ({"mode": "packed", "bucketed": True, "boundaries": 1}, 8, "4baa758b07eeece5"),
    ],
)
def test_packed_plans_are_pinned_to_the_rules(settings, world, digest):
    """A plan is a pure function of its settings and the rules: a change here without a new PLAN_REVISION (and
    `plans_changed_since` naming these settings) would resume old checkpoints into another plan, silently. The
    default packed rows are composed (rules 4): their rows are the attention price's, balanced by tokens."""
    plan = db.BucketSampler(LENGTHS, max_tokens=16384, world_size=world, rank=0, seed=1, accumulation=4, **settings)
    got = plan.plan(3)
    data = np.asarray(got.indices, dtype="<u4").tobytes() + np.asarray(got.offsets, dtype="<u4").tobytes()
    assert hashlib.sha256(data).hexdigest()[:16] == digest


def small(world: int = 1, **settings) -> db.BucketSampler:
    """Padded batches in steps of ``world × 4`` micro-batches."""
    return db.BucketSampler(LENGTHS, max_tokens=16384, world_size=world, rank=0, seed=1, accumulation=4, **settings)


def test_a_state_of_padded_batches_in_small_steps_from_before_rules_5_names_the_target_that_resumes_it():
    """Before rules 5 those batches aimed at 0.97 by default, and a state recorded it: the default now plans the
    epoch at 0.93, so the state is refused naming 0.97, and resumes exactly where that target is passed."""
    old = small(target_efficiency=0.97)  # what the default planned before rules 5, settings and fingerprint alike
    state = {**trained(old, 4), "revision": 4}
    default = small()
    assert default.state_dict()["settings"]["target_efficiency"] == 0.93
    with pytest.raises(db.PlanError, match=r"target_efficiency 0\.97 vs 0\.93 .*pass target_efficiency=0\.97"):
        default.load_state_dict(state)
    assert default.position.step == 0
    given = small(target_efficiency=0.97)
    given.load_state_dict(state)
    assert [b.tolist() for b in given] == [old.plan(0)[i].tolist() for i in range(4, old.plan(0).steps)]


def test_the_default_target_in_steps_of_2_to_7_micro_batches_and_beyond():
    """0.93 where a step holds 2 to 7 micro-batches (ranks × accumulation), 0.97 at 1 and from 8; a target given
    is kept; packed rows and an attention price keep theirs."""
    target = lambda s: s.state_dict()["settings"]["target_efficiency"]  # noqa: E731
    assert [target(small(world)) for world in (1, 2, 4)] == [0.93, 0.97, 0.97]
    one = lambda **kw: db.BucketSampler(LENGTHS, max_tokens=16384, world_size=1, rank=0, **kw)  # noqa: E731
    assert [target(one(accumulation=a)) for a in (1, 2, 7, 8)] == [0.97, 0.93, 0.93, 0.97]
    assert target(small(target_efficiency=0.97)) == 0.97
    assert target(small(mode="packed", bucketed=True)) == 0.98
    assert target(small(cost=(1.0, 1 / 30720))) == 0.982
    stats = small().plan(0).stats()
    assert 0.925 <= stats["efficiency"] < 0.94, stats["efficiency"]


@pytest.mark.parametrize(
    ("world", "accumulation", "digest"),
    [(1, 4, "aa7953cf334fa1c7"), (2, 2, "d37e54586b9d9772"), (8, 4, "4792c5079955ba29"), (1, 1, "ee227409d9f1e294")],
)
def test_padded_default_plans_are_pinned_to_the_rules(world, accumulation, digest):
    """The default padded plan in small steps (rules 5) and in the steps it did not change: a change without a
    new PLAN_REVISION would resume old checkpoints into another plan, silently."""
    s = db.BucketSampler(LENGTHS, max_tokens=16384, world_size=world, rank=0, seed=1, accumulation=accumulation)
    got = s.plan(3)
    data = np.asarray(got.indices, dtype="<u4").tobytes() + np.asarray(got.offsets, dtype="<u4").tobytes()
    assert hashlib.sha256(data).hexdigest()[:16] == digest

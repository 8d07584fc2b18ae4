"""Every planning setting is checked once, by ``_core.Config`` (issue 30): the sampler holds one, pickles
it as its keyword arguments, records its ``settings()`` in checkpoints, and a bad value of any setting is a
``TypeError`` (wrong type) or a ``PlanError`` of kind ``invalid_setting`` naming it (wrong value) — the
same wherever the sampler is built."""

from __future__ import annotations

import json
import pickle

import dflash_batch as db
import numpy as np
import pytest
from dflash_batch import _core
from hypothesis import given, settings
from hypothesis import strategies as st

# The keys a checkpoint's "settings" have always had (checkpoints written before this change compare
# against them, so they must not change).
CHECKPOINT_KEYS = [
    "batch_size", "max_tokens", "boundaries", "seed", "shuffle", "world_size", "drop_last", "skip_oversize",
    "pad_to_multiple_of", "accumulation", "target_efficiency", "order", "cost", "balance_tolerance", "mode",
    "bucketed", "trim_steps", "truncate",
]  # fmt: skip


def test_settings_are_the_plain_values_checkpoints_have_always_recorded():
    config = _core.Config(
        max_tokens=4096, boundaries=(0, 100, np.int64(5000)), seed=np.uint64(7), shuffle=np.bool_(True),
        cost=[1, 0.5], accumulation=4, world_size=8, mode="packed", oversize="truncate", threads=1,
    )  # fmt: skip
    assert config.settings() == {
        "batch_size": None, "max_tokens": 4096, "boundaries": [0, 100, 5000], "seed": 7, "shuffle": True,
        "world_size": 8, "drop_last": False, "skip_oversize": False, "pad_to_multiple_of": 1, "accumulation": 4,
        "target_efficiency": 0.98, "order": "stratified", "cost": [1.0, 0.5], "balance_tolerance": None,
        "mode": "packed", "bucketed": False, "trim_steps": False, "truncate": True,
    }  # fmt: skip
    assert list(config.settings()) == CHECKPOINT_KEYS
    assert json.loads(json.dumps(config.settings())) == config.settings()
    auto = _core.Config(batch_size=4).settings()
    assert (auto["boundaries"], auto["cost"], auto["accumulation"], auto["skip_oversize"]) == (None, "tokens", 1, False)


def test_the_sampler_records_what_its_config_says():
    sampler = db.BucketSampler(db.seed_workload(2000), max_tokens=8192, oversize="skip", cost=(1, 1e-4))
    state = sampler.state_dict()
    assert state["settings"] == {k: v for k, v in sampler.schedule.config.settings().items() if k != "world_size"}
    assert state["settings"]["skip_oversize"] is True and state["settings"]["cost"] == [1.0, 1e-4]


def test_a_config_pickles_as_its_keyword_arguments_and_replace_checks_again():
    config = _core.Config(max_tokens=512, boundaries=3, cost=(1, 0.25), balance_tolerance=0.1, threads=2)
    copy = pickle.loads(pickle.dumps(config))
    assert copy.settings() == config.settings() and copy.get("threads") == 2
    changed = config.replace(accumulation=4)
    assert (changed.accumulation, config.accumulation) == (4, 1)
    with pytest.raises(db.PlanError) as caught:
        config.replace(accumulation=0)
    assert (caught.value.kind, caught.value.setting) == ("invalid_setting", "accumulation")
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'"):
        _core.Config(batchsize=4)
    with pytest.raises(db.PlanError, match="'threds' is not a setting"):
        config.get("threds")


def test_properties_read_the_core_config():
    config = _core.Config(max_tokens=1024, cost=(2, 0.5), oversize="skip", mode="packed", world_size=3, seed=9)
    assert (config.max_tokens, config.mode, config.oversize, config.world_size, config.seed) == (
        1024, "packed", "skip", 3, 9,
    )  # fmt: skip
    assert config.price == (2.0, 0.5) and _core.Config(batch_size=2).price == (1.0, 0.0)
    assert _core.Config(batch_size=2).max_tokens is None


# One wrong type and one wrong value per setting: the type is a TypeError naming the setting, the value a
# PlanError of kind invalid_setting with `setting` set (the core's range checks included).
WRONG_TYPES = {
    "batch_size": 2.5, "max_tokens": "4096", "boundaries": 2.0, "seed": None, "shuffle": 1, "world_size": "8",
    "drop_last": None, "oversize": 3, "pad_to_multiple_of": 8.0, "threads": 1.0, "accumulation": True,
    "target_efficiency": "high", "order": None, "cost": 5, "balance_tolerance": "0.1", "mode": None,
    "bucketed": "yes", "trim_steps": 0,
}  # fmt: skip
WRONG_VALUES = {
    "batch_size": 0, "max_tokens": 2**63, "boundaries": "optimal", "seed": -1, "world_size": 0,
    "oversize": "clip", "pad_to_multiple_of": 2**32, "threads": 0, "accumulation": 0,
    "target_efficiency": 1.5, "order": "sorted", "cost": "flops", "balance_tolerance": -1.0, "mode": "dense",
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(WRONG_TYPES))
def test_a_wrong_type_is_a_type_error_naming_the_setting(name):
    base = {"max_tokens": 64} if name not in ("max_tokens", "batch_size") else {}
    with pytest.raises(TypeError, match=name):
        db.BucketSampler([3, 4, 5], **{**base, name: WRONG_TYPES[name]})


@pytest.mark.parametrize("name", sorted(WRONG_VALUES))
def test_a_wrong_value_is_an_invalid_setting_naming_it(name):
    base = {"max_tokens": 64} if name not in ("max_tokens", "batch_size") else {}
    with pytest.raises(db.PlanError) as caught:
        db.BucketSampler([3, 4, 5], **{**base, name: WRONG_VALUES[name]})
    assert caught.value.setting == name, (name, caught.value.kind, str(caught.value))
    assert caught.value.kind in ("invalid_setting", "invalid_ratio", "invalid_cost", "invalid_bucket_count"), name


def test_rules_between_settings_name_the_setting_at_fault():
    for kwargs, setting in [
        ({"max_tokens": 64, "oversize": "truncate"}, "oversize"),
        ({"max_tokens": 64, "trim_steps": True, "mode": "packed"}, "trim_steps"),
        ({"batch_size": 4, "mode": "packed"}, "mode"),
        ({"max_tokens": 64, "bucketed": True}, "bucketed"),
    ]:
        with pytest.raises(db.PlanError) as caught:
            db.BucketSampler([3, 4, 5], **kwargs)
        assert caught.value.setting == setting, (kwargs, str(caught.value))


SETTING_VALUES = {
    "batch_size": st.one_of(st.none(), st.integers(-3, 9), st.just(2**70), st.floats(0, 4)),
    "max_tokens": st.one_of(st.none(), st.integers(-5, 300), st.sampled_from([2**32, 2**64, "64"])),
    "boundaries": st.one_of(
        st.sampled_from(["auto", "x", None, True, 1.5]), st.integers(-2, 70), st.lists(st.integers(-2, 400), max_size=5)
    ),
    "seed": st.one_of(st.integers(-2, 2**64 + 1), st.none(), st.floats(0, 1)),
    "shuffle": st.one_of(st.booleans(), st.integers(0, 1), st.none()),
    "oversize": st.sampled_from(["error", "skip", "truncate", "clip", None, 1]),
    "pad_to_multiple_of": st.one_of(st.integers(-1, 70), st.just(2**32), st.none()),
    "accumulation": st.one_of(st.none(), st.integers(-1, 9), st.just(2**33)),
    "target_efficiency": st.one_of(st.floats(allow_nan=True), st.integers(-1, 2), st.none()),
    "order": st.sampled_from(["stratified", "random", "", None]),
    "cost": st.one_of(
        st.sampled_from(["tokens", "x", None, (1,), (1, 2, 3)]),
        st.tuples(st.floats(allow_nan=True), st.floats(allow_nan=True)),
        st.tuples(st.integers(-1, 2), st.sampled_from([0, 0.5, "b", None])),
    ),
    "balance_tolerance": st.one_of(st.none(), st.floats(allow_nan=True), st.sampled_from(["0.1", True])),
    "mode": st.sampled_from(["padded", "packed", "ragged", None]),
    "bucketed": st.one_of(st.booleans(), st.none()),
    "trim_steps": st.one_of(st.booleans(), st.none()),
}


@settings(max_examples=150, deadline=None)
@given(st.fixed_dictionaries({}, optional=SETTING_VALUES))
def test_any_settings_build_or_raise_a_documented_error(kwargs):
    """Hypothesis over every setting at once: a sampler, or a TypeError, or a PlanError with a kind, and
    its config, when built, is the same after a pickle."""
    try:
        sampler = db.BucketSampler(np.array([3, 40, 9, 200, 7, 64] * 5), **kwargs)
    except TypeError:
        return
    except db.PlanError as error:
        assert error.kind not in ("error", "plan"), (kwargs, str(error))
        return
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy.schedule.config.settings() == sampler.schedule.config.settings()
    assert copy.schedule.fingerprint == sampler.schedule.fingerprint


def test_truncation_in_the_core_keeps_the_fingerprints_checkpoints_hold_and_pickles():
    """Before ``oversize="truncate"`` joined the core, the sampler cut the pieces itself and planned them with
    ``oversize="error"``: checkpoints hold that fingerprint, so the core's must equal it."""
    lengths = np.array([50, 300, 7, 129, 64, 1000, 12] * 20)
    sampler = db.BucketSampler(lengths, max_tokens=64, mode="packed", oversize="truncate", seed=3)
    planned = sampler.schedule.lengths()
    before = db.BucketSampler(planned, max_tokens=64, mode="packed", seed=3)
    assert sampler.schedule.fingerprint == before.schedule.fingerprint
    assert np.array_equal(sampler.plan(2).indices, before.plan(2).indices)
    assert (sampler.num_samples, sampler.truncated, len(planned)) == (140, 60, 140 + 20 * (4 + 2 + 15))
    assert np.array_equal(sampler.schedule.dataset_lengths(), lengths)
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy.schedule.fingerprint == sampler.schedule.fingerprint and copy.truncated == sampler.truncated
    batch = sampler.plan(0)[0]
    assert all(np.array_equal(a, b) for a, b in zip(copy.pieces(batch), sampler.pieces(batch), strict=True))


ATTENTION = (1.0, 1 / 30720)


def test_the_default_target_efficiency_follows_the_price():
    lengths = db.seed_workload(20_000, seed=0)
    priced = db.BucketSampler(lengths, max_tokens=16384, cost=ATTENTION)
    explicit = db.BucketSampler(lengths, max_tokens=16384, cost=ATTENTION, target_efficiency=0.982)
    assert priced.schedule.fingerprint == explicit.schedule.fingerprint
    assert np.array_equal(priced.plan(0).indices, explicit.plan(0).indices)
    assert priced.state_dict()["settings"]["target_efficiency"] == 0.982
    at_098 = db.BucketSampler(lengths, max_tokens=16384, cost=ATTENTION, target_efficiency=0.98)
    assert at_098.schedule.fingerprint != priced.schedule.fingerprint
    assert len(priced.schedule.edges) > len(at_098.schedule.edges)
    # Only padded batches under a token budget priced with attention aim higher; other padded batches aim
    # for 0.97 (wider buckets: steps nearer a shuffle's, docs/convergence.md), packed rows for 0.98.
    for kwargs in ({}, {"cost": (2.0, 0.0)}):
        sampler = db.BucketSampler(lengths, max_tokens=16384, **kwargs)  # type: ignore[arg-type]
        assert sampler.state_dict()["settings"]["target_efficiency"] == 0.97, kwargs
    rows = db.BucketSampler(lengths, batch_size=8, cost=ATTENTION)
    assert rows.state_dict()["settings"]["target_efficiency"] == 0.97
    for kwargs in ({"cost": ATTENTION, "bucketed": True}, {"bucketed": False}):
        packed = db.BucketSampler(lengths, max_tokens=16384, mode="packed", **kwargs)  # type: ignore[arg-type]
        assert packed.state_dict()["settings"]["target_efficiency"] == 0.98, kwargs


def test_a_default_target_is_chosen_again_for_a_replaced_price_and_a_pickle():
    config = _core.Config(max_tokens=16384, cost=ATTENTION)
    assert config.get("target_efficiency") is None and config.settings()["target_efficiency"] == 0.982
    assert config.replace(cost="tokens").settings()["target_efficiency"] == 0.97
    assert config.replace(mode="packed").settings()["target_efficiency"] == 0.98
    assert pickle.loads(pickle.dumps(config)).settings()["target_efficiency"] == 0.982
    pinned = _core.Config(max_tokens=16384, cost=ATTENTION, target_efficiency=0.98)
    assert pinned.replace(cost="tokens").settings()["target_efficiency"] == 0.98
    assert _core.Config(max_tokens=16384, target_efficiency=None).settings()["target_efficiency"] == 0.97


def test_a_run_planned_at_the_old_default_resumes_only_when_told_its_target():
    lengths = db.seed_workload(20_000, seed=0)
    old = db.BucketSampler(lengths, max_tokens=16384, cost=ATTENTION, target_efficiency=0.98, world_size=2, rank=0)
    batches = iter(old)
    trained = [next(batches) for _ in range(5)]
    state = old.state_dict()
    upgraded = db.BucketSampler(lengths, max_tokens=16384, cost=ATTENTION, world_size=2, rank=0)
    with pytest.raises(db.PlanError, match=r"target_efficiency 0\.98 vs 0\.982 .*pass target_efficiency=0\.98"):
        upgraded.load_state_dict(state)
    told = db.BucketSampler(lengths, max_tokens=16384, cost=ATTENTION, target_efficiency=0.98, world_size=2, rank=0)
    told.load_state_dict(state)
    assert [list(b) for b in told] == [list(b) for b in batches]
    assert len(trained) == 5


def test_a_padded_run_planned_before_the_default_became_0_97_resumes_only_when_told_its_target():
    lengths = db.seed_workload(20_000, seed=0)
    old = db.BucketSampler(lengths, max_tokens=16384, target_efficiency=0.98, accumulation=4, world_size=2, rank=1)
    batches = iter(old)
    [next(batches) for _ in range(7)]
    state = old.state_dict()
    upgraded = db.BucketSampler(lengths, max_tokens=16384, accumulation=4, world_size=2, rank=1)
    assert len(upgraded.schedule.edges) < len(old.schedule.edges)  # wider buckets
    with pytest.raises(db.PlanError, match=r"target_efficiency 0\.98 vs 0\.97 .*pass target_efficiency=0\.98"):
        upgraded.load_state_dict(state)
    told = db.BucketSampler(lengths, max_tokens=16384, target_efficiency=0.98, accumulation=4, world_size=2, rank=1)
    told.load_state_dict(state)
    assert [list(b) for b in told] == [list(b) for b in batches]

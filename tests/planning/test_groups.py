"""The planning settings in typed groups (issue 60): ``db.Padded`` / ``db.Packed``, ``db.Balance``, ``db.World``
are the declared settings (``_core.SETTINGS``, each with its group) and nothing else; a sampler built with
groups is the sampler built with the same flat keywords — the same ``Config``, the same plans — and the rules
a type can hold are fields one group has and the other has not, refused as the group is written."""

from __future__ import annotations

import dataclasses
import pickle

import dflash_batch as db
import numpy as np
import pytest
from dflash_batch import _core
from dflash_batch.planning import groups, settings
from hypothesis import given
from hypothesis import settings as runs
from hypothesis import strategies as st

LENGTHS = np.random.default_rng(5).integers(1, 900, 600)
GROUPS = {"padded": db.Padded, "packed": db.Packed, "balance": db.Balance, "world": db.World}


def fields_of(group: type) -> set[str]:
    return {f.name for f in dataclasses.fields(group)}


def test_the_groups_hold_exactly_the_declared_settings_of_their_group():
    for kind, group in GROUPS.items():
        held = {s["field"] for s in settings.SETTINGS if s["group"] in (kind, "batching")}
        if kind in ("balance", "world"):
            held = {s["field"] for s in settings.SETTINGS if s["group"] == kind}
        assert fields_of(group) == held, kind
    grouped = {s["name"] for s in settings.SETTINGS if s["group"] not in ("own", "mode")}
    flat = {groups._setting(group, field) for group in GROUPS.values() for field in fields_of(group)}
    assert flat == grouped


def test_a_group_has_each_fields_declared_default():
    for group in GROUPS.values():
        for f in dataclasses.fields(group):
            if f.default is not dataclasses.MISSING:
                assert f.default == settings.default(groups._setting(group, f.name)), (group, f.name)
    assert dataclasses.fields(db.Packed)[0].default is dataclasses.MISSING  # the row capacity is required


def same(a: db.BucketSampler, b: db.BucketSampler) -> None:
    assert a.schedule.config.settings() == b.schedule.config.settings()
    assert a.accumulation_given == b.accumulation_given
    assert a.schedule.fingerprint == b.schedule.fingerprint
    for epoch in (0, 1):
        pa, pb = a.plan(epoch), b.plan(epoch)
        assert np.array_equal(pa.indices, pb.indices) and np.array_equal(pa.offsets, pb.offsets)


def test_groups_are_the_flat_keywords():
    same(
        db.BucketSampler(
            LENGTHS, batching=db.Packed(1024, bucketed=True, pad_to_multiple_of=8), seed=4,
            balance=db.Balance(accumulation=2, rank_cost=(1.0, 0.001)), world=db.World(size=2, drop_last=True), rank=1,
        ),
        db.BucketSampler(
            LENGTHS, mode="packed", max_tokens=1024, bucketed=True, pad_to_multiple_of=8, seed=4, accumulation=2,
            rank_cost=(1.0, 0.001), world_size=2, drop_last=True, rank=1,
        ),
    )  # fmt: skip
    same(
        db.BucketSampler(LENGTHS, batching=db.Padded(batch_size=8, oversize="skip"), balance=db.Balance(tolerance=0.1)),
        db.BucketSampler(LENGTHS, batch_size=8, oversize="skip", balance_tolerance=0.1),
    )
    same(
        db.BucketSampler(LENGTHS, batching=db.Padded(max_tokens=2048, trim_steps=True), world=db.World(size=4), rank=3),
        db.BucketSampler(LENGTHS, max_tokens=2048, trim_steps=True, world_size=4, rank=3),
    )


@st.composite
def grouped_settings(draw: st.DrawFn) -> dict:
    packed = draw(st.booleans())
    common = {"max_tokens": draw(st.sampled_from([1024, 2048])), "pad_to_multiple_of": draw(st.sampled_from([1, 8]))}
    if packed:
        batching = db.Packed(**common, bucketed=draw(st.booleans()), context_parallel=draw(st.sampled_from([1, 2])))
    elif draw(st.booleans()):
        batching = db.Padded(batch_size=draw(st.integers(1, 16)), pad_to_multiple_of=common["pad_to_multiple_of"])
    else:
        batching = db.Padded(**common, trim_steps=draw(st.booleans()))
    balance = draw(
        st.none()
        | st.builds(
            db.Balance,
            accumulation=st.none() | st.integers(1, 4),
            tolerance=st.none() | st.sampled_from([0.05, 1.0]),
            rank_cost=st.none() | st.sampled_from([(1.0, 0.0), (1.0, 0.002)]),
        )
    )
    world = draw(st.none() | st.builds(db.World, size=st.sampled_from([None, 1, 2, 4]), drop_last=st.booleans()))
    return {"batching": batching, "balance": balance, "world": world}


def flat_of(grouped: dict) -> dict:
    """The flat keywords a user would write for ``grouped``, by hand (not through ``groups.flatten``)."""
    names = {"tolerance": "balance_tolerance", "size": "world_size"}
    flat: dict = {}
    for group in grouped.values():
        if group is not None:
            flat.update({names.get(f.name, f.name): getattr(group, f.name) for f in dataclasses.fields(group)})
    flat["mode"] = "packed" if isinstance(grouped["batching"], db.Packed) else "padded"
    return flat


def built(**kwargs):
    """The sampler, or the type and message of the error building it raised."""
    try:
        return db.BucketSampler(LENGTHS, rank=0, **kwargs)
    except (db.PlanError, ValueError, TypeError) as error:
        return type(error), str(error)


def every_setting(config) -> dict:
    return {name: config.get(name) for name in settings.names()}


@runs(max_examples=60, deadline=None)
@given(grouped_settings())
def test_any_groups_build_what_their_flat_keywords_build(grouped):
    with_groups, flat = built(**grouped), built(**flat_of(grouped))
    if isinstance(flat, tuple):
        assert with_groups == flat  # the same refusal, in the same words
    else:
        same(with_groups, flat)
        # and read back, the groups rebuild the same configuration
        back = groups.of(flat.schedule.config)
        assert _core.Config(**groups.flatten(every_setting(flat.schedule.config), **back)).settings() == (
            flat.schedule.config.settings()
        )


def test_a_setting_given_both_ways_with_two_values_is_a_type_error():
    with pytest.raises(TypeError, match=r"world_size=4 and world=World\(size=2.*both set world_size"):
        db.BucketSampler(LENGTHS, max_tokens=1024, world_size=4, world=db.World(size=2), rank=0)
    with pytest.raises(TypeError, match=r"mode='packed' and batching=Padded.*both set mode"):
        db.BucketSampler(LENGTHS, mode="packed", batching=db.Padded(max_tokens=1024))
    with pytest.raises(TypeError, match=r"drop_last=1 and world=World.*both set drop_last"):
        db.BucketSampler(LENGTHS, max_tokens=1024, drop_last=1, world=db.World(drop_last=True))


def test_a_setting_given_both_ways_alike_or_left_at_its_default_in_one_is_taken():
    same(
        db.BucketSampler(LENGTHS, max_tokens=1024, drop_last=np.True_, world=db.World(size=2, drop_last=True), rank=0),
        db.BucketSampler(LENGTHS, max_tokens=1024, drop_last=True, world_size=2, rank=0),
    )
    same(
        db.BucketSampler(LENGTHS, max_tokens=1024, world_size=2, world=db.World(size=2), rank=0, accumulation=3),
        db.BucketSampler(LENGTHS, world=db.World(size=2), rank=0, batching=db.Padded(max_tokens=1024),
                         balance=db.Balance(tolerance=None), accumulation=3),
    )  # fmt: skip


def test_a_group_of_the_wrong_kind_is_a_type_error():
    with pytest.raises(TypeError, match=r"balance= takes db\.Balance, got World"):
        db.BucketSampler(LENGTHS, max_tokens=1024, balance=db.World(size=2))
    with pytest.raises(TypeError, match=r"batching= takes db\.Padded or db\.Packed, got dict"):
        db.BucketSampler(LENGTHS, batching={"max_tokens": 1024})


@pytest.mark.parametrize(
    ("group", "kwargs"),
    [
        (db.Packed, {"max_tokens": 1024, "trim_steps": True}),
        (db.Packed, {"max_tokens": 1024, "batch_size": 8}),
        (db.Padded, {"max_tokens": 1024, "bucketed": True}),
        (db.Padded, {"max_tokens": 1024, "context_parallel": 2}),
        (db.Balance, {"world_size": 2}),
        (db.World, {"accumulation": 2}),
    ],
)
def test_a_rule_a_type_holds_is_refused_as_the_group_is_written(group, kwargs):
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        group(**kwargs)


def test_packed_needs_its_capacity_and_groups_are_frozen():
    with pytest.raises(TypeError, match="max_tokens"):
        db.Packed()  # type: ignore[call-arg]
    with pytest.raises(dataclasses.FrozenInstanceError):
        db.Packed(1024).max_tokens = 2048  # type: ignore[misc]


def test_a_sampler_built_with_groups_pickles_as_its_settings():
    sampler = db.BucketSampler(LENGTHS, batching=db.Packed(1024, bucketed=True), world=db.World(size=2), rank=1)
    same(pickle.loads(pickle.dumps(sampler)), sampler)


@pytest.mark.slow
def test_a_type_checker_refuses_what_the_types_rule_out(tmp_path):
    pytest.importorskip("mypy")
    import subprocess
    import sys

    script = tmp_path / "user.py"
    script.write_text(
        "import dflash_batch as db\n"
        "db.Packed(4096, trim_steps=True)\n"
        "db.Padded(max_tokens=4096, bucketed=True)\n"
        "db.BucketSampler([1, 2], batching=db.Balance())\n"
        "db.Packed()\n"
        "db.BucketSampler([1, 2], batching=db.Packed(4096, context_parallel=2), world=db.World(size=2))\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(script)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    errors = [line.split(": error: ")[0].rsplit(":", 1)[1] for line in run.stdout.splitlines() if ": error: " in line]
    assert errors == ["2", "3", "4", "5"], run.stdout

"""``trim_steps=True`` (forming after ordering, ``form/trim.rs``) through the public sampler: every sample
once and within budget, ranks waiting less than without it, the same steps every epoch, exact resume,
the settings it refuses, and thread independence."""

from __future__ import annotations

import pickle
import re

import dflash_batch as db
import numpy as np
import pytest
from dflash_batch.tools import metrics
from hypothesis import example, given, settings
from hypothesis import strategies as st

LENGTHS = db.seed_workload(120_000, seed=11)
BUDGET = 16384
ATTENTION = (1.0, 1.0 / 30720)


def sampler(lengths=LENGTHS, **kwargs) -> db.BucketSampler:
    kwargs = {"max_tokens": BUDGET, "world_size": 8, "rank": 0, "accumulation": 1, **kwargs}
    return db.BucketSampler(lengths, **kwargs)


def check(lengths: np.ndarray, plan: db.Plan, cost=(1.0, 0.0)) -> None:
    assert np.array_equal(np.sort(plan.indices), np.arange(len(lengths))), "a sample lost or repeated"
    offsets = plan.offsets.astype(np.int64)
    longest = np.maximum.reduceat(lengths[plan.indices], offsets[:-1]).astype(np.float64)
    priced = np.diff(offsets) * (cost[0] * longest + cost[1] * longest * longest)
    assert np.all(priced <= BUDGET * (1 + 1e-9)), "a batch over budget"


def sync(lengths: np.ndarray, plan: db.Plan, accumulation: int, cost=(1.0, 0.0)) -> tuple[float, float]:
    return metrics.sync_efficiency(lengths, plan.indices, plan.offsets, 8, accumulation, cost=cost)


@pytest.mark.parametrize(("accumulation", "cost", "gain"), [(1, "tokens", 0.01), (4, ATTENTION, 0.004)])
def test_trimming_lowers_waiting_and_keeps_every_sample_within_budget(accumulation, cost, gain):
    price = (1.0, 0.0) if cost == "tokens" else cost
    plain = sampler(accumulation=accumulation, cost=cost)
    trimmed = sampler(accumulation=accumulation, cost=cost, trim_steps=True)
    for epoch in range(3):
        before, after = plain.plan(epoch), trimmed.plan(epoch)
        check(LENGTHS, after, price)
        assert sync(LENGTHS, after, accumulation, price)[0] >= sync(LENGTHS, before, accumulation, price)[0] + gain
        # The rows trimmed make extra steps: a few percent more, the same count every epoch.
        assert 1.0 < len(after) / len(before) < 1.1
        assert after.steps == len(trimmed)
        assert after.stats()["efficiency"] > 0.97


def test_each_rank_iterates_its_share_of_the_trimmed_plan():
    plan = sampler(world_size=4, trim_steps=True).plan(2)
    for rank in range(4):
        ranked = sampler(world_size=4, rank=rank, trim_steps=True)
        ranked.set_epoch(2)
        got = list(ranked)
        assert len(got) == plan.steps
        for step, batch in enumerate(got):
            assert np.array_equal(batch, plan[step * 4 + rank])


def test_a_resumed_trimmed_epoch_continues_exactly():
    first = sampler(trim_steps=True, rank=3)
    first.set_epoch(1)
    whole = [b.tolist() for b in first]
    first.set_epoch(1)
    it = iter(first)
    seen = [next(it).tolist() for _ in range(37)]
    state = first.state_dict()
    resumed = sampler(trim_steps=True, rank=3)
    resumed.load_state_dict(state)
    assert seen + [b.tolist() for b in resumed] == whole


def test_a_checkpoint_without_trimming_is_refused_by_a_trimming_sampler():
    state = sampler().state_dict()
    with pytest.raises(db.PlanError):
        sampler(trim_steps=True).load_state_dict(state)


def test_pickling_keeps_trimming():
    trimmed = sampler(lengths=LENGTHS[:20_000], trim_steps=True)
    again = pickle.loads(pickle.dumps(trimmed))
    assert np.array_equal(again.plan(4).indices, trimmed.plan(4).indices)
    assert len(again.plan(4)) != len(sampler(lengths=LENGTHS[:20_000]).plan(4))


@pytest.mark.parametrize(
    ("kwargs", "fix"),
    [
        ({"batch_size": 8, "max_tokens": None}, "needs max_tokens"),
        ({"mode": "packed"}, "mode='packed'"),
        ({"balance_tolerance": 0.1}, "balance_tolerance=None"),
    ],
)
def test_settings_trimming_cannot_work_with_are_refused(kwargs, fix):
    with pytest.raises(db.PlanError, match=r"^trim_steps=True ") as error:
        sampler(lengths=[5, 6, 7, 8], trim_steps=True, **kwargs)
    assert fix in str(error.value) and isinstance(error.value, ValueError)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_trim_steps_must_be_a_bool(bad):
    with pytest.raises(TypeError, match="trim_steps"):
        sampler(lengths=[5, 6, 7], trim_steps=bad)


@settings(max_examples=40, deadline=None)
# A plan of mostly 1-token samples whose trimmed epoch calibrates to fewer steps (4) than the untrimmed
# one (5): valid, every sample once, the same steps every epoch (found by hypothesis, 2026-12-02).
@example(
    lengths=[1001, 1, 1, 1, 1501, 1, 1501, 1, 1, 1, 1, 751, 1, 1, 431, 2],
    world=2,
    accumulation=3,
    budget=3000,
    seed=1499911,
    attention=False,
)
@example(lengths=[1, 1, 1001, 1, 1001, 1501, 1, 1, 1], world=5, accumulation=1, budget=3000, seed=0, attention=False)
# 5 samples on 2 ranks: the trimmed draws form 5 batches, a count rounded up to 6 (found by hypothesis in
# the fast lane, 2026-12-04: the refusal is the limitation below, past the bound it used to assume).
@example(lengths=[1, 1, 1001, 1501, 1], world=2, accumulation=1, budget=3000, seed=106325703, attention=False)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=600),
    world=st.integers(1, 9),
    accumulation=st.integers(1, 4),
    budget=st.integers(3000, 20_000),
    seed=st.integers(0, 2**64 - 1),
    attention=st.booleans(),
)
def test_any_trimmed_plan_is_complete_and_thread_independent(lengths, world, accumulation, budget, seed, attention):
    lengths = np.asarray(lengths)
    kwargs = dict(max_tokens=budget, world_size=world, rank=0, accumulation=accumulation, seed=seed, oversize="skip")
    if attention:
        kwargs["cost"] = (1.0, 1e-4)
    try:
        plain = db.BucketSampler(lengths, **kwargs).plan(1)
    except db.PlanError:  # too few samples for the ranks: trimming adds batches, never samples
        with pytest.raises(db.PlanError):
            db.BucketSampler(lengths, trim_steps=True, **kwargs).plan(1)
        return
    try:
        one = db.BucketSampler(lengths, threads=1, trim_steps=True, **kwargs).plan(1)
    except db.PlanError as e:
        # Known limitation (noted for the next work): trimmed steps may need more batches than there are
        # samples (their count, calibrated from trimmed draws, rounds up to a multiple of the ranks: 9
        # samples on 5 ranks, 5 on 2), and trimming then refuses, naming the fix, where the untrimmed
        # plan fits. Any other refusal is a failure.
        found = re.match(r"(\d+) sample\(s\) cannot give each of world_size .* the plan needs (\d+)", str(e))
        assert e.kind == "too_few_samples_for_ranks" and found, e
        assert int(found.group(2)) > int(found.group(1)), e
        return
    many = db.BucketSampler(lengths, threads=2, trim_steps=True, **kwargs).plan(1)
    assert np.array_equal(one.indices, many.indices) and np.array_equal(one.offsets, many.offsets)
    # The samples the untrimmed plan admits, each once.
    assert np.array_equal(np.sort(one.indices), np.sort(plain.indices))
    # Whole steps, the same count every epoch (trimming usually adds steps; its calibration may also
    # find fewer suffice), every batch within budget.
    assert len(one) % world == 0 and one.steps == db.BucketSampler(lengths, trim_steps=True, **kwargs).plan(2).steps
    sizes, longest = np.diff(one.offsets), [int(lengths[one[b]].max()) for b in range(len(one))]
    assert all(int(n) * m <= budget for n, m in zip(sizes, longest, strict=True)) or attention

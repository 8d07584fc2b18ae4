"""Mixing and balance figures of plan.stats() and plan.churn() against a numpy reference."""

from __future__ import annotations

import itertools

import dflash_batch as db
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def deciles(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(decile of every length value 0..max, share of tokens per decile): a length belongs to the decile
    where the middle of its token mass falls."""
    tokens_at = np.bincount(lengths, weights=lengths.astype(np.float64)).astype(np.int64)
    total = tokens_at.sum()
    below = np.concatenate([[0], np.cumsum(tokens_at)[:-1]])
    of = np.minimum((10 * (2 * below + tokens_at)) // (2 * total), 9)
    share = np.bincount(of, weights=tokens_at, minlength=10) / total
    return of, share


def window_tv(offsets, indices, lengths, window):
    figures = mixing(offsets, indices, lengths, window)
    return None if figures is None else figures["window_tv"]


def mixing(offsets, indices, lengths, window):
    """``window_tv`` and ``length_gap`` over all windows and over the last tenth of them (at least one)."""
    of, share = deciles(lengths)
    windows = (len(offsets) - 1) // window
    if windows == 0:
        return None
    epoch = lengths[indices[: offsets[windows * window]]].mean()
    distances, gaps = [], []
    for w in range(windows):
        rows = indices[offsets[w * window] : offsets[(w + 1) * window]]
        mass = np.bincount(of[lengths[rows]], weights=lengths[rows], minlength=10)
        distances.append(0.5 * np.abs(mass / mass.sum() - share).sum())
        gaps.append(abs(lengths[rows].mean() / epoch - 1))
    tail = windows - -(-windows // 10)
    return {
        "window_tv": float(np.mean(distances)), "window_tv_tail": float(np.mean(distances[tail:])),
        "length_gap": float(np.mean(gaps)), "length_gap_tail": float(np.mean(gaps[tail:])),
    }  # fmt: skip


def imbalance(offsets, indices, lengths, world, pad=1):
    costs = [
        len(b) * (-(-int(lengths[b].max()) // pad) * pad)
        for b in (indices[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1))
    ]
    ratios = sorted(max(c) / min(c) for c in (costs[s : s + world] for s in range(0, len(costs), world)))
    at = lambda q: ratios[min(max(int(np.ceil(q * len(ratios))), 1), len(ratios)) - 1]  # noqa: E731
    return at(0.5), at(0.99), ratios[-1]


def churn(a: db.Plan, b: db.Plan):
    together = lambda plan: {  # noqa: E731
        frozenset(p) for batch in plan for p in itertools.combinations(batch.tolist(), 2)
    }
    first, second = together(a), together(b)
    return len(first & second) / len(first) if first else None


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 400), min_size=20, max_size=400),
    world=st.integers(1, 4),
    accumulation=st.integers(1, 3),
    pad=st.sampled_from([1, 8]),
)
def test_stats_match_the_reference(lengths, world, accumulation, pad):
    lengths = np.array(lengths)
    sampler = db.BucketSampler(
        lengths, max_tokens=800, world_size=world, rank=0, accumulation=accumulation, pad_to_multiple_of=pad
    )
    try:
        plan = sampler.plan(3)
    except db.PlanError as err:  # a few single-row batches cannot be split for the ranks
        assert "cannot give each of world_size" in str(err)
        return
    stats = plan.stats()
    offsets, indices = plan.offsets.astype(np.int64), plan.indices
    expected = mixing(offsets, indices, lengths, accumulation * world)
    assert stats["window"] == accumulation * world
    for key in ("window_tv", "window_tv_tail", "length_gap", "length_gap_tail"):
        if expected is None:
            assert stats[key] is None
        else:
            assert stats[key] == pytest.approx(expected[key], abs=1e-9), key
    p50, p99, worst = imbalance(offsets, indices, lengths, world, pad)
    assert (stats["rank_imbalance_p50"], stats["rank_imbalance_p99"], stats["rank_imbalance_max"]) == pytest.approx(
        (p50, p99, worst)
    )
    other = sampler.plan(4)
    got, want = plan.churn(other), churn(plan, other)
    assert got == pytest.approx(want) if want is not None else got is None


def test_reference_reproduces_the_figures_of_the_issue():
    """The definition, on the seed workload with windows of 32 batches: a full shuffle in batches of 8
    gives ≈ 0.092, sorted batches ≈ 0.9 (../shared/CONTEXT.md and the quality issue)."""
    lengths = db.seed_workload(200_000)
    rng = np.random.default_rng(0)
    shuffled = rng.permutation(len(lengths)).astype(np.uint32)
    offsets = np.arange(0, len(lengths) + 1, 8)
    assert window_tv(offsets, shuffled, lengths, 32) == pytest.approx(0.092, abs=0.01)
    ordered = np.argsort(lengths, kind="stable").astype(np.uint32)
    assert window_tv(offsets, ordered, lengths, 32) > 0.85


def test_sorted_plans_mix_worst_and_same_epoch_churn_is_one():
    lengths = db.seed_workload(20_000)
    shuffled = db.BucketSampler(lengths, max_tokens=16384, world_size=8, rank=0, accumulation=4)
    ordered = db.BucketSampler(lengths, max_tokens=16384, world_size=8, rank=0, accumulation=4, shuffle=False)
    assert ordered.plan(0).stats()["window_tv"] > 0.8 > shuffled.plan(0).stats()["window_tv"]
    plan = shuffled.plan(0)
    assert plan.churn(plan) == 1.0
    assert plan.churn(shuffled.plan(1)) < 0.1  # 20K samples in ~47 buckets: pairs of short samples meet again


def test_churn_needs_plans_of_one_dataset():
    a = db.BucketSampler(np.full(10, 5), batch_size=2).plan(0)
    b = db.BucketSampler(np.full(12, 5), batch_size=2).plan(0)
    with pytest.raises(ValueError, match="different datasets"):
        a.churn(b)
    assert db.BucketSampler(np.full(10, 5), batch_size=1).plan(0).churn(a) is None  # no pairs at all


def test_accumulation_is_validated():
    with pytest.raises(ValueError, match="accumulation=0 is invalid"):
        db.BucketSampler(np.full(4, 5), batch_size=1, accumulation=0)


def test_metrics_of_any_csr_agree_with_plan_stats():
    from dflash_batch.tools import metrics

    lengths = db.seed_workload(30_000)
    sampler = db.BucketSampler(lengths, max_tokens=16384, world_size=4, rank=0, accumulation=2)
    plan, other = sampler.plan(0), sampler.plan(1)
    stats = plan.stats()
    assert metrics.window_tv(lengths, plan.indices, plan.offsets, 8) == pytest.approx(stats["window_tv"])
    mixed = metrics.mixing(lengths, plan.indices, plan.offsets, 8)
    assert mixed == pytest.approx(
        {k: stats[k] for k in ("window_tv", "window_tv_tail", "length_gap", "length_gap_tail")}
    )
    assert metrics.mixing(lengths, plan.indices, plan.offsets, len(plan) + 1) is None
    p50, p99, worst = metrics.rank_imbalance(lengths, plan.indices, plan.offsets, 4)
    assert (p50, p99, worst) == pytest.approx(
        (stats["rank_imbalance_p50"], stats["rank_imbalance_p99"], stats["rank_imbalance_max"])
    )
    assert metrics.churn(len(lengths), (plan.indices, plan.offsets), (other.indices, other.offsets)) == pytest.approx(
        plan.churn(other)
    )


def test_window_tv_of_lengths_near_the_u32_limit():
    """Two samples of ~2^32 tokens hold nearly all the mass, in deciles 2 and 7 (the middles of their
    token mass fall at ~25% and ~75%); the short ones are in decile 0. Deciles were a table over every
    length up to the longest: 36 GB here, an abort."""
    from dflash_batch.tools import metrics

    lengths = np.array([2**32 - 6, 3, 2**32 - 2_000_000, 7, 10**6], dtype=np.uint32)
    share = lengths.astype(np.float64) / lengths.astype(np.float64).sum()
    # Window 1 of batches {0, 1} and {2, 3, 4}: batch 1 holds deciles 7 and 0, batch 2 deciles 2 and 0.
    deciles = np.array([7, 0, 2, 0, 0])
    q, p1, p2 = np.zeros(10), np.zeros(10), np.zeros(10)
    np.add.at(q, deciles, share)
    np.add.at(p1, deciles[:2], share[:2] / share[:2].sum())
    np.add.at(p2, deciles[2:], share[2:] / share[2:].sum())
    expected = (0.5 * np.abs(p1 - q).sum() + 0.5 * np.abs(p2 - q).sum()) / 2
    got = metrics.window_tv(lengths, np.arange(5, dtype=np.uint32), np.array([0, 2, 5], dtype=np.uint64), 1)
    assert got == pytest.approx(expected)


def test_metrics_refuse_malformed_csr():
    from dflash_batch.tools import metrics

    lengths = np.array([5, 6, 7])
    with pytest.raises(ValueError, match="offsets must start at 0"):
        metrics.window_tv(lengths, [0, 1, 2], [0, 2, 1, 3], 1)
    with pytest.raises(ValueError, match="indices must be rows of lengths"):
        metrics.window_tv(lengths, [0, 1, 9], [0, 3], 1)
    with pytest.raises(ValueError, match="window must be"):
        metrics.window_tv(lengths, [0, 1, 2], [0, 3], 0)


def test_stratified_order_mixes_better_than_random_and_keeps_every_sample():
    lengths = db.seed_workload(200_000)
    figures = {}
    for order in ("stratified", "random"):
        sampler = db.BucketSampler(lengths, max_tokens=16384, world_size=8, rank=0, accumulation=4, order=order)
        plan = sampler.plan(2)
        assert np.array_equal(np.sort(plan.indices), np.arange(len(lengths)))
        figures[order] = plan.stats()
    assert figures["stratified"]["window_tv"] < 0.1 < figures["random"]["window_tv"]
    # The same batches are formed; only which tail batches are split for the ranks may differ.
    assert figures["stratified"]["efficiency"] == pytest.approx(figures["random"]["efficiency"], abs=1e-5)


def test_order_is_validated():
    message = r"order='sorted' is invalid; use one of 'stratified' \(the default\), 'random'"
    with pytest.raises(db.PlanError, match=message):
        db.BucketSampler(np.full(4, 5), batch_size=1, order="sorted")

"""The end-to-end figure (issue 31): the share of the GPUs' time that trains real tokens — every sample's own
``a·l + b·l²`` over ``world_size ×`` the time the ranks take, waiting for the slowest and padding included —
in ``plan.stats()`` and ``metrics.end_to_end``, against a numpy reference on small plans."""

from __future__ import annotations

import dflash_batch as db
import dflash_batch.tools.baselines
import dflash_batch.tools.metrics
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def reference(lengths, plan, world, accumulation, cost, capacity=None):
    """The definition, in numpy: per micro-batch and per optimizer step."""
    a, b = cost
    lengths = lengths.astype(np.float64)
    offsets = np.asarray(plan.offsets, dtype=np.int64)
    timed = []
    for i in range(len(offsets) - 1):
        rows = lengths[np.asarray(plan.indices)[offsets[i] : offsets[i + 1]]]
        if capacity is None:
            timed.append(len(rows) * (a * rows.max() + b * rows.max() ** 2))
        else:
            timed.append(a * capacity + b * (rows**2).sum())
    timed = np.array(timed).reshape(-1, world)
    useful = (a * lengths[plan.indices] + b * lengths[plan.indices] ** 2).sum()
    micro = useful / (world * timed.max(axis=1).sum())
    windows = [timed[s : s + accumulation].sum(axis=0).max() for s in range(0, len(timed), accumulation)]
    return micro, useful / (world * sum(windows))


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 900), min_size=40, max_size=400),
    world=st.sampled_from([1, 2, 3, 8]),
    accumulation=st.sampled_from([1, 2, 4]),
    packed=st.booleans(),
    cost=st.sampled_from([(1.0, 0.0), (1.0, 1 / 300), (0.5, 0.01)]),
    seed=st.integers(0, 5),
)
def test_stats_and_metrics_equal_the_definition(lengths, world, accumulation, packed, cost, seed):
    lengths = np.array(lengths)
    mode = {"mode": "packed"} if packed else {}
    sampler = db.BucketSampler(
        lengths,
        max_tokens=1024,
        world_size=world,
        rank=0,
        accumulation=accumulation,
        cost=cost,
        seed=seed,
        oversize="skip",
        **mode,
    )
    plan = sampler.plan(1)
    if plan.steps == 0:
        return
    capacity = 1024 if packed else None
    micro, step = reference(lengths, plan, world, accumulation, cost, capacity)
    stats = plan.stats()
    assert stats["end_to_end_efficiency"] == pytest.approx(micro, rel=1e-9)
    assert stats["end_to_end_efficiency_step"] == pytest.approx(step, rel=1e-9)
    scored = dflash_batch.tools.metrics.end_to_end(
        lengths, plan.indices, plan.offsets, world, accumulation, cost=cost, capacity=capacity
    )
    assert scored == pytest.approx((micro, step), rel=1e-9)
    # Balance × the useful share: never above either; at the token price, padded, it is sync × efficiency.
    assert micro <= stats["sync_efficiency"] + 1e-12
    if cost == (1.0, 0.0) and not packed:
        assert micro == pytest.approx(stats["sync_efficiency"] * stats["efficiency"], rel=1e-9)


def test_sorted_static_batches_score_about_their_padding_efficiency():
    lengths = db.seed_workload(20_000, seed=1)
    order = np.argsort(lengths, kind="stable")
    cut = dflash_batch.tools.baselines.cut(lengths, order, max_tokens=16384)
    end = dflash_batch.tools.metrics.end_to_end(lengths, *cut, 8, 4)
    efficiency = dflash_batch.tools.baselines.efficiency(lengths, *cut)
    # Neighbouring sorted batches cost nearly the same: the ranks barely wait.
    assert efficiency - 0.01 < end[0] <= efficiency and efficiency - 0.01 < end[1] <= efficiency


def test_a_packed_row_over_its_capacity_is_refused():
    lengths = np.array([10, 10, 10, 10])
    with pytest.raises(db.PlanError, match="more tokens than capacity"):
        dflash_batch.tools.metrics.end_to_end(lengths, np.arange(4), np.array([0, 3, 4]), 2, capacity=20)
    with pytest.raises(db.PlanError):
        dflash_batch.tools.metrics.end_to_end(lengths, np.arange(4), np.array([0, 2, 4]), 0)


def test_the_batch_rebalance_peer_is_what_each_rank_of_hf_iterates():
    """The comparison runs HF's assignment once for every rank; each rank's share must be exactly what its
    own ``BatchRebalanceSampler`` yields, or the peer's figures would describe another sampler."""
    trainer_utils = pytest.importorskip("transformers.trainer_pt_utils")
    if not hasattr(trainer_utils, "BatchRebalanceSampler"):
        pytest.skip("transformers without BatchRebalanceSampler")
    lengths = db.seed_workload(3000, seed=2) // 8 + 1
    world, accumulation = 4, 2
    order, offsets, _ = dflash_batch.tools.baselines.batch_rebalance(
        lengths, world_size=world, accumulation=accumulation, max_tokens=2048, coefficient=1e-4
    )
    batches = [order[offsets[i] : offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
    effective = max(1, round(2048 / float(lengths.mean()))) * world * accumulation
    for rank in (0, 3):
        theirs = trainer_utils.BatchRebalanceSampler(
            lengths.tolist(), effective, world, accumulation, seed=0, rank=rank
        )
        theirs.QUADRATIC_COST_COEF = 1e-4
        assert [list(b) for b in theirs] == batches[rank::world]
    # Every sample of the whole steps once (it drops the last partial step).
    assert len(set(order.tolist())) == len(order) == len(lengths) // effective * effective

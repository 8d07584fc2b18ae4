"""``db.split_step``: one step's sequences into every rank's micro-batches — every sequence once, the same count
on every rank, every micro-batch within the budget, the same split for the same arguments, loads near the best
assignment — and each bad input refused with its kind."""

from __future__ import annotations

import itertools

import dflash_batch as db
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ATTENTION = (1.0, 1.0 / (6 * 5120))


def tokens(lengths, batch, mode):
    values = [lengths[i] for i in batch]
    return sum(values) if mode == "packed" else len(values) * max(values)


def test_a_small_step_splits_as_worked_out():
    # Worked out in rust/core/src/online/tests.rs: re-formed under budget 8, [8] [5] [3 2] [2 2] over 2 ranks.
    lengths = [2, 8, 5, 2, 3, 2]
    split = db.split_step(lengths, world_size=2, max_tokens=10)
    assert split.micro_batches == 2 and len(split) == 2
    assert [[sorted((lengths[i] for i in b), reverse=True) for b in rank] for rank in split.ranks] == [
        [[8], [2, 2]],
        [[3, 2], [5]],
    ]
    assert split.loads == (12.0, 11.0) and split.imbalance == 12.0 / 11.5
    with pytest.raises(ValueError, match="read-only"):
        split[0][0][0] = 7  # a view of the split, not a copy to scribble on


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 4096), min_size=1, max_size=600),
    world=st.integers(1, 16),
    budget=st.integers(4096, 65536),
    mode=st.sampled_from(["padded", "packed"]),
    cost=st.sampled_from(["tokens", ATTENTION]),
    seed=st.integers(0, 2**64 - 1),
)
def test_every_sequence_once_equal_counts_within_budget_and_the_same_split_again(
    lengths, world, budget, mode, cost, seed
):
    kwargs = {"world_size": world, "max_tokens": budget, "mode": mode, "cost": cost, "seed": seed}
    try:
        split = db.split_step(lengths, **kwargs)
    except db.PlanError as error:
        # The sequences cannot give every rank as many micro-batches within the budget (too few of them, or
        # no equal count whose micro-batches fit): refused, never an empty or over-budget micro-batch.
        assert error.kind == "step_too_small" and "equal counts need" in str(error)
        return
    assert len(split) == world and {len(rank) for rank in split.ranks} == {split.micro_batches}
    seen = sorted(int(i) for rank in split.ranks for b in rank for i in b)
    assert seen == list(range(len(lengths)))
    assert all(len(b) and tokens(lengths, b, mode) <= budget for rank in split.ranks for b in rank)
    again = db.split_step(np.asarray(lengths, dtype=np.uint16 if max(lengths) < 65536 else np.int64), **kwargs)
    assert [[b.tolist() for b in r] for r in again.ranks] == [[b.tolist() for b in r] for r in split.ranks]


def best_max_load(costs, world):
    m = len(costs) // world
    best = float("inf")
    for who in itertools.product(range(world), repeat=len(costs)):
        if all(who.count(r) == m for r in range(world)):
            loads = [sum(c for c, w in zip(costs, who, strict=True) if w == r) for r in range(world)]
            best = min(best, max(loads))
    return best


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 100), min_size=4, max_size=8), world=st.sampled_from([2, 4]))
def test_the_loads_come_within_a_third_of_the_best_assignment_of_the_same_micro_batches(lengths, world):
    try:
        split = db.split_step(lengths, world_size=world, max_tokens=100)
    except db.PlanError:
        return
    costs = [len(b) * max(lengths[i] for i in b) for rank in split.ranks for b in rank]
    assert max(split.loads) <= best_max_load(costs, world) * 4 / 3 + 1e-9


@pytest.mark.parametrize(
    ("lengths", "kwargs", "error", "words"),
    [
        ([], {}, db.PlanError, "lengths is empty"),
        ([3, 0], {}, db.PlanError, "row 1"),
        ([3, 11], {}, db.PlanError, "sequence 1 has 11 tokens, more than max_tokens 10"),
        ([3, 3], {"world_size": 4}, db.PlanError, "each of 4 ranks the same number of micro-batches"),
        ([1, 2049, 2049], {"world_size": 2, "max_tokens": 4096}, db.PlanError, "they form 3, equal counts need 4"),
        ([3], {"world_size": 0}, db.PlanError, "world_size"),
        ([3], {"max_tokens": 0}, db.PlanError, "max_tokens"),
        ([3], {"cost": (-1.0, 0.0)}, db.PlanError, "cost"),
        ([3], {"mode": "ragged"}, ValueError, 'mode="ragged" is invalid'),
        ([3], {"world_size": 1.5}, TypeError, "world_size must be an int"),
        ([3], {"max_tokens": "10"}, TypeError, "max_tokens must be an int"),
        ([3], {"seed": -1}, db.PlanError, "seed"),
        ([-3], {}, db.PlanError, "row 0"),
        (["a"], {}, TypeError, "lengths must be"),
    ],
)
def test_each_bad_input_is_refused_naming_it(lengths, kwargs, error, words):
    kwargs = {"world_size": 1, "max_tokens": 10, **kwargs}
    with pytest.raises(error, match=words):
        db.split_step(lengths, **kwargs)


def test_a_sequence_over_the_budget_is_its_own_kind_naming_the_row():
    with pytest.raises(db.PlanError) as error:
        db.split_step([5, 9, 30], world_size=1, max_tokens=20)
    assert (error.value.kind, error.value.row) == ("sequence_over_budget", 2)

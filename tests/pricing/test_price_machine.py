"""The rank price is part of every epoch's plan key (issue 59): a hypothesis state machine over a 2-rank
sampler and a Loader over it, with prices set between and inside epochs (``price_from``, and a late refit's
``price_after``), checkpoints, loads, pickles and elastic resumes whose rest is carried into a re-priced
epoch, against a model of the position and of the prices by epoch. Every batch handed out is the plan of
its epoch under the price recorded for that epoch; every saved state resumes to exactly the rest of it.
"""

from __future__ import annotations

import os
import pickle
import warnings

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

pytest.importorskip("torch")

import dflash_batch as db
import numpy as np
from _position import STORE, rows

EXAMPLES = int(os.environ.get("DFLASH_PRICE_MACHINE_EXAMPLES", "60"))
WORLD, ACCUMULATION = 2, 2
PRICES = [(1.0, 1 / 64), (1.0, 1 / 4096), (0.0, 1.0), (1.0, 0.0)]


def make(world: int = WORLD, rank: int = 0, **kwargs) -> db.BucketSampler:
    return db.BucketSampler(
        STORE.lengths(), max_tokens=128, seed=3, world_size=world, rank=rank, accumulation=ACCUMULATION, **kwargs
    )


def price_at(prices: list[tuple[int, tuple[float, float]]], epoch: int) -> tuple[float, float] | None:
    chosen = None
    for first, price in prices:
        if first <= epoch:
            chosen = price
    return chosen


def expected(prices, epoch: int, start: int = 0) -> list[list[int]]:
    """Rank 0's batches of ``epoch`` from step ``start``, planned by a sampler built with that epoch's price."""
    price = price_at(prices, epoch)
    plan = (make() if price is None else make(rank_cost=price)).plan(epoch)
    return [sorted(len(STORE[int(i)]) for i in plan[s * WORLD]) for s in range(start, plan.steps)]


class PriceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sampler = make()
        self.loader = db.Loader(STORE, self.sampler, prefetch=1)
        self.epoch, self.step, self.resume = 0, 0, False
        self.prices: list[tuple[int, tuple[float, float]]] = []
        self.saved: list[tuple[dict, int, int, list]] = []
        self.open = None  # (iterator, next step)
        self.steps = len(self.sampler)

    def teardown(self) -> None:
        self.loader.close()

    def _begun(self) -> bool:
        return self.step > 0 or self.open is not None or self.resume

    def _close_open(self) -> None:
        if self.open is not None:
            self.open[0].close()
            self.open = None

    @rule(epoch=st.integers(0, 3))
    def set_epoch(self, epoch):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # discarding a pending resume warns (tests/planning/test_position.py)
            self.sampler.set_epoch(epoch)
        if epoch != self.epoch:
            if self.open is not None:
                with pytest.raises(RuntimeError, match="superseded"):
                    next(self.open[0])
                self.open = None
            self.epoch, self.step, self.resume = epoch, 0, False

    @rule(k=st.integers(0, 8), on=st.sampled_from(["sampler", "loader"]), keep=st.booleans())
    def iterate(self, k, on, keep):
        self._close_open()
        iterator = iter(self.sampler if on == "sampler" else self.loader)
        start = self.step if self.resume else 0
        got = []
        for _ in range(k):
            try:
                got.append(rows(next(iterator)))
            except StopIteration:
                break
        assert got == expected(self.prices, self.epoch, start)[:k], "a batch of another plan"
        if got or k > len(got):
            self.step, self.resume = start + len(got), False
        if keep and k > 0 and len(got) == k and start + k < self.steps:
            self.open = (iterator, start + k)
        else:
            iterator.close()

    @precondition(lambda self: self.open is not None)
    @rule()
    def continue_open(self):
        iterator, at = self.open
        assert rows(next(iterator)) == expected(self.prices, self.epoch)[at]
        self.step, self.resume = at + 1, False
        self.open = (iterator, at + 1) if at + 1 < self.steps else None

    @rule(ahead=st.integers(0, 2), price=st.sampled_from(PRICES))
    def price_from(self, ahead, price):
        """A price from an epoch on: refused (nothing changes) for an epoch already begun."""
        first = self.epoch + ahead
        if ahead == 0 and self._begun():
            event("price for a begun epoch: refused")
            with pytest.raises(db.PlanError, match="has begun"):
                self.sampler.position.price_from(first, price)
            return
        self.sampler.position.price_from(first, price)
        self.prices = [p for p in self.prices if p[0] < first] + [(first, price)]

    @rule(back=st.integers(0, 1), price=st.sampled_from(PRICES))
    def late_refit(self, back, price):
        """A StepTimer's fit of the records of epoch ``epoch - back``: from the first epoch not yet begun."""
        records = max(self.epoch - back, 0)
        first = self.sampler.position.price_after(records, price)
        assert first == max(records + 1, self.epoch + 1 if self._begun() else self.epoch)
        self.prices = [p for p in self.prices if p[0] < first] + [(first, price)]

    @rule(on=st.sampled_from(["sampler", "loader"]))
    def save(self, on):
        state = (self.sampler if on == "sampler" else self.loader).state_dict()
        assert (state["epoch"], state["step"]) == (self.epoch, self.step)
        self.saved.append((state, self.epoch, self.step, list(self.prices)))

    @precondition(lambda self: self.saved)
    @rule(data=st.data())
    def load(self, data):
        state, epoch, step, prices = data.draw(st.sampled_from(self.saved))
        self.sampler.load_state_dict(state)
        if self.open is not None:
            with pytest.raises(RuntimeError, match="superseded"):
                next(self.open[0])
            self.open = None
        self.epoch, self.step, self.resume, self.prices = epoch, step, True, list(prices)

    @precondition(lambda self: self.saved)
    @rule(data=st.data())
    def a_fresh_sampler_resumes_exactly_the_rest(self, data):
        state, epoch, step, prices = data.draw(st.sampled_from(self.saved))
        fresh = make()
        fresh.load_state_dict(state)
        assert [rows(b) for b in fresh] == expected(prices, epoch, step)
        for later in (epoch + 1, epoch + 2):
            fresh.set_epoch(later)
            assert [rows(b) for b in fresh] == expected(prices, later), "a later epoch planned by another price"

    @rule()
    def pickle_round_trip(self):
        copy = pickle.loads(pickle.dumps(self.sampler))
        assert copy.state_dict() == self.sampler.state_dict()
        assert copy.position.prices == tuple(self.prices)
        for epoch in (self.epoch, self.epoch + 1):
            assert np.array_equal(copy.plan(epoch).indices, self.sampler.plan(epoch).indices)

    @rule(new=st.integers(3, 6), back=st.integers(1, 2), price=st.sampled_from(PRICES), again=st.integers(0, 2))
    def elastic_carry_into_a_repriced_epoch(self, new, back, price, again):
        """``back`` steps before the end of an epoch on 2 ranks, resumed on ``new`` (the rest carried into the
        next epoch, which is priced otherwise), a checkpoint ``again`` steps into the carrying epoch, resumed
        once more: the carried rows are the same both times, and the carrying epoch's rest is exact."""
        epoch = self.epoch
        old = [make(rank=r) for r in range(WORLD)]
        for s in old:
            s.position.price_from(epoch + 1, price)
            s.set_epoch(epoch)
        plan = old[0].plan()
        done = max(plan.steps - back, 0)
        trained = {int(i) for b in range(done * WORLD) for i in plan[b]}
        state = {**old[0].state_dict(), "step": done}
        moved = [make(world=new, rank=r) for r in range(new)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for s in moved:
                s.load_state_dict(state)
        origin = moved[0].position.origin
        if origin is None or not len(origin.carried):
            event("elastic: nothing carried")
            return  # the rest fit whole steps on the new ranks: nothing carried
        event("elastic: rows carried into a re-priced epoch")
        carried = sorted(int(i) for i in origin.carried)
        assert set(carried) == set(range(len(STORE))) - trained - {
            int(i) for b in range(len(moved[0].plan())) for i in moved[0].plan()[b]
        }
        for s in moved:
            s.set_epoch(epoch + 1)
        carrying = moved[0].plan()
        taken = min(again, carrying.steps)
        first = [int(i) for b in range(taken * new) for i in carrying[b]]
        middle = {**moved[0].state_dict(), "step": taken}
        resumed = [make(world=new, rank=r) for r in range(new)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for s in resumed:
                s.load_state_dict(middle)
        assert sorted(int(i) for i in resumed[0].position.origin.carried) == carried, "origin re-planned otherwise"
        plan_again = resumed[0].plan()
        rest = [int(i) for b in range(taken * new, len(plan_again)) for i in plan_again[b]]
        assert sorted(first + rest) == sorted(list(range(len(STORE))) + carried), "a row twice or never"

    @invariant()
    def position_matches(self):
        state = self.sampler.state_dict()
        assert (state["epoch"], state["step"]) == (self.epoch, self.step)
        assert self.sampler.position.resume_pending == self.resume
        assert self.sampler.position.prices == tuple(self.prices)
        assert [list(p) for p in state.get("rank_costs", [])] == [[f, *p] for f, p in self.prices]


PriceMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=10, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_price_state_machine = pytest.mark.fuzz(PriceMachine.TestCase)

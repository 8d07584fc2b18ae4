"""Rank prices under every order of calls the API allows (hypothesis state machine): setting epochs,
taking batches (an iteration running or not), pricing this or a later epoch, checkpointing and resuming
(through JSON), pickling. Every batch handed out is the one the plan re-priced the same way says; a price
for an epoch begun is refused and changes nothing; only documented exceptions are raised."""

from __future__ import annotations

import json
import pickle

import dflash_batch as db
import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

LENGTHS = np.random.default_rng(4).integers(8, 700, 300)
OPTIONS = {"max_tokens": 2048, "world_size": 2, "rank": 0, "accumulation": 2, "seed": 9}
RATIOS = st.sampled_from([1e-4, 1e-3, 1e-2])


def _reference(prices) -> db.BucketSampler:
    sampler = db.BucketSampler(LENGTHS, **OPTIONS)
    for first, price in prices:
        sampler.position.price_from(first, price)
    return sampler


class Prices(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sampler = db.BucketSampler(LENGTHS, **OPTIONS)
        self.prices: list[tuple[int, tuple[float, float]]] = []
        self.batches = None  # the running iteration, if any
        self.taken = 0  # batches of the current epoch handed out

    def _begun(self) -> bool:
        position = self.sampler.position
        return position.step > 0 or position.running or position.resume_pending

    @rule(epoch=st.integers(0, 3))
    def set_epoch(self, epoch):
        moved = epoch != self.sampler.epoch
        self.sampler.set_epoch(epoch)
        if moved:
            if self.batches is not None:
                with pytest.raises(RuntimeError, match="superseded"):
                    next(self.batches)
            self.batches, self.taken = None, 0

    @rule(count=st.integers(1, 4))
    def take(self, count):
        if self.batches is None:
            self.batches = iter(self.sampler)
            self.taken = self.sampler.position.step if self.sampler.position.resume_pending else 0
        plan = _reference(self.prices).plan(self.sampler.epoch)
        for _ in range(count):
            try:
                batch = next(self.batches)
            except StopIteration:
                self.batches = None
                return
            expected = plan[self.taken * OPTIONS["world_size"] + OPTIONS["rank"]]
            assert np.array_equal(batch, expected), f"step {self.taken} of epoch {self.sampler.epoch}"
            self.taken += 1

    @rule(ahead=st.integers(0, 1))
    def peek(self, ahead):
        """The plan of this epoch or the next, as a user asks for it (the current one is then cached)."""
        epoch = self.sampler.epoch + ahead
        got, want = self.sampler.plan(epoch), _reference(self.prices).plan(epoch)
        assert np.array_equal(got.indices, want.indices) and np.array_equal(got.offsets, want.offsets)
        assert got.stats()["rank_price"] == self.sampler.rank_price(epoch)

    @rule(ahead=st.integers(0, 2), ratio=RATIOS)
    def price(self, ahead, ratio):
        first = self.sampler.epoch + ahead
        if ahead == 0 and self._begun():
            with pytest.raises(db.PlanError, match="has begun"):
                self.sampler.position.price_from(first, (1.0, ratio))
            return
        self.sampler.position.price_from(first, (1.0, ratio))
        self.prices = [p for p in self.prices if p[0] < first] + [(first, (1.0, ratio))]

    @rule()
    def bad_price(self):
        with pytest.raises(db.PlanError):
            self.sampler.position.price_from(self.sampler.epoch + 1, (0.0, 0.0))

    @precondition(lambda self: self.batches is None)
    @rule()
    def checkpoint_and_resume(self):
        state = json.loads(json.dumps(self.sampler.state_dict()))
        resumed = db.BucketSampler(LENGTHS, **OPTIONS)
        resumed.load_state_dict(state)
        self.sampler, self.batches = resumed, None

    @precondition(lambda self: self.batches is None)
    @rule()
    def pickled(self):
        self.sampler = pickle.loads(pickle.dumps(self.sampler))

    @invariant()
    def prices_are_the_positions(self):
        assert self.sampler.position.prices == tuple(self.prices)
        for epoch in range(5):
            expected = next((p for first, p in reversed(self.prices) if first <= epoch), (1.0, 0.0))
            assert self.sampler.rank_price(epoch) == expected


Prices.TestCase.settings = settings(max_examples=200, stateful_step_count=14, deadline=None)
TestPrices = Prices.TestCase

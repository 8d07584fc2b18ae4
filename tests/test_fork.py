"""Planning after fork: the planner's thread pool does not survive a fork, so a child must build its
own instead of waiting forever on the parent's threads."""

from __future__ import annotations

import hashlib
import multiprocessing as mp

import dflash_batch as db


def _digest(plan: db.Plan) -> str:
    return hashlib.sha256(plan.indices.tobytes() + plan.offsets.tobytes()).hexdigest()


def _plan_in_child(sampler: db.BucketSampler, queue) -> None:
    # A digest, not the arrays: a child cannot exit until its queue is drained, and the parent reads
    # only after the plan is done.
    queue.put(_digest(sampler.plan(3)))


def test_forked_child_plans_the_same_epoch():
    sampler = db.BucketSampler(db.seed_workload(300_000, seed=2), max_tokens=16384, threads=2)
    expected = _digest(sampler.plan(3))  # the parent's pool exists before the fork
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_plan_in_child, args=(sampler, queue))
    child.start()
    try:
        got = queue.get(timeout=120)
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
    assert got == expected
    assert child.exitcode == 0

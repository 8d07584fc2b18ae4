"""Planning after fork: the planner's thread pool does not survive a fork, so a child must build its
own instead of waiting forever on the parent's threads."""

from __future__ import annotations

import hashlib
import multiprocessing as mp

import dflash_batch as db


def _digest(plan: db.Plan) -> str:
    return hashlib.sha256(plan.indices.tobytes() + plan.offsets.tobytes()).hexdigest()


def _in_forked_child(target, argument, timeout: float = 120) -> tuple[object, int | None]:
    """Runs ``target(argument, queue)`` in a forked child: what it put on the queue, and its exit code. A
    child that hangs fails the ``queue.get`` and is killed."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=target, args=(argument, queue))
    child.start()
    try:
        got = queue.get(timeout=timeout)
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
    return got, child.exitcode


def _plan_in_child(sampler: db.BucketSampler, queue) -> None:
    # A digest, not the arrays: a child cannot exit until its queue is drained, and the parent reads
    # only after the plan is done.
    queue.put(_digest(sampler.plan(3)))


def test_forked_child_plans_the_same_epoch():
    sampler = db.BucketSampler(db.seed_workload(300_000, seed=2), max_tokens=16384, threads=2)
    expected = _digest(sampler.plan(3))  # the parent's pool exists before the fork
    got, exitcode = _in_forked_child(_plan_in_child, sampler)
    assert got == expected
    assert exitcode == 0


def _next_in_child(iterator, queue) -> None:
    try:
        next(iterator)
        queue.put("no error")
    except RuntimeError as error:
        queue.put(str(error))


def test_a_forked_child_iterating_an_inherited_loader_iterator_raises_instead_of_hanging(tmp_path):
    """Regression: the child's copy of the iterator waited forever for a worker thread it does not have."""
    import pytest

    pytest.importorskip("torch")
    import pyarrow as pa

    path = str(tmp_path / "t.arrow")
    table = pa.table({"input_ids": pa.array([[1, 2, 3]] * 50, type=pa.list_(pa.int32()))})
    with pa.ipc.new_file(path, table.schema) as writer:
        writer.write_table(table)
    store = db.TokenStore(path)
    loader = db.Loader(store, db.BucketSampler(store.lengths(), max_tokens=12))
    iterator = iter(loader)
    next(iterator)
    got, _ = _in_forked_child(_next_in_child, iterator)
    loader.close()
    assert "a forked child has no copy of its worker thread" in got

"""One test per kind of bad input: a clear exception (ValueError or TypeError subclass), never a crash."""

from __future__ import annotations

import dflash_batch as db
import numpy as np
import pytest

OK = np.array([5, 9, 3, 7], dtype=np.int64)


def make(lengths=OK, **kwargs):
    kwargs.setdefault("batch_size", 2) if "max_tokens" not in kwargs else None
    return db.BucketSampler(lengths, **kwargs)


def test_plan_error_is_a_value_error():
    assert issubclass(db.PlanError, ValueError)


def test_empty_lengths():
    with pytest.raises(db.PlanError, match="lengths is empty"):
        make(np.array([], dtype=np.int64))
    with pytest.raises(db.PlanError, match="lengths is empty"):
        make([])


def test_negative_length_names_row_and_value():
    with pytest.raises(db.PlanError, match="length -4 at row 2 is not positive"):
        make(np.array([5, 9, -4], dtype=np.int32))


def test_zero_length_names_row():
    with pytest.raises(db.PlanError, match="length 0 at row 1 is not positive"):
        make([5, 0, 3])


def test_length_too_large():
    with pytest.raises(db.PlanError, match="length 8589934592 at row 0 exceeds"):
        make(np.array([2**33], dtype=np.int64))


def test_nulls_in_arrow_input():
    pa = pytest.importorskip("pyarrow")
    with pytest.raises(db.PlanError, match=r"1 null\(s\), the first at row 3"):
        make(pa.chunked_array([[1, 2], [3, None, 5]]))


@pytest.mark.parametrize("bad", [np.array([1.5, 2.0]), np.array(["a", "b"]), np.array([True, False])])
def test_float_string_and_bool_dtypes(bad):
    with pytest.raises(TypeError, match="lengths must be integers"):
        make(bad)


def test_arrow_float_type():
    pa = pytest.importorskip("pyarrow")
    with pytest.raises(TypeError, match="arrow type double"):
        make(pa.array([1.0, 2.0]))


def test_string_is_a_dataset_path():
    with pytest.raises(FileNotFoundError, match="1,2,3 does not exist; pass an Arrow file"):
        make("1,2,3")
    with pytest.raises(TypeError, match="got bytes"):
        make(b"1,2,3")


def test_two_dimensional_lengths():
    with pytest.raises(db.PlanError, match=r"1-D, got an array of shape \(2, 2\)"):
        make(np.ones((2, 2), dtype=np.int64))


def test_edges_unsorted():
    with pytest.raises(db.PlanError, match=r"strictly increasing, but edge 2 \(4\) is not above edge 1 \(8\)"):
        make(boundaries=[0, 8, 4, 10])


def test_edges_duplicated():
    with pytest.raises(db.PlanError, match=r"edge 2 \(8\) is not above edge 1 \(8\)"):
        make(boundaries=[0, 8, 8, 10])


def test_edges_not_covering_the_data():
    with pytest.raises(db.PlanError, match="length 9 at row 1 exceeds the last edge 8; append an edge"):
        make(boundaries=[0, 4, 8])
    with pytest.raises(db.PlanError, match="length 3 at row 2 is not above the first edge 3"):
        make(boundaries=[3, 10])


def test_edges_too_few_and_wrong_type():
    with pytest.raises(db.PlanError, match="at least two"):
        make(boundaries=[10])
    with pytest.raises(TypeError, match="boundaries must be"):
        make(boundaries=[0.5, 10.0])
    with pytest.raises(db.PlanError, match="boundaries='optimal' is invalid"):
        make(boundaries="optimal")
    with pytest.raises(db.PlanError, match="edge -1 is out of range"):
        make(boundaries=[-1, 10])
    with pytest.raises(db.PlanError, match="boundaries=0 is invalid"):
        make(boundaries=0)


def test_both_batch_size_and_max_tokens():
    with pytest.raises(db.PlanError, match="both batch_size and max_tokens"):
        db.BucketSampler(OK, batch_size=2, max_tokens=100)


def test_neither_batch_size_nor_max_tokens():
    with pytest.raises(db.PlanError, match="neither batch_size nor max_tokens"):
        db.BucketSampler(OK)


@pytest.mark.parametrize("value", [0, -3])
def test_batch_size_not_positive(value):
    with pytest.raises(db.PlanError, match=f"batch_size={value} is invalid"):
        db.BucketSampler(OK, batch_size=value)


def test_max_tokens_not_positive():
    with pytest.raises(db.PlanError, match="max_tokens=0 is invalid"):
        db.BucketSampler(OK, max_tokens=0)


def test_max_tokens_below_shortest_sample():
    with pytest.raises(db.PlanError, match="max_tokens 2 is smaller than the shortest sample \\(3 tokens at row 2\\)"):
        db.BucketSampler(OK, max_tokens=2, oversize="skip")


def test_oversize_with_error_names_row_and_length():
    message = (
        r"length 9 at row 1 exceeds max_tokens 8 \(the longest row that fits is 8 tokens\); "
        r"raise max_tokens or pass oversize='skip'"
    )
    with pytest.raises(db.PlanError, match=message):
        db.BucketSampler(OK, max_tokens=8)


def test_oversize_under_a_cost_model_says_which_length_fits():
    # a·L + b·L² ≤ 100 with a = 1, b = 1 admits rows of up to 9 tokens: 9 + 81 = 90, 10 + 100 > 100.
    with pytest.raises(
        db.PlanError, match="length 12 at row 0 exceeds max_tokens 100 \\(the longest row that fits is 9"
    ):
        db.BucketSampler([12, 3, 4], max_tokens=100, cost=(1.0, 1.0))


def test_oversize_unknown_policy():
    with pytest.raises(db.PlanError, match="oversize='clip' is invalid; use 'error', 'skip' or 'truncate'"):
        make(oversize="clip")


def test_rank_not_below_world_size():
    with pytest.raises(db.PlanError, match="rank=4 is invalid for world_size=4"):
        make(world_size=4, rank=4)
    with pytest.raises(db.PlanError, match="rank=-1"):
        make(world_size=4, rank=-1)


@pytest.mark.parametrize("value", [0, -2])
def test_world_size_not_positive(value):
    with pytest.raises(db.PlanError, match=f"world_size={value} is invalid"):
        make(world_size=value, rank=0)


def test_more_ranks_than_samples():
    with pytest.raises(db.PlanError, match="4 sample\\(s\\) cannot give each of world_size 8 ranks"):
        make(world_size=8, rank=0).plan(0)
    # Refused before anything is sized by the world (a heap of 2^31 entries once aborted the process).
    with pytest.raises(db.PlanError, match="cannot give each of world_size 2147483648 ranks"):
        make(world_size=2**31, rank=0).plan(0)
    with pytest.raises(db.PlanError, match="8 ranks a batch: fewer batches than ranks, and drop_last=True dropped"):
        make(world_size=8, rank=0, drop_last=True).plan(0)


@pytest.mark.parametrize("seed", [1.5, "1", None, True])
def test_non_integer_seed(seed):
    with pytest.raises(TypeError, match="seed must be an int"):
        make(seed=seed)


def test_seed_out_of_range():
    with pytest.raises(db.PlanError, match="seed=-1 is invalid"):
        make(seed=-1)
    with pytest.raises(db.PlanError, match="seed=18446744073709551616 is invalid"):
        make(seed=2**64)


def test_unknown_keyword():
    with pytest.raises(TypeError, match="unexpected keyword argument 'bucket_count'"):
        make(bucket_count=4)


def test_lengths_passed_positionally_only_once():
    with pytest.raises(TypeError):
        db.BucketSampler(OK, 2)  # batch_size is keyword-only


def test_bad_epoch():
    sampler = make()
    with pytest.raises(db.PlanError, match="epoch=-1 is invalid"):
        sampler.set_epoch(-1)
    with pytest.raises(TypeError, match="epoch must be an int"):
        sampler.plan("3")


def test_non_bool_flags():
    with pytest.raises(TypeError, match="shuffle must be a bool"):
        make(shuffle="yes")


@pytest.mark.parametrize("threads", [0, -1, 2**70])
def test_threads_that_are_not_a_positive_count_are_refused(threads):
    """Regression: -1 raised OverflowError."""
    with pytest.raises(db.PlanError, match=rf"threads={threads} is invalid; pass a positive count"):
        db.BucketSampler([3, 4, 5], batch_size=2, threads=threads)


@pytest.mark.parametrize("threads", [16, 10**6, 2**63 - 1])
def test_threads_past_this_machines_cores_are_capped_and_plan_the_same(threads):
    """Issue 47: threads=16 written on a bigger machine was refused on a 2-core one, though plans are the
    same for any thread count. (threads=10**6 once spawned that many OS threads: the pool is capped.)"""
    big = db.BucketSampler(np.arange(1, 400), max_tokens=512, threads=threads, seed=2)
    one = db.BucketSampler(np.arange(1, 400), max_tokens=512, threads=1, seed=2)
    assert np.array_equal(big.plan(0).indices, one.plan(0).indices)
    assert big.schedule.config.get("threads") == threads, "kept as given: it pickles and checkpoints so"


def test_a_state_version_of_another_type_is_named_as_such():
    sampler = db.BucketSampler([3, 4, 5], batch_size=2)
    state = {**sampler.state_dict(), "version": "1"}
    with pytest.raises(db.PlanError, match=r"state version '1' is not supported \(expected 1\)"):
        sampler.load_state_dict(state)


def test_a_cost_past_f32_is_a_plan_error_not_an_endless_loop():
    """Regression: balance_tolerance with cost=(1e39, 0) looped growing a list until the OOM killer."""
    import subprocess
    import sys

    code = (
        "import dflash_batch as db\n"
        "try:\n"
        "    db.BucketSampler(db.seed_workload(2000), batch_size=4, cost=(1e39, 0), balance_tolerance=0.1).plan(0)\n"
        "except db.PlanError as e:\n"
        "    print('PlanError', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    # Since issue 40 a coefficient past 1e12 is refused with the settings, before any planning.
    assert done.stdout.startswith("PlanError") and "each 0 or between 1e-12 and 1e12" in done.stdout

"""Out-of-range values get the exception a Python user expects (ValueError/TypeError subclasses, IndexError
for indexing) naming the parameter, and messages name the real cause: regressions from an adversarial pass."""

from __future__ import annotations

import os

import dflash_batch as db
import numpy as np
import pytest
from _arrow import token_rows, token_table, write_ipc

LENGTHS = np.random.default_rng(0).integers(1, 60, 200)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return db.TokenStore(write_ipc(tmp_path_factory.mktemp("m") / "t.arrow", token_table(token_rows(200, longest=60))))


def sampler(**kwargs):
    kwargs.setdefault("max_tokens", 256)
    return db.BucketSampler(LENGTHS, **kwargs)


# -- 6: len() after a resume (issue 27, case 7) ------------------------------------------------------------------------


def test_len_after_a_resume_is_still_the_epochs_steps():
    """Trainers (Lightning) read len() once as every epoch's length: it never counts the steps left."""
    first = sampler(seed=3)
    steps = len(first)
    state = first.state_dict(step=0)
    state["step"] = 10
    resumed = sampler(seed=3)
    resumed.load_state_dict(state)
    assert len(resumed) == steps and len(list(resumed)) == steps - 10
    assert len(resumed) == steps == len(list(resumed)), "the iteration after a resumed one runs a whole epoch"
    resumed.set_epoch(1)
    assert len(resumed) == steps == len(list(resumed))


def test_loader_len_after_skip_is_still_the_epochs_steps(store):
    loader = db.Loader(store, db.BucketSampler(store.lengths(), max_tokens=256, seed=1))
    steps = len(loader)
    loader.skip(3)
    assert len(loader) == steps and len(list(loader)) == steps - 3


# -- 13: the exception type for out-of-range values -----------------------------------------------------


@pytest.mark.parametrize("name", ["pad_id", "label_pad_id"])
@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**100])
def test_pad_values_past_int64_are_value_errors_naming_the_parameter(store, name, value):
    batch = sampler().plan(0)[0]
    with pytest.raises(ValueError, match=f"{name}={value} does not fit int64"):
        db.collate(store, batch, **{name: value})
    with pytest.raises(ValueError, match=f"{name}={value} does not fit int64"):
        db.Loader(store, db.BucketSampler(store.lengths(), max_tokens=256), **{name: value})
    with pytest.raises(TypeError, match=f"{name} must be an int, got float"):
        db.collate(store, batch, **{name: 1.5})


@pytest.mark.parametrize("value", [0, 2**32, 2**40])
def test_pad_to_multiple_of_out_of_range_is_a_value_error(store, value):
    batch = sampler().plan(0)[0]
    with pytest.raises(ValueError, match=f"pad_to_multiple_of={value} is invalid; pass an integer between 1 and"):
        db.collate(store, batch, pad_to_multiple_of=value)
    with pytest.raises(ValueError, match=f"pad_to_multiple_of={value} is invalid"):
        db.BucketSampler(store.lengths(), max_tokens=256, pad_to_multiple_of=value)
    with pytest.raises(ValueError, match=f"pad_to_multiple_of={value} differs from the sampler's"):
        db.Loader(store, db.BucketSampler(store.lengths(), max_tokens=256), pad_to_multiple_of=value)


@pytest.mark.parametrize("index", [2**63, 2**64, -(2**64)])
def test_plan_and_store_indices_past_the_machine_word_are_index_errors(store, index):
    plan = sampler().plan(0)
    with pytest.raises(IndexError, match="out of range for a plan of"):
        plan[index]
    with pytest.raises(IndexError, match="out of range for a dataset of 200 rows"):
        store[index]
    with pytest.raises(TypeError):
        plan[1.0]


@pytest.mark.parametrize(
    "edit, error, message",
    [
        ({"world_size": -3}, db.PlanError, r"state world_size=-3 is invalid \(≥ 1 expected\)"),
        ({"world_size": 2**40}, db.PlanError, "state world_size=1099511627776 is invalid"),
        ({"world_size": "2"}, TypeError, "state world_size must be an int, got str"),
        ({"world_size": None}, TypeError, "state world_size must be an int, got NoneType"),
        ({"step": -1}, db.PlanError, "state step=-1 is invalid"),
        ({"elastic": {}}, db.PlanError, "state elastic={} is not what state_dict.. writes"),
        ({"elastic": [1]}, db.PlanError, r"state elastic=\[1\] is not what"),
        ({"elastic": {"world_size": 0, "step": 1}}, db.PlanError, "state elastic world_size=0 is invalid"),
        ({"elastic": {"world_size": 2, "step": -2}}, db.PlanError, "state elastic step=-2 is invalid"),
    ],
)
def test_an_edited_state_is_refused_naming_the_field(edit, error, message):
    state = sampler().state_dict()
    state.update(edit)
    with pytest.raises(error, match=message):
        sampler().load_state_dict(state)


def test_a_state_without_world_size_names_it():
    state = sampler().state_dict()
    del state["world_size"]
    with pytest.raises(db.PlanError, match=r"state is missing \['world_size'\]"):
        sampler().load_state_dict(state)


# -- 14: messages that name the real cause ---------------------------------------------------------------


def test_a_big_endian_array_is_named_by_its_byte_order():
    with pytest.raises(TypeError, match=r"non-native byte order \(dtype >i8\); convert with lengths.astype\('int64'\)"):
        db.BucketSampler(LENGTHS.astype(">i8"), max_tokens=256)


@pytest.mark.parametrize(
    "lengths, message",
    [
        (None, "lengths must be an array of integers, got NoneType None"),
        (7, "lengths must be an array of integers, got int 7"),
        ((n for n in LENGTHS), "got a generator; pass a list or np.fromiter"),
        (iter(LENGTHS.tolist()), "got a list_iterator; pass a list"),
    ],
)
def test_none_a_scalar_or_a_generator_is_named_not_called_shape_0(lengths, message):
    with pytest.raises(TypeError, match=message):
        db.BucketSampler(lengths, max_tokens=256)


def test_the_shortest_sample_message_separates_its_length_from_the_padded_one():
    with pytest.raises(
        db.PlanError, match=r"shortest sample padded to pad_to_multiple_of \(5 tokens at row 0, 8 padded\)"
    ):
        db.BucketSampler(np.array([5, 7, 9]), max_tokens=6, pad_to_multiple_of=8)
    with pytest.raises(db.PlanError, match=r"max_tokens 2 is smaller than the shortest sample \(3 tokens"):
        db.BucketSampler(np.array([5, 7, 3]), max_tokens=2)


def test_a_cost_model_pricing_every_row_past_the_budget_says_so():
    with pytest.raises(
        db.PlanError, match=r"cost=\(1000000000000.0, 1.0\) prices one row of the shortest sample \(1 tok"
    ):
        db.BucketSampler(np.array([4, 1, 9]), max_tokens=256, cost=(1e12, 1.0))
    with pytest.raises(db.PlanError, match="each 0 or between 1e-12 and 1e12"):  # past the range: refused as such
        db.BucketSampler(np.array([4, 1, 9]), max_tokens=256, cost=(1e39, 0.0), balance_tolerance=0.1).plan(0)


def test_odd_one_row_batches_name_the_batches_and_suggest_drop_last_only_where_it_works():
    three = np.array([200, 200, 200])
    with pytest.raises(
        db.PlanError,
        match=r"3 sample\(s\) cannot give each of world_size 2 .* formed 3 batch\(es\) .* the plan needs 4",
    ) as err:
        db.BucketSampler(three, max_tokens=256, world_size=2, rank=0).plan(0)
    assert "drop_last=True (it leaves out the samples of 1 batch(es))" in str(err.value)
    assert db.BucketSampler(three, max_tokens=256, world_size=2, rank=0, drop_last=True).plan(0).steps == 1
    with pytest.raises(db.PlanError, match=r"formed 3 batch.* the plan needs 5") as err:
        db.BucketSampler(three, max_tokens=256, world_size=5, rank=0).plan(0)
    assert "drop_last" not in str(err.value), "drop_last would drop every batch: not suggested"


@pytest.mark.parametrize("count", [0, -3, 65536, 2**32, 2**200])
def test_a_bucket_count_out_of_range_quotes_the_real_limit(count):
    with pytest.raises(
        db.PlanError, match=f"boundaries={count} is invalid; boundaries must be a bucket count between 1 and 65535"
    ):
        sampler(boundaries=count)


def test_a_device_file_is_not_called_truncated():
    with pytest.raises(db.DataError, match="/dev/zero is a device, not a regular file"):
        db.TokenStore("/dev/zero")
    with pytest.raises(db.DataError, match="/dev/zero is a device"):
        db.read_lengths("/dev/zero")


def test_a_file_behind_an_unsearchable_directory_is_a_permission_error(tmp_path, monkeypatch):
    # As root every directory is searchable, so the stat that fails is simulated.
    path = tmp_path / "locked" / "data.arrow"
    real_stat = os.stat

    def stat(p, *args, **kwargs):
        if os.fspath(p) == os.fspath(path):
            raise PermissionError(13, "Permission denied", os.fspath(p))
        return real_stat(p, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    with pytest.raises(PermissionError, match=r"cannot be reached .* a directory on its path cannot be searched"):
        db.TokenStore(path)


def test_a_ring_too_large_because_of_pad_to_multiple_of_says_so(store, monkeypatch):
    from dflash_batch.loading import loader as loader_module

    monkeypatch.setattr(loader_module, "_physical_memory", lambda: 10**8)
    sampler_ = db.BucketSampler(store.lengths(), batch_size=2, pad_to_multiple_of=2**20)
    loader = db.Loader(store, sampler_)
    with pytest.raises(MemoryError, match=r"lower pad_to_multiple_of=1048576, which sets that width; lower prefetch"):
        next(iter(loader))
    loader.close()


def test_a_ring_torch_cannot_allocate_is_a_memory_error(store, monkeypatch):
    """Found by the adversarial suite: torch reports a failed allocation as a RuntimeError."""
    torch = pytest.importorskip("torch")

    def empty(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")

    sampler_ = db.BucketSampler(store.lengths(), max_tokens=256)
    loader = db.Loader(store, sampler_, reuse_buffers=True)
    monkeypatch.setattr(torch, "empty", empty)
    with pytest.raises(MemoryError, match=r"needs a ring of 3 slots .* more than can be allocated now; lower prefetch"):
        next(iter(loader))
    monkeypatch.setattr(torch, "empty", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("another failure")))
    with pytest.raises(RuntimeError, match="another failure"):
        next(iter(loader))
    loader.close()

"""`Windows`: batches of a stream planned a window at a time — every example once per pass, equal steps per
rank in every window, the same batches for the same seed, and an exact resume from any step."""

from __future__ import annotations

import os

import dflash_batch as db
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def examples(n: int, seed: int = 0) -> list[dict]:
    lengths = db.seed_workload(n, seed=seed)
    return [{"id": i, "seq_len": int(v)} for i, v in enumerate(lengths)]


def ranks_of(source, world: int, **kwargs) -> list[db.Windows]:
    return [db.Windows(source, column="seq_len", world_size=world, rank=r, **kwargs) for r in range(world)]


def run(windows: db.Windows) -> list[list[int]]:
    return [[ex["id"] for ex in batch] for batch in windows]


def test_every_example_once_a_pass_and_every_rank_the_same_steps_in_every_window():
    data = examples(5000)
    ranks = ranks_of(data, 4, window=1000, max_tokens=16384)
    got = [run(w) for w in ranks]
    assert len({len(g) for g in got}) == 1  # the same steps on every rank
    seen = sorted(i for g in got for batch in g for i in batch)
    assert seen == list(range(5000))
    # Each window's batches hold only its examples, and every rank takes the same steps of it.
    plans = [ranks[0].plan_window(data[k * 1000 : (k + 1) * 1000], k) for k in range(5)]
    step = 0
    for k, plan in enumerate(plans):
        for s in range(plan.steps):
            for r in range(4):
                ids = got[r][step + s]
                assert all(k * 1000 <= i < (k + 1) * 1000 for i in ids)
                assert ids == [k * 1000 + int(i) for i in plan[s * 4 + r]]
        step += plan.steps
    assert step == len(got[0])


def test_a_padded_batch_keeps_the_token_budget():
    for batch in db.Windows(examples(3000), column="seq_len", window=1000, max_tokens=8192, world_size=1, rank=0):
        assert len(batch) * max(ex["seq_len"] for ex in batch) <= 8192


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=16, max_size=400),
    window=st.integers(8, 200),
    world=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 2**32),
)
def test_windowed_plans_cover_the_stream_once_with_equal_steps(lengths, window, world, seed):
    data = [{"id": i, "seq_len": v} for i, v in enumerate(lengths)]
    try:
        got = [run(w) for w in ranks_of(data, world, window=window, batch_size=2, seed=seed)]
    except db.PlanError as error:  # a window too small for every rank: named, never a silent gap
        assert "window" in str(error)
        return
    assert len({len(g) for g in got}) == 1
    assert sorted(i for g in got for b in g for i in b) == list(range(len(lengths)))


def test_the_same_seed_gives_the_same_batches_whatever_the_threads_and_another_seed_or_pass_others():
    data = examples(4000)
    one = run(db.Windows(data, column="seq_len", window=1500, max_tokens=16384, world_size=2, rank=1, threads=1))
    two = run(db.Windows(data, column="seq_len", window=1500, max_tokens=16384, world_size=2, rank=1, threads=2))
    assert one == two
    other = db.Windows(data, column="seq_len", window=1500, max_tokens=16384, world_size=2, rank=1, seed=1)
    assert run(other) != one
    again = db.Windows(data, column="seq_len", window=1500, max_tokens=16384, world_size=2, rank=1)
    again.set_epoch(1)
    assert run(again) != one


def test_the_last_window_takes_a_tail_shorter_than_half_a_window():
    w = db.Windows(list(range(10)), length=lambda v: 1, window=4, batch_size=1, world_size=1, rank=0, shuffle=False)
    assert sorted(i for b in w for i in b) == list(range(10))
    cut = [len(x) for x in w.cut(iter(range(10)))]
    assert cut == [4, 4, 2]  # a tail of half a window is a window of its own
    assert [len(x) for x in w.cut(iter(range(9)))] == [4, 5]
    assert [len(x) for x in w.cut(iter(range(12)))] == [4, 4, 4]
    assert [len(x) for x in w.cut(iter(range(0)))] == []


@pytest.mark.parametrize("world", [1, 3])
def test_a_resume_from_any_step_trains_what_the_uninterrupted_run_trains(world):
    data = examples(3000)
    whole = [run(w) for w in ranks_of(data, world, window=700, max_tokens=16384)]
    steps = len(whole[0])
    for stop in sorted({0, 1, steps // 3, steps // 2, steps - 1, steps}):
        for rank in range(world):
            first = db.Windows(data, column="seq_len", window=700, max_tokens=16384, world_size=world, rank=rank)
            it = iter(first)
            head = [[ex["id"] for ex in next(it)] for _ in range(stop)]
            state = first.state_dict()
            fresh = db.Windows(data, column="seq_len", window=700, max_tokens=16384, world_size=world, rank=rank)
            fresh.load_state_dict(state)
            assert head + run(fresh) == whole[rank], (stop, rank)


def test_a_checkpoint_of_the_steps_trained_behind_those_handed_out_and_a_resume_of_a_resume():
    data = examples(3000)
    whole = run(db.Windows(data, column="seq_len", window=500, max_tokens=16384, world_size=1, rank=0))
    w = db.Windows(data, column="seq_len", window=500, max_tokens=16384, world_size=1, rank=0)
    it = iter(w)
    for _ in range(40):
        next(it)  # a loader read 40 ahead; the loop trained 25
    state = w.state_dict(step=25)
    second = db.Windows(data, column="seq_len", window=500, max_tokens=16384, world_size=1, rank=0)
    second.load_state_dict(state)
    it2 = iter(second)
    middle = [[ex["id"] for ex in next(it2)] for _ in range(30)]
    assert middle == whole[25:55]
    third = db.Windows(data, column="seq_len", window=500, max_tokens=16384, world_size=1, rank=0)
    third.load_state_dict(second.state_dict(step=10))  # 10 steps since the resumed iteration began
    assert run(third) == whole[35:]
    with pytest.raises(ValueError, match="from 0 to 30"):
        second.state_dict(step=31)


def test_a_state_of_other_settings_or_window_or_not_a_state_is_refused_and_changes_nothing():
    data = examples(2000)
    w = db.Windows(data, column="seq_len", window=500, max_tokens=16384, world_size=1, rank=0)
    state = w.state_dict()
    other = db.Windows(data, column="seq_len", window=600, max_tokens=16384, world_size=1, rank=0, seed=3)
    with pytest.raises(db.PlanError, match=r"window: 500 there, 600 here.*seed: 0 there, 3 here"):
        other.load_state_dict(state)
    with pytest.raises(db.PlanError, match=r"not a dflash_batch\.Windows state"):
        w.load_state_dict({"epoch": 0})
    with pytest.raises(db.PlanError, match="plan revision"):
        w.load_state_dict({**state, "revision": -1})
    assert run(other) == run(
        db.Windows(data, column="seq_len", window=600, max_tokens=16384, world_size=1, rank=0, seed=3)
    )


def test_a_newer_iteration_or_set_epoch_supersedes_a_running_one():
    w = db.Windows(examples(2000), column="seq_len", window=500, max_tokens=16384, world_size=1, rank=0)
    old = iter(w)
    next(old)
    iter(w)
    with pytest.raises(RuntimeError, match="superseded"):
        next(old)
    running = iter(w)
    next(running)
    w.set_epoch(2)
    with pytest.raises(RuntimeError, match="superseded"):
        next(running)
    assert w.epoch == 2


def write_shards(tmp_path, data, files=3, group=97) -> list[str]:
    paths = []
    for f, part in enumerate(np.array_split(np.arange(len(data)), files)):
        path = tmp_path / f"shard-{f:02d}.parquet"
        pq.write_table(pa.Table.from_pylist([data[i] for i in part]), path, row_group_size=group)
        paths.append(str(path))
    return paths


def test_parquet_shards_as_a_list_a_glob_or_a_directory_and_a_resume_that_skips_row_groups(tmp_path):
    data = examples(2500)
    paths = write_shards(tmp_path, data)
    pq.write_table(
        pa.Table.from_pylist([], schema=pa.schema([("id", pa.int64()), ("seq_len", pa.int64())])),
        tmp_path / "shard-99.parquet",
    )  # a shard with no rows: nothing to read, no error
    expected = run(db.Windows(data, column="seq_len", window=600, max_tokens=16384, world_size=1, rank=0))
    for source in (paths, str(tmp_path / "*.parquet"), str(tmp_path)):
        assert run(db.Windows(source, column="seq_len", window=600, max_tokens=16384, world_size=1, rank=0)) == expected
    w = db.Windows(paths, column="seq_len", window=600, max_tokens=16384, world_size=1, rank=0)
    it = iter(w)
    head = [[ex["id"] for ex in next(it)] for _ in range(70)]
    fresh = db.Windows(paths, column="seq_len", window=600, max_tokens=16384, world_size=1, rank=0)
    fresh.load_state_dict(w.state_dict())
    assert head + run(fresh) == expected


def test_a_datasets_iterable_dataset_streamed_from_parquet_gives_the_same_batches(tmp_path):
    datasets = pytest.importorskip("datasets")
    data = examples(1500)
    paths = write_shards(tmp_path, data, files=2)
    streamed = datasets.load_dataset("parquet", data_files=paths, split="train", streaming=True)
    expected = run(db.Windows(data, column="seq_len", window=400, max_tokens=16384, world_size=2, rank=1))
    assert run(db.Windows(streamed, column="seq_len", window=400, max_tokens=16384, world_size=2, rank=1)) == expected


def test_bad_shards_are_named(tmp_path):
    data = examples(500)
    paths = write_shards(tmp_path, data, files=2)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        db.Windows([*paths, str(tmp_path / "gone.parquet")], column="seq_len", world_size=1, rank=0)
    with pytest.raises(FileNotFoundError, match="no file matches"):
        db.Windows(str(tmp_path / "nothing-*.parquet"), column="seq_len", world_size=1, rank=0)
    raw = open(paths[1], "rb").read()
    with open(paths[1], "wb") as f:
        f.write(raw[: len(raw) // 2])  # truncated
    w = db.Windows(paths, column="seq_len", window=100, max_tokens=16384, world_size=1, rank=0)
    with pytest.raises(db.DataError, match=r"shard-01\.parquet.*truncated or corrupt"):
        run(w)
    open(paths[1], "wb").close()  # empty file: not Parquet
    with pytest.raises(db.DataError, match=r"shard-01\.parquet"):
        run(db.Windows(paths, column="seq_len", window=100, max_tokens=16384, world_size=1, rank=0))
    os.remove(paths[1])  # removed after the stream was opened
    with pytest.raises(FileNotFoundError, match="is gone"):
        run(w)


def test_a_one_shot_iterator_is_refused_and_a_function_returning_one_is_read_again():
    gen = (x for x in range(10))
    with pytest.raises(TypeError, match="readable again"):
        db.Windows(gen, length=lambda v: v + 1, world_size=1, rank=0)
    w = db.Windows(
        lambda: (x for x in range(100)), length=lambda v: v + 1, window=50, batch_size=4, world_size=1, rank=0
    )
    first, second = run_plain(w), run_plain(w)
    assert first == second and sorted(i for b in first for i in b) == list(range(100))
    with pytest.raises(TypeError, match="a dict of splits"):
        db.Windows({"train": []}, column="seq_len", world_size=1, rank=0)


def run_plain(w):
    return [list(b) for b in w]


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({}, TypeError, "exactly one of column="),
        ({"column": "seq_len", "length": len}, TypeError, "exactly one of column="),
        ({"column": "seq_len", "window": 0}, ValueError, "window must be an integer ≥ 1"),
        ({"column": "seq_len", "window": True}, ValueError, "window must be an integer ≥ 1"),
        ({"column": "seq_len", "bogus": 1}, TypeError, "bogus"),
        ({"column": "seq_len", "rank": 5}, ValueError, "rank"),
        ({"column": "seq_len", "max_tokens": None}, db.PlanError, "neither batch_size nor max_tokens"),
    ],
)
def test_each_bad_argument_is_refused_naming_it(kwargs, error, words):
    kwargs = {"world_size": 2, "rank": 0, "max_tokens": 16384, **kwargs}
    with pytest.raises(error, match=words):
        db.Windows(examples(10), **kwargs)


def test_a_missing_field_a_bad_length_and_a_window_too_small_for_the_ranks_are_named():
    with pytest.raises(TypeError, match="no field 'n_tokens'"):
        run(db.Windows(examples(50), column="n_tokens", world_size=1, rank=0, max_tokens=16384))
    with pytest.raises(db.DataError, match="example 3"):
        run(db.Windows(list(range(10)), length=lambda v: -1 if v == 3 else v, world_size=1, rank=0, batch_size=2))
    with pytest.raises(db.PlanError, match=r"window 0 .*larger window"):
        run(db.Windows(examples(30), column="seq_len", window=10, world_size=16, rank=0, batch_size=2))


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(200, 3000),
    world=st.sampled_from([1, 2, 3, 8]),
    accumulation=st.integers(1, 5),
    seed=st.integers(0, 1000),
)
def test_whole_steps_end_a_plan_on_an_optimizer_step_and_keep_every_sample_once(n, world, accumulation, seed):
    lengths = db.seed_workload(n, seed=seed)
    kwargs = {"max_tokens": 16384, "world_size": world, "rank": 0, "accumulation": accumulation, "seed": seed}
    try:
        plan = db.BucketSampler(lengths, whole_steps=True, **kwargs).plan(0)
    except db.PlanError as error:
        assert error.kind == "too_few_samples_for_ranks"
        return
    assert plan.steps % accumulation == 0
    assert np.array_equal(np.sort(plan.indices), np.arange(n))
    plain = db.BucketSampler(lengths, **kwargs)
    assert plain.plan(0).steps <= plan.steps
    assert "whole_steps" not in plain.state_dict()["settings"]  # a default, not recorded: old checkpoints resume


@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 400), size=st.integers(1, 60))
def test_parquet_windows_are_cut_where_a_stream_of_examples_is(total, size):
    from dflash_batch.planning.windows import bounds

    w = db.Windows([], column="seq_len", window=size, world_size=1, rank=0, max_tokens=100)
    cut, at = [], 0
    for held in w.cut(iter(range(total))):
        cut.append((at, at + len(held)))
        at += len(held)
    assert list(bounds(total, size)) == cut
    for k, (lo, _) in enumerate(cut):
        assert list(bounds(total, size, lo)) == cut[k:]
    assert list(bounds(total, size, total)) == []  # past the end: a finished pass resumes to nothing


def test_parquet_with_a_length_column_makes_python_examples_of_this_ranks_rows_only(tmp_path, monkeypatch):
    from dflash_batch.data import streams

    data = examples(4000)
    paths = write_shards(tmp_path, data)
    taken = []
    original = streams.Shards.take
    monkeypatch.setattr(streams.Shards, "take", lambda self, rows: taken.append(len(rows)) or original(self, rows))
    whole = [run(w) for w in ranks_of(data, 4, window=1000, max_tokens=16384)]
    for rank in range(4):
        taken.clear()
        got = run(db.Windows(paths, column="seq_len", window=1000, max_tokens=16384, world_size=4, rank=rank))
        assert got == whole[rank]
        assert sum(taken) == sum(len(b) for b in got) < 4000 / 2  # its own rows, about a quarter
    tokens = [{"id": e["id"], "input_ids": [1] * e["seq_len"]} for e in data[:1500]]
    path = tmp_path / "tokens.parquet"
    pq.write_table(pa.Table.from_pylist(tokens), path, row_group_size=200)
    by_list = db.Windows(str(path), column="input_ids", window=500, max_tokens=16384, world_size=1, rank=0)
    by_len = db.Windows(data[:1500], column="seq_len", window=500, max_tokens=16384, world_size=1, rank=0)
    assert run(by_list) == run(by_len)


def test_a_parquet_length_column_that_is_null_text_or_missing_is_named(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"seq_len": pa.array([5, None, 7], pa.int64()), "text": ["a", "b", "c"]}), path)
    with pytest.raises(db.DataError, match="example 1: its 'seq_len' is null"):
        run(db.Windows(str(path), column="seq_len", world_size=1, rank=0, max_tokens=100))
    with pytest.raises(TypeError, match="column 'text' holds string"):
        run(db.Windows(str(path), column="text", world_size=1, rank=0, max_tokens=100))
    with pytest.raises(TypeError, match="no column"):
        run(db.Windows(str(path), column="n_tokens", world_size=1, rank=0, max_tokens=100))


DROP = object()  # the key left out of the state


@settings(max_examples=60, deadline=None)
@given(
    key=st.sampled_from(["format", "revision", "epoch", "window", "step", "start", "window_size", "settings"]),
    value=st.one_of(st.none(), st.just("x"), st.integers(-5, -1), st.just([]), st.just(DROP)),
)
def test_a_damaged_state_is_refused_as_a_plan_error_and_changes_nothing(key, value):
    data = examples(1500)
    w = db.Windows(data, column="seq_len", window=500, max_tokens=16384, world_size=1, rank=0)
    it = iter(w)
    for _ in range(30):
        next(it)
    state = w.state_dict()
    before = w.state_dict()
    damaged = {k: v for k, v in state.items() if not (k == key and value is DROP)}
    if value is not DROP:
        damaged[key] = value
    fresh = db.Windows(data, column="seq_len", window=500, max_tokens=16384, world_size=1, rank=0)
    with pytest.raises(db.PlanError):
        fresh.load_state_dict(damaged)
    assert fresh.state_dict() == {**before, "window": 0, "step": 0, "start": 0}


def test_packed_windows_fill_rows_within_capacity_and_cover_the_stream_once():
    data = examples(3000)
    got = [
        [[ex["id"] for ex in row] for row in w]
        for w in ranks_of(data, 2, window=1000, mode="packed", max_tokens=16384, accumulation=2)
    ]
    assert len(got[0]) == len(got[1]) and len(got[0]) % 2 == 0  # whole optimizer steps in every window
    assert sorted(i for g in got for row in g for i in row) == list(range(3000))
    lengths = {e["id"]: e["seq_len"] for e in data}
    assert all(sum(lengths[i] for i in row) <= 16384 for g in got for row in g)


def test_a_copy_for_another_process_is_refused_naming_what_to_do():
    import copy
    import pickle

    w = db.Windows(examples(100), column="seq_len", max_tokens=16384, world_size=1, rank=0)
    for make in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match="iterate it in the loop"):
            make(w)


def test_whole_steps_survive_an_elastic_resume_every_sample_once():
    lengths = db.seed_workload(20_000, seed=3)
    kwargs = {"max_tokens": 16384, "accumulation": 4, "whole_steps": True}
    first = [db.BucketSampler(lengths, world_size=4, rank=r, **kwargs) for r in range(4)]
    trained = []
    for sampler in first:
        it = iter(sampler)
        trained += [i for _ in range(37) for i in next(it).tolist()]
    state = first[0].state_dict()
    assert state["settings"]["whole_steps"] is True  # recorded when set
    rest = [db.BucketSampler(lengths, world_size=2, rank=r, **kwargs) for r in range(2)]
    for sampler in rest:
        sampler.load_state_dict(state)
        trained += [i for batch in sampler for i in batch.tolist()]
    assert sorted(trained) == list(range(20_000))
    assert rest[0].plan(0).steps % 4 == 0  # the rest, on 2 ranks, ends on a whole optimizer step too


def test_parquet_read_whole_for_a_length_function_gives_the_batches_of_the_length_column(tmp_path):
    data = examples(2500)
    paths = write_shards(tmp_path, data)
    by_column = db.Windows(paths, column="seq_len", window=600, max_tokens=16384, world_size=2, rank=1)
    by_function = db.Windows(paths, length=lambda e: e["seq_len"], window=600, max_tokens=16384, world_size=2, rank=1)
    expected = run(by_column)
    assert run(by_function) == expected
    it = iter(by_function)
    head = [[ex["id"] for ex in next(it)] for _ in range(90)]
    fresh = db.Windows(paths, length=lambda e: e["seq_len"], window=600, max_tokens=16384, world_size=2, rank=1)
    fresh.load_state_dict(by_function.state_dict())  # resumed from a row group's metadata, mid-stream
    assert head + run(fresh) == expected

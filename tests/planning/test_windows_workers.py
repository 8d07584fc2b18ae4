"""`Windows` in torch DataLoader workers (issue 62): the workers split a rank's batches and the loop gets them in
the rank's order; a checkpoint takes the loop's count (`state_dict(step=n)`), and the resume — on its own or
through workers again — trains every example of the pass once. Persistent workers, a checkpoint without the
count, and a count past the pass are refused."""

from __future__ import annotations

import dflash_batch as db
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")


def ids(batch: list[dict]) -> list[int]:
    return [example["id"] for example in batch]


def shards(tmp_path, files: int = 3, rows: int = 1500) -> str:
    lengths = db.seed_workload(files * rows, seed=1)
    for f in range(files):
        part = lengths[f * rows : (f + 1) * rows]
        ids_ = np.arange(f * rows, (f + 1) * rows)
        pq.write_table(pa.table({"id": ids_, "seq_len": part}), tmp_path / f"s{f}.parquet", row_group_size=250)
    return str(tmp_path / "s*.parquet")


def windows(source, rank: int = 0, world: int = 1, **kwargs) -> db.Windows:
    return db.Windows(source, column="seq_len", window=1000, max_tokens=16384, world_size=world, rank=rank, **kwargs)


def loader(w: db.Windows, workers: int, **kwargs) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(w.iterable(), batch_size=None, num_workers=workers, collate_fn=ids, **kwargs)


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("parquet", [True, False])
def test_workers_hand_the_loop_the_ranks_batches_in_order(tmp_path, workers, parquet):
    source = (
        shards(tmp_path)
        if parquet
        else [{"id": i, "seq_len": int(n)} for i, n in enumerate(db.seed_workload(4500, seed=1))]
    )
    for rank in range(2):
        direct = [ids(b) for b in windows(source, rank, 2)]
        assert list(loader(windows(source, rank, 2), workers)) == direct, f"rank {rank}"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trained=st.integers(0, 60), workers=st.integers(1, 2), epoch=st.integers(0, 2))
def test_a_checkpoint_from_the_loops_count_resumes_exactly(tmp_path_factory, trained, workers, epoch):
    source = shards(tmp_path_factory.mktemp("shards"))
    w = windows(source)
    w.set_epoch(epoch)
    uninterrupted = windows(source)
    uninterrupted.set_epoch(epoch)
    whole = [ids(b) for b in uninterrupted]
    got = []
    for k, batch in enumerate(loader(w, workers)):
        if k == trained:
            break
        got.append(batch)
    state = w.state_dict(step=len(got))
    resumed = windows(source)
    resumed.load_state_dict(state)
    rest = list(loader(resumed, workers))
    everything = sorted(i for batch in got + rest for i in batch)
    assert everything == list(range(4500)), "an example lost or trained twice"
    assert got + rest == whole, "the resumed pass is the uninterrupted one"
    # A second checkpoint inside the resumed iteration counts from the resume.
    again = windows(source)
    again.load_state_dict(state)
    it = iter(loader(again, workers))
    more = [next(it) for _ in range(min(5, len(rest)))]
    del it
    second = again.state_dict(step=len(more))
    last = windows(source)
    last.load_state_dict(second)
    assert got + more + list(loader(last, 0)) == got + rest


def test_a_checkpoint_without_the_count_is_refused(tmp_path):
    w = windows(shards(tmp_path))
    next(iter(loader(w, 2)))
    with pytest.raises(ValueError, match=r"pass state_dict\(step=n\)"):
        w.state_dict()
    with pytest.raises(ValueError, match="past the end of pass 0"):
        w.state_dict(step=10_000)
    with pytest.raises(ValueError, match="an int ≥ 0"):
        w.state_dict(step=-1)


def test_persistent_workers_are_refused_before_a_stale_second_pass(tmp_path):
    w = windows(shards(tmp_path))
    persistent = loader(w, 2, persistent_workers=True)
    first = list(persistent)
    assert sorted(i for b in first for i in b) == list(range(4500))
    w.set_epoch(1)
    with pytest.raises(RuntimeError, match="persistent_workers=False"):
        list(persistent)


def test_another_start_method_is_refused_naming_fork(tmp_path):
    w = windows(shards(tmp_path))
    spawned = loader(w, 1, multiprocessing_context="spawn")
    with pytest.raises(TypeError, match="multiprocessing_context='fork'"):
        list(spawned)

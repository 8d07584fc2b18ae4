"""Issue 40: each row of its table, as a user meets it, and the elastic resumes it names. Every test checks
which samples were (or would be) trained against the plan, or that the call refuses with what to do.

Rows 3 (a worker DataLoader) and the client adapters run real clients in tests/adapters/test_clients_resume.py
(2 processes, kill -9); the ones here run in-process, or in a capped child where a signal could kill.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import dflash_batch as db  # noqa: E402
from _position import STORE, planned, sampler  # noqa: E402
from _position import rows as rows_of  # noqa: E402

# -- row 1: moving the position while a loop runs ---------------------------------------------------------


@pytest.mark.parametrize("move", ["set_epoch", "skip", "load_state_dict"])
@pytest.mark.parametrize("on", ["loader", "sampler"])
def test_row1_moving_the_position_inside_a_loader_loop_raises_at_the_next_batch(move, on):
    """It used to end the loop after the current batch, silently: the rest of the epoch never trained."""
    s = sampler()
    loader = db.Loader(STORE, s)
    saved = s.state_dict()
    target = loader if on == "loader" else s.position if move == "skip" else s
    trained = []
    with pytest.raises(RuntimeError, match=rf"superseded: {move}"):
        for batch in loader:
            trained.append(rows_of(batch))
            if len(trained) == 3:
                {"set_epoch": lambda: target.set_epoch(1), "skip": lambda: target.skip(5)}.get(
                    move, lambda: target.load_state_dict(saved)
                )()
    assert trained == planned(0)[:3], "nothing was trained past the call"
    # The new position is where the next iteration begins.
    expected = {"set_epoch": planned(1), "skip": planned(0, 5), "load_state_dict": planned(0)}[move]
    assert [rows_of(b) for b in loader] == expected


@pytest.mark.parametrize("move", ["set_epoch", "skip", "load_state_dict"])
def test_row1_the_same_for_the_samplers_own_iteration(move):
    s = sampler()
    saved = s.state_dict()
    iterator = iter(s)
    next(iterator)
    {"set_epoch": lambda: s.set_epoch(1), "skip": lambda: s.position.skip(5)}.get(
        move, lambda: s.load_state_dict(saved)
    )()
    with pytest.raises(RuntimeError, match="superseded"):
        next(iterator)


def test_row1_set_epoch_of_the_current_epoch_changes_nothing_and_the_loop_goes_on():
    """The HF Trainer and accelerate call set_epoch(e) at the start of epoch e; a repeat is harmless."""
    s = sampler()
    trained = []
    loader = db.Loader(STORE, s)
    for batch in loader:
        trained.append(rows_of(batch))
        loader.set_epoch(0)
    assert trained == planned(0)


# -- row 2: a refused load -----------------------------------------------------------------------------


@pytest.mark.parametrize("on", ["loader", "sampler"])
def test_row2_a_refused_load_mid_iteration_changes_nothing_and_the_loop_trains_every_batch(on):
    """It used to keep the position but stop the running iterator: 37 of 41 batches untrained."""
    s = sampler()
    loader = db.Loader(STORE, s)
    foreign = db.BucketSampler(STORE.lengths(), max_tokens=128, seed=4).state_dict()
    trained, refused = [], []
    for batch in loader:
        trained.append(rows_of(batch))
        if len(trained) == 3:
            before = s.state_dict()
            with pytest.raises(db.PlanError, match="seed 4 vs 3") as error:
                (loader if on == "loader" else s).load_state_dict(foreign)
            refused.append(error.value)
            assert s.state_dict() == before
    assert refused and trained == planned(0), "every batch of the epoch trained"


# -- row 3: a worker DataLoader, a break at max_steps ------------------------------------------------------


def test_row3_a_stateful_dataloader_with_workers_breaks_at_max_steps_and_resumes_exactly():
    """``break`` at max_steps, then the loader's state: the batches its workers fetched ahead are not in it."""
    from dflash_batch.adapters.torch import loader as stateful
    from torchdata.stateful_dataloader import StatefulDataLoader

    first = stateful(STORE, sampler(), num_workers=2)
    trained = []
    for batch in first:
        trained.append(rows_of(batch))
        if len(trained) == 6:  # max_steps
            break
    state = first.state_dict()
    assert isinstance(first, StatefulDataLoader)
    again = stateful(STORE, sampler(), num_workers=2)
    again.load_state_dict(state)
    assert trained + [rows_of(b) for b in again] == planned(0)


def test_row3_a_plain_dataloader_with_workers_resumes_exactly_from_the_step_the_loop_says():
    from dflash_batch.adapters.torch import StoreCollator
    from torch.utils.data import DataLoader

    s = sampler()
    loader = DataLoader(list(range(len(STORE))), batch_sampler=s, collate_fn=StoreCollator(STORE, s), num_workers=2)
    trained = []
    for batch in loader:
        trained.append(rows_of(batch))
        if len(trained) == 6:
            break
    assert s.position.step > 6, "the workers took batches ahead of the loop"
    resumed = sampler()
    resumed.load_state_dict(s.state_dict(step=len(trained)))
    assert trained + [rows_of(b) for b in db.Loader(STORE, resumed)] == planned(0)
    with pytest.raises(db.PlanError, match="has handed out"):
        s.state_dict(step=10**6)


# -- row 4: one owner of padding ---------------------------------------------------------------------------


def test_row4_a_loader_padding_other_than_the_plan_is_refused():
    """It used to pad 64-token batches to 256 tokens: the memory budget silently exceeded 4×."""
    with pytest.raises(
        db.PlanError, match="pad_to_multiple_of=64 differs from the sampler's pad_to_multiple_of=1"
    ) as e:
        db.Loader(STORE, db.BucketSampler(STORE.lengths(), max_tokens=64, seed=3), pad_to_multiple_of=64)
    assert (e.value.kind, e.value.setting) == ("invalid_setting", "pad_to_multiple_of")


@settings(max_examples=25, deadline=None)
@given(budget=st.integers(64, 512), multiple=st.sampled_from([1, 2, 8, 64]))
def test_row4_no_batch_ever_exceeds_max_tokens(budget, multiple):
    try:
        s = db.BucketSampler(STORE.lengths(), max_tokens=budget, pad_to_multiple_of=multiple, seed=1)
    except db.PlanError as error:
        assert "pad_to_multiple_of" in str(error) or "max_tokens" in str(error)
        return
    for batch in db.Loader(STORE, s):
        assert batch["input_ids"].numel() <= budget
        assert batch["input_ids"].shape[1] % multiple == 0


# -- row 5: a mutated state --------------------------------------------------------------------------------


def test_row5_an_elastic_origin_at_the_states_own_world_is_refused():
    """It used to resume 128 batches where 123 remained."""
    old = db.BucketSampler(STORE.lengths(), max_tokens=128, seed=3, world_size=2, rank=0)
    for _, _ in zip(range(4), old, strict=False):
        pass
    new = db.BucketSampler(STORE.lengths(), max_tokens=128, seed=3, world_size=3, rank=0)
    new.load_state_dict(old.state_dict())
    for _, _ in zip(range(2), new, strict=False):
        pass
    state = new.state_dict()
    assert state["elastic"]["world_size"] == 2
    fresh = db.BucketSampler(STORE.lengths(), max_tokens=128, seed=3, world_size=3, rank=0)
    with pytest.raises(db.PlanError, match="elastic world_size=3 equals its own world_size=3"):
        fresh.load_state_dict({**state, "elastic": {**state["elastic"], "world_size": 3}})
    with pytest.raises(db.PlanError, match=r"past the|outside"):
        fresh.load_state_dict({**state, "elastic": {**state["elastic"], "step": 10**6}})
    assert not fresh.position.resume_pending, "nothing changed"


# -- row 6: masks -------------------------------------------------------------------------------------------


def _mask_table(mask) -> pa.Table:
    return pa.table({"input_ids": [[1, 2, 3], [4, 5, 6, 7]], "loss_mask": mask})


@pytest.mark.parametrize(
    ("mask", "message"),
    [
        ([[0.5, 0.5, 0.5], [1.0, 1.0, 1.0, 1.0]], r"list\(float64\), but it must be a list .* of 0/1 values"),
        ([[0, 1, 1], [1, 2, 1, 1]], "holds 2 at row 1, position 1"),
        ([[0, -1, 1], [1, 1, 1, 1]], "holds -1 at row 0, position 1"),
    ],
)
def test_row6_a_mask_holding_other_than_0_and_1_is_a_data_error(tmp_path, mask, message):
    """It used to be accepted silently: a 0.5 mask trained every token, a 2 counted as 1."""
    for source in ("memory", "file"):
        table = _mask_table(mask)
        if source == "file":
            path = str(tmp_path / f"{source}.arrow")
            with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            table = path
        with pytest.raises(db.DataError, match=message) as error:
            db.TokenStore(table)
        assert isinstance(error.value, ValueError)


def test_row6_a_bool_mask_reads_the_same_in_memory_and_from_a_file(tmp_path):
    """It used to be accepted in memory and refused from an Arrow file."""
    table = _mask_table([[False, True, True], [True, False, True, True]])
    path = str(tmp_path / "bools.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    memory, file = db.TokenStore(table), db.TokenStore(path)
    assert memory.mask == file.mask == "loss_mask"
    for a, b in zip(db.collate(memory, [0, 1]).values(), db.collate(file, [0, 1]).values(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert db.collate(file, [0, 1])["labels"].tolist() == [[-100, 2, 3, -100], [4, -100, 6, 7]]
    np.testing.assert_array_equal(memory.label_counts(), file.label_counts())


# -- row 7: a file truncated mid-epoch ---------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import os, sys
    import numpy as np, pyarrow as pa
    import dflash_batch as db

    path, change = sys.argv[1], sys.argv[2]
    rows = [list(range(int(n))) for n in np.random.default_rng(0).integers(1, 300, 3000)]
    table = pa.table({"input_ids": rows})
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=100):
            writer.write_batch(batch)
    store = db.TokenStore(path)
    sampler = db.BucketSampler(store.lengths(), max_tokens=4096, seed=0)
    loader = db.Loader(store, sampler, prefetch=1)
    epoch0 = sum(1 for _ in loader)  # the worker is done and idle: nothing reads the file now
    view = store[7]
    size = os.path.getsize(path)
    if change == "truncate":
        os.truncate(path, size // 3)
    else:  # rewritten in place with the same bytes, as a re-run tokenizer writes its output again
        data = open(path, "rb").read()
        os.utime(path, (0, 0))
        open(path, "r+b").write(data)
    outcomes = []
    calls = (lambda: next(iter(loader)), lambda: db.collate(store, [0, 1]), lambda: store[7], lambda: store.gather([3]))
    for call in calls:
        try:
            call()
            outcomes.append("no error")
        except db.DataError as error:
            outcomes.append("DataError: " + str(error).splitlines()[0])
    print(epoch0, len(sampler), *outcomes, sep=chr(10))
    """
)


@pytest.mark.parametrize("change", ["truncate", "rewrite"])
def test_row7_a_file_changed_under_its_store_is_a_data_error_not_a_signal(tmp_path, change):
    """It used to kill the process with SIGBUS (truncated), or train changed rows (rewritten). Every read
    of rows checks the files it touches first; a change racing a read already running is not excluded
    (read/guard.rs), so the change here happens while nothing reads: between two epochs."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "tokens.arrow"), change],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"the child died ({done.returncode}): {done.stderr[-2000:]}"
    epoch0, steps, *outcomes = done.stdout.splitlines()
    assert epoch0 == steps, "the first epoch trained whole"
    assert len(outcomes) == 4 and all("changed while it was mapped" in o for o in outcomes), outcomes
    assert all("tokens.arrow" in o for o in outcomes), "the message names the file"


# -- row 8: settings that meant nothing -----------------------------------------------------------------------


def test_row8_a_cost_no_budget_can_reach_is_refused():
    """cost=(5e-324, 0) made every batch cost nothing: one batch held the whole dataset."""
    for cost in [(5e-324, 0.0), (1e-13, 0.0), (1.0, 1e13)]:
        with pytest.raises(db.PlanError, match="each 0 or between 1e-12 and 1e12") as error:
            db.BucketSampler(STORE.lengths(), max_tokens=128, cost=cost)
        assert error.value.setting == "cost" or error.value.kind in ("invalid_cost", "invalid_setting")
    s = db.BucketSampler(STORE.lengths(), max_tokens=128, cost=(1.0, 1e-12))
    assert max(len(s.plan()[i]) for i in range(len(s.plan()))) * 2 <= 128


def test_row8_explicit_edges_that_do_not_cover_the_lengths_are_refused():
    with pytest.raises(db.PlanError, match="exceeds the last edge 32"):
        db.BucketSampler(STORE.lengths(), max_tokens=128, boundaries=[0, 32])
    short = np.minimum(STORE.lengths(), 32)
    assert db.BucketSampler(short, max_tokens=128, boundaries=[0, 32]).edges == [0, 32]  # one bucket: fine


# -- row 9: the command line ---------------------------------------------------------------------------------


def _strict(text: str) -> object:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_row9_demo_json_is_the_demos_figures_as_strict_json():
    from dflash_batch.tools.cli import main

    out = subprocess.run(
        [sys.executable, "-c", "import sys; from dflash_batch.tools.cli import main; sys.exit(main(sys.argv[1:]))",
         "demo", "--json", "--samples", "5000", "--epochs", "2"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    figures = _strict(out.stdout)
    assert figures["samples"] == 5000 and 0 < figures["stats"]["efficiency"] <= 1
    assert set(figures["baselines"]) == {
        "sorted static batches of 8", "random shuffle, batches of 8", "seed's 6 buckets, token budget"
    }  # fmt: skip
    assert main is not None


@pytest.mark.parametrize("suffix", [".txt", ".npy"])
def test_row9_analyze_one_sample_with_json_is_strict_json(tmp_path, suffix, capsys):
    from dflash_batch.tools.cli import main

    path = tmp_path / f"one{suffix}"
    if suffix == ".npy":
        np.save(path, np.array([100]))
    else:
        path.write_text("100\n")
    assert main(["analyze", str(path), "--json", "--no-peers", "--world-size", "1"]) == 0
    report = _strict(capsys.readouterr().out)
    assert report["samples"] == 1 and report["strategies"]["dflash_batch"]["window_tv"] is None


def test_row9_analyze_refuses_both_sizes(tmp_path, capsys):
    from dflash_batch.tools.cli import main

    path = tmp_path / "l.txt"
    path.write_text("5\n6\n")
    assert main(["analyze", str(path), "--max-tokens", "4096", "--batch-size", "4"]) == 2
    assert "not both" in capsys.readouterr().err


def test_row9_analyze_refuses_a_fifo_without_opening_it(tmp_path, capsys):
    from dflash_batch.tools.cli import main

    fifo = tmp_path / "lengths.txt"
    os.mkfifo(fifo)
    assert main(["analyze", str(fifo), "--no-peers"]) == 2  # opening it would wait for a writer forever
    assert "not a regular file" in capsys.readouterr().err


# -- the elastic resumes the issue names ----------------------------------------------------------------------


def _epoch_accounted(lengths, old_world, new_world, done, **settings_) -> None:
    """Every sample of epoch 0 is trained before the checkpoint, in the resumed rest, carried into epoch
    1, or counted as dropped by a plan's stats (drop_last) — never lost unreported."""
    make = lambda w: db.BucketSampler(lengths, world_size=w, rank=0, seed=1, **settings_)  # noqa: E731
    old = make(old_world)
    plan = old.plan(0)
    done = min(done, plan.steps)
    trained = [int(i) for b in range(done * old_world) for i in plan[b]]
    new = make(new_world)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a carry warns
        new.load_state_dict(old.state_dict(step=0) | {"step": done})
    rest = new.plan(0)
    carried = new.position.origin.carried
    covered = set(trained) | {int(i) for i in rest.indices} | {int(i) for i in carried}
    missing = set(range(len(lengths))) - covered
    reported = plan.stats()["dropped"] + rest.stats()["dropped"]
    assert len(missing) <= reported, f"{len(missing)} sample(s) missing, {reported} reported dropped"
    assert len(trained) + len(rest.indices) == len(set(trained) | {int(i) for i in rest.indices}), "none twice"


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_elastic_resumes_of_the_issue_lose_no_sample_unreported(seed):
    rng = np.random.default_rng(seed)
    _epoch_accounted(rng.integers(1, 100, 20), 2, 3, 1, max_tokens=200, balance_tolerance=0.2, drop_last=True)
    _epoch_accounted(rng.integers(1, 300, 2000), 4, 1, 56, max_tokens=600, drop_last=True, accumulation=4)
    _epoch_accounted(
        rng.integers(1, 300, 300), 4, 2, 2,
        max_tokens=600, trim_steps=True, cost=(1, 1 / 1024), drop_last=True, order="random", accumulation=2,
    )  # fmt: skip


def test_the_rows_file_names_every_row_of_the_issue():
    names = [line for line in Path(__file__).read_text().splitlines() if line.startswith("def test_row")]
    assert {name.split("_")[1] for name in names} >= {f"row{i}" for i in range(1, 10)}

"""``max_docs_per_row`` (issue 63): no packed row holds more samples — pieces, under ``oversize="truncate"`` —
than the cap, on every rank and every path that forms packed rows, with every token of every sample trained
once; the Loader's batches carry at most that many sequences; a checkpoint names a different cap; and the
settings that cannot take a cap refuse it with the builtin a user expects."""

from __future__ import annotations

import itertools

import dflash_batch as db
import numpy as np
import pytest
from _loading import make_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory)


@pytest.mark.filterwarnings("ignore:this sampler split")  # iterated on purpose: pieces() maps the entries
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 900), min_size=1, max_size=300),
    cap=st.integers(1, 9),
    max_tokens=st.sampled_from([256, 512]),
    bucketed=st.booleans(),
    shuffle=st.booleans(),
    cost=st.sampled_from(["tokens", (1.0, 1 / 512)]),
    context_parallel=st.sampled_from([1, 2]),
    oversize=st.sampled_from(["skip", "truncate"]),
    world_size=st.integers(1, 3),
    epoch=st.integers(0, 2),
)
def test_no_row_on_any_rank_holds_more_than_the_cap(
    lengths, cap, max_tokens, bucketed, shuffle, cost, context_parallel, oversize, world_size, epoch
):
    make = lambda rank: db.BucketSampler(  # noqa: E731
        np.asarray(lengths, dtype=np.uint32), max_tokens=max_tokens, mode="packed", bucketed=bucketed,
        shuffle=shuffle, cost=cost, context_parallel=context_parallel, oversize=oversize, world_size=world_size,
        rank=rank, seed=7, max_docs_per_row=cap, drop_last=cap == 1,
    )  # fmt: skip
    try:
        samplers = [make(rank) for rank in range(world_size)]
        for s in samplers:
            s.set_epoch(epoch)
        batches = [list(s) for s in samplers]
    except db.PlanError as e:
        # The documented refusals: every sample skipped, or fewer rows than ranks.
        assert "no batch can be formed" in str(e) or "cannot give each of world_size" in str(e), e
        return
    multiple = 2 * context_parallel if context_parallel > 1 else 1
    tokens = {}
    for s, mine in zip(samplers, batches, strict=True):
        for batch in mine:
            rows, starts, sizes = s.pieces(batch)
            assert 1 <= len(rows) <= cap
            assert int((-(-sizes.astype(np.int64) // multiple) * multiple).sum()) <= max_tokens
            for row, start, size in zip(rows.tolist(), starts.tolist(), sizes.tolist(), strict=True):
                tokens.setdefault(row, []).append((start, size))
    # No token twice; every token of every admitted sample once (truncate), or every sample that fits whole
    # (skip) — unless drop_last dropped the last rows (cap 1 on several ranks: one-sample rows do not split).
    dropped = cap == 1 and world_size > 1
    for row, windows in tokens.items():
        covered = sorted(windows)
        assert all(a[0] + a[1] <= b[0] for a, b in itertools.pairwise(covered))
        if not dropped:
            assert covered[0][0] == 0 and all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(covered))
            assert covered[-1][0] + covered[-1][1] == lengths[row]
    if not dropped:
        fits = {
            r for r, n in enumerate(lengths) if oversize == "truncate" or -(-n // multiple) * multiple <= max_tokens
        }
        assert set(tokens) == fits


@pytest.mark.parametrize("cap", [1, 3])
def test_loader_batches_hold_at_most_the_cap_of_sequences(store, cap):
    sampler = db.BucketSampler(store.lengths(), max_tokens=256, mode="packed", seed=3, world_size=1, rank=0,
                               max_docs_per_row=cap)  # fmt: skip
    batches = list(db.Loader(store, sampler, prefetch=2))
    assert len(batches) == len(sampler)
    for batch, row in zip(batches, sampler, strict=True):
        assert len(batch["cu_seqlens"]) - 1 == len(row) <= cap
        assert int(batch["seq_idx"].max()) + 1 == len(row)


def test_a_cap_of_one_packs_one_sample_a_row_exactly():
    sampler = db.BucketSampler([5, 9, 3, 7], max_tokens=16, mode="packed", world_size=1, rank=0, max_docs_per_row=1)
    assert sorted(b.tolist() for b in sampler) == [[0], [1], [2], [3]]


def test_a_checkpoint_names_a_different_cap_and_resumes_under_the_same():
    lengths = db.seed_workload(5_000, seed=2)
    make = lambda cap: db.BucketSampler(lengths, max_tokens=16384, mode="packed", world_size=2, rank=0,  # noqa: E731
                                        max_docs_per_row=cap)  # fmt: skip
    s = make(8)
    it = iter(s)
    for _ in range(3):
        next(it)
    state = s.state_dict()
    assert state["settings"]["max_docs_per_row"] == 8
    with pytest.raises(db.PlanError, match="max_docs_per_row 8 vs None"):
        make(None).load_state_dict(state)
    with pytest.raises(db.PlanError, match="max_docs_per_row 8 vs 4"):
        make(4).load_state_dict(state)
    resumed = make(8)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in list(make(8))[3:]]
    # A checkpoint without a cap (every one written before the setting) resumes where none is set.
    uncapped = make(None)
    uncapped_state = uncapped.state_dict()
    assert "max_docs_per_row" not in uncapped_state["settings"]
    make(None).load_state_dict(uncapped_state)


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"max_docs_per_row": 4}, ValueError, "must be None for padded batches"),
        ({"mode": "packed", "max_docs_per_row": 0}, ValueError, "between 1 and 4294967295"),
        ({"mode": "packed", "max_docs_per_row": 2**32}, ValueError, "between 1 and 4294967295"),
        ({"mode": "packed", "max_docs_per_row": "8"}, TypeError, "must be an int"),
        ({"mode": "packed", "max_docs_per_row": 2.0}, TypeError, "must be an int"),
    ],
)
def test_a_cap_that_cannot_apply_is_refused_naming_it(settings, error, match):
    with pytest.raises(error, match=match) as caught:
        db.BucketSampler([5, 9], max_tokens=16, world_size=1, rank=0, **settings)
    assert "max_docs_per_row" in str(caught.value)


def test_the_typed_packed_group_takes_the_cap_and_the_padded_one_has_none():
    sampler = db.BucketSampler(db.seed_workload(2_000), batching=db.Packed(16384, max_docs_per_row=4),
                               world=db.World(size=1), rank=0)  # fmt: skip
    assert max(len(b) for b in sampler) <= 4
    with pytest.raises(TypeError):
        db.Padded(max_tokens=4096, max_docs_per_row=4)  # type: ignore[call-arg]

"""Packed mode: the sampler's packed plans, collate_packed against numpy, the Loader, and a real torch check
that a packed row with a block-diagonal causal mask gives every sample the loss it has on its own."""

from __future__ import annotations

import dflash_batch as db
import numpy as np
import pytest
from _arrow import token_rows, token_table, write_ipc
from hypothesis import given, settings
from hypothesis import strategies as st

ROWS = token_rows(60, seed=3, longest=30)
LENGTHS = np.array([len(r) for r in ROWS])


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return db.TokenStore(write_ipc(tmp_path_factory.mktemp("p") / "t.arrow", token_table(ROWS)))


def rows_of(plan: db.Plan) -> list[np.ndarray]:
    return [plan[i] for i in range(len(plan))]


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 700), min_size=1, max_size=300),
    capacity=st.integers(700, 2500),
    bucketed=st.booleans(),
    world=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    shuffle=st.booleans(),
    cost=st.sampled_from(["tokens", (1.0, 1e-3)]),  # an attention price composes unbucketed rows by cost
    threads=st.sampled_from([None, 1, 3]),
)
def test_packed_plans_hold_every_sample_once_within_capacity(
    lengths, capacity, bucketed, world, seed, shuffle, cost, threads
):
    lengths = np.array(lengths)
    s = db.BucketSampler(
        lengths,
        max_tokens=capacity,
        mode="packed",
        bucketed=bucketed,
        world_size=world,
        rank=0,
        seed=seed,
        shuffle=shuffle,
        cost=cost,
        threads=threads,
    )
    try:
        plan = s.plan(1)
    except db.PlanError as e:
        assert "world_size" in str(e)
        return
    assert np.array_equal(np.sort(plan.indices), np.arange(len(lengths)))
    assert all(lengths[r].sum() <= capacity for r in rows_of(plan))
    stats = plan.stats()
    assert stats["utilization"] == pytest.approx(lengths.sum() / (len(plan) * capacity))
    assert stats["padded_tokens"] == len(plan) * capacity
    if bucketed:
        edges = np.array(s.edges)
        for r in rows_of(plan):
            buckets = np.searchsorted(edges, lengths[r], side="left")
            assert len(set(buckets.tolist())) == 1
    assert np.array_equal(plan.indices, s.plan(1).indices)
    one = db.BucketSampler(
        lengths, max_tokens=capacity, mode="packed", bucketed=bucketed, world_size=world, rank=0, seed=seed,
        shuffle=shuffle, cost=cost, threads=1,
    )  # fmt: skip
    assert np.array_equal(plan.indices, one.plan(1).indices) and np.array_equal(plan.offsets, one.plan(1).offsets)


def test_packed_rows_are_nearly_full_and_mix_lengths():
    lengths = db.seed_workload(150_000, seed=2)
    s = db.BucketSampler(lengths, max_tokens=16384, mode="packed", world_size=8, rank=0, accumulation=4)
    plan = s.plan(0)
    stats = plan.stats()
    assert stats["utilization"] > 0.985
    # Rows are random mixes: many rows hold both a short (<1024) and a long (>4096) sample.
    mixed = [r for r in rows_of(plan)[:2000] if lengths[r].min() < 1024 and lengths[r].max() > 4096]
    assert len(mixed) > 500
    assert stats["rank_imbalance_p99"] < 1.05
    assert plan.churn(s.plan(1)) < 0.01


def test_packed_settings_are_checked():
    with pytest.raises(db.PlanError, match="needs max_tokens"):
        db.BucketSampler([5, 6], batch_size=2, mode="packed")
    with pytest.raises(db.PlanError, match=r"max_tokens 64 is not a multiple of 6, .*use max_tokens=66 or 60"):
        db.BucketSampler([5, 6], max_tokens=64, mode="packed", pad_to_multiple_of=6)
    with pytest.raises(db.PlanError, match="bucketed=True"):
        db.BucketSampler([5, 6], max_tokens=64, mode="packed", boundaries=3)
    with pytest.raises(db.PlanError, match="mode='varlen' is invalid"):
        db.BucketSampler([5, 6], max_tokens=64, mode="varlen")
    with pytest.raises(ValueError, match="bucketed=True applies to mode='packed'"):
        db.BucketSampler([5, 6], max_tokens=64, bucketed=True)
    with pytest.raises(db.PlanError, match="length 70 at row 1 exceeds max_tokens 64"):
        db.BucketSampler([5, 70], max_tokens=64, mode="packed")
    with pytest.raises(db.PlanError, match=r"max_tokens=4294967296 is invalid; .* packed mode"):
        db.BucketSampler([5, 6], max_tokens=2**32, mode="packed")


def test_packed_rows_near_the_u32_limit_plan_and_report():
    """Lengths near 2^32 with max_tokens = 2^32 - 1: no overflow in the packer, no table of every length
    up to the longest in stats() (which once aborted the process asking for 36 GB)."""
    lengths = np.array([2**32 - 6, 3, 2**32 - 2_000_000, 7, 10**6], dtype=np.uint32)
    plan = db.BucketSampler(lengths, max_tokens=2**32 - 1, mode="packed", seed=1).plan(0)
    assert sorted(plan.indices.tolist()) == [0, 1, 2, 3, 4]
    stats = plan.stats()
    assert stats["real_tokens"] == int(lengths.astype(np.int64).sum())
    assert stats["padded_tokens"] == len(plan) * (2**32 - 1)
    s = db.BucketSampler([5, 70, 9], max_tokens=64, mode="packed", oversize="skip")
    assert s.plan(0).stats()["skipped"] == 1 and len(s.plan(0)) == 1


def reference(rows, capacity, pad_id=0, label_pad_id=-100):
    ids = np.full(capacity, pad_id)
    labels = np.full(capacity, label_pad_id)
    positions = np.zeros(capacity, dtype=np.int64)
    seq = np.full(capacity, -1)
    cu, at = [0], 0
    for s, tokens in enumerate(rows):
        n = len(tokens)
        ids[at : at + n] = tokens
        labels[at + 1 : at + n] = tokens[1:]
        positions[at : at + n] = np.arange(n)
        seq[at : at + n] = s
        at += n
        cu.append(at)
    return ids, labels, positions, seq, np.array(cu, dtype=np.int32)


@settings(max_examples=40, deadline=None)
@given(
    pick=st.lists(st.integers(0, len(ROWS) - 1), max_size=10, unique=True),
    spare=st.integers(0, 20),
    dtype=st.sampled_from(["int64", "int32"]),
)
def test_collate_packed_matches_numpy(store, pick, spare, dtype):
    capacity = int(LENGTHS[pick].sum()) + spare + 1
    got = db.collate_packed(store, pick, capacity=capacity, dtype=dtype, pad_id=3)
    ids, labels, positions, seq, cu = reference([ROWS[i] for i in pick], capacity, pad_id=3)
    keys = ("input_ids", "labels", "position_ids", "seq_idx")
    for key, expected in zip(keys, (ids, labels, positions, seq), strict=True):
        assert got[key].shape == (1, capacity) and got[key].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got[key][0], expected, err_msg=key)
    np.testing.assert_array_equal(got["cu_seqlens"], cu)
    assert got["cu_seqlens"].dtype == np.int32
    assert got["max_seqlen"] == max((len(ROWS[i]) for i in pick), default=0)


def test_collate_packed_errors(store):
    with pytest.raises(ValueError, match="more than the packed row's capacity 5"):
        db.collate_packed(store, [0, 1], capacity=5)
    with pytest.raises(ValueError, match="capacity=0 is invalid"):
        db.collate_packed(store, [0], capacity=0)
    with pytest.raises(IndexError):
        db.collate_packed(store, [len(ROWS)], capacity=100)
    with pytest.raises(TypeError, match="TokenStore"):
        db.collate_packed([1, 2], [0], capacity=100)


def test_loader_yields_packed_rows(store):
    torch = pytest.importorskip("torch")
    sampler = db.BucketSampler(LENGTHS, max_tokens=64, mode="packed", world_size=2, rank=1, seed=4)
    plan = sampler.plan()
    steps = 0
    with db.Loader(store, sampler, prefetch=2, reuse_buffers=True) as loader:
        for step, batch in enumerate(loader):  # recycled host views are valid until the next batch: check now
            expected = db.collate_packed(store, plan[step * 2 + 1], capacity=64)
            assert set(batch) == {"input_ids", "labels", "position_ids", "seq_idx", "cu_seqlens", "max_seqlen"}
            for key in ("input_ids", "labels", "position_ids", "seq_idx", "cu_seqlens"):
                assert isinstance(batch[key], torch.Tensor)
                np.testing.assert_array_equal(batch[key].numpy(), expected[key], err_msg=key)
            assert batch["max_seqlen"] == expected["max_seqlen"]
            assert batch["cu_seqlens"].dtype == torch.int32
            steps += 1
    assert steps == plan.steps
    assert loader.memory_bytes == 3 * (4 * 64 * 8 + 65 * 4)


def test_packed_loss_equals_per_sample_loss(store):
    """A tiny causal transformer layer: the packed row with a block-diagonal causal mask built from
    cu_seqlens gives each sample exactly the per-token losses it gets alone."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    vocab, dim = 100, 16
    embed = torch.nn.Embedding(vocab, dim)
    position = torch.nn.Embedding(64, dim)
    attention = torch.nn.MultiheadAttention(dim, 2, batch_first=True)
    head = torch.nn.Linear(dim, vocab)

    def losses(ids, positions, mask):
        x = embed(ids) + position(positions)
        y, _ = attention(x, x, x, attn_mask=mask)
        logits = head(y)
        return logits

    pick = [3, 7, 11, 20]
    capacity = int(LENGTHS[pick].sum()) + 5
    batch = db.collate_packed(store, pick, capacity=capacity)
    ids = torch.from_numpy(batch["input_ids"] % vocab)
    positions = torch.from_numpy(batch["position_ids"])
    seq = torch.from_numpy(batch["seq_idx"][0])
    causal = torch.tril(torch.ones(capacity, capacity, dtype=torch.bool))
    same = (seq[:, None] == seq[None, :]) & (seq[:, None] >= 0)
    allowed = causal & same | torch.eye(capacity, dtype=torch.bool)  # padding attends to itself only
    logits = losses(ids, positions, ~allowed)
    labels = torch.from_numpy(batch["labels"][0])
    # Per token: position t predicts label t + 1 (the model-side shift).
    packed_losses = torch.nn.functional.cross_entropy(
        logits[0, :-1], (labels[1:] % vocab).where(labels[1:] >= 0, -100), reduction="none", ignore_index=-100
    )
    cu = batch["cu_seqlens"]
    for s, row in enumerate(pick):
        tokens = torch.from_numpy(ROWS[row].astype(np.int64) % vocab)[None]
        n = tokens.shape[1]
        alone = losses(tokens, torch.arange(n)[None], ~torch.tril(torch.ones(n, n, dtype=torch.bool)))
        expected = torch.nn.functional.cross_entropy(alone[0, :-1], tokens[0, 1:], reduction="none")
        start = int(cu[s])
        got = packed_losses[start : start + n - 1]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # No loss crosses a sample boundary: the first token of each sample is never a target.
    assert all(int(labels[int(cu[s])]) == -100 for s in range(len(pick)))


# -- oversize="truncate": long samples split into capacity-sized pieces -------------------------------


def windows_of(sampler: db.BucketSampler, plan: db.Plan) -> list[tuple[int, int, int]]:
    """(row, start, length) of every entry of every batch."""
    out = []
    for batch in plan:
        rows, starts, lengths = sampler.pieces(batch)
        out.extend(zip(rows.tolist(), starts.tolist(), lengths.tolist(), strict=True))
    return out


def assert_tiles_every_sample(lengths, windows, capacity):
    """Each sample's windows tile [0, L) exactly: every token once, no window over the capacity."""
    by_row: dict[int, list[tuple[int, int]]] = {}
    for row, start, length in windows:
        assert 0 < length <= capacity
        by_row.setdefault(row, []).append((start, length))
    assert sorted(by_row) == list(range(len(lengths)))
    for row, pieces in by_row.items():
        pieces.sort()
        at = 0
        for start, length in pieces:
            assert start == at, f"row {row}: pieces {pieces}"
            at += length
        assert at == lengths[row]
        assert len(pieces) == -(-lengths[row] // capacity)


def test_truncate_splits_long_samples_into_capacity_pieces_exactly():
    lengths = np.array([5, 20, 3, 9, 33, 8])
    sampler = db.BucketSampler(lengths, max_tokens=10, mode="packed", oversize="truncate", seed=1)
    assert (sampler.num_samples, sampler.truncated) == (6, 2)
    plan = sampler.plan(0)
    # 6 first pieces + 1 more of row 1 (20 = 10 + 10) + 3 more of row 4 (33 = 10 + 10 + 10 + 3).
    assert len(plan.indices) == 10 and sorted(plan.indices.tolist()) == list(range(10))
    windows = windows_of(sampler, plan)
    assert sorted(w for w in windows if w[0] in (1, 4)) == [
        (1, 0, 10), (1, 10, 10), (4, 0, 10), (4, 10, 10), (4, 20, 10), (4, 30, 3),
    ]  # fmt: skip
    assert_tiles_every_sample(lengths, windows, 10)
    assert plan.stats()["real_tokens"] == lengths.sum()
    # Nothing long: no pieces, the plan of oversize="error".
    short = db.BucketSampler([5, 6, 7], max_tokens=10, mode="packed", oversize="truncate")
    assert short.truncated == 0 and short.num_samples == 3
    rows, starts, lengths_ = short.pieces(np.array([2, 0]))
    assert rows.tolist() == [2, 0] and starts.tolist() == [0, 0] and lengths_.tolist() == [7, 5]


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=200),
    capacity=st.integers(64, 1000),
    world=st.integers(1, 3),
    seed=st.integers(0, 2**32),
    bucketed=st.booleans(),
)
def test_truncate_keeps_every_token_once_within_capacity(lengths, capacity, world, seed, bucketed):
    lengths = np.array(lengths)
    world = min(world, len(lengths))  # every rank needs a batch (no sample is repeated)
    sampler = db.BucketSampler(
        lengths,
        max_tokens=capacity,
        mode="packed",
        oversize="truncate",
        world_size=world,
        seed=seed,
        bucketed=bucketed,
    )
    try:
        plan = sampler.plan(1)
    except db.PlanError as e:  # fewer packed rows than ranks, each of one piece: nothing to split
        assert world > 1 and "cannot give each of world_size" in str(e)
        return
    assert_tiles_every_sample(lengths, windows_of(sampler, plan), capacity)
    for batch in plan:
        assert sampler.pieces(batch)[2].sum() <= capacity
    assert sampler.truncated == int((lengths > capacity).sum())


def test_iterating_a_truncating_sampler_warns_that_entries_are_pieces():
    sampler = db.BucketSampler([5, 70, 9], max_tokens=64, mode="packed", oversize="truncate")
    with pytest.warns(UserWarning, match=r"split 1 long sample\(s\) into pieces: batch entries ≥ 3"):
        entries = sorted(i for batch in sampler for i in batch.tolist())
    assert entries == [0, 1, 2, 3]
    # Nothing split: nothing to say.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(db.BucketSampler([5, 9], max_tokens=64, mode="packed", oversize="truncate"))


def test_truncate_pieces_near_the_u32_limit_are_exact():
    """Starts near 2^32 come out exact (the pieces' arrays are uint32 running sums that wrap)."""
    lengths = np.array([2**32 - 1, 5, 2**32 - 7], dtype=np.uint32)
    sampler = db.BucketSampler(lengths, max_tokens=2**30, mode="packed", oversize="truncate", seed=3)
    plan = sampler.plan(0)
    windows = windows_of(sampler, plan)
    c = 2**30
    assert sorted(windows) == [
        (0, 0, c), (0, c, c), (0, 2 * c, c), (0, 3 * c, c - 1), (1, 0, 5),
        (2, 0, c), (2, c, c), (2, 2 * c, c), (2, 3 * c, c - 7),
    ]  # fmt: skip


def test_truncate_settings_and_pieces_are_checked():
    with pytest.raises(db.PlanError, match=r"oversize='truncate' splits long samples .* pass mode='packed'"):
        db.BucketSampler([5, 70], max_tokens=64, oversize="truncate")
    # More pieces than a plan's uint32 entries hold: refused before any piece is made.
    with pytest.raises(
        db.PlanError, match=r"into 8,589,934,592 more pieces .* raise max_tokens or pass oversize='skip'"
    ):
        db.BucketSampler(
            np.array([2**32 - 1, 2**32 - 1, 5], dtype=np.uint32), max_tokens=1, mode="packed", oversize="truncate"
        )
    with pytest.raises(db.PlanError, match="oversize='cut' is invalid; use 'error', 'skip' or 'truncate'"):
        db.BucketSampler([5, 70], max_tokens=64, mode="packed", oversize="cut")
    sampler = db.BucketSampler([5, 70], max_tokens=64, mode="packed", oversize="truncate")
    with pytest.raises(db.PlanError, match=r"0 ≤ entry < 3"):
        sampler.pieces([3])
    with pytest.raises(db.PlanError, match="1-D array"):
        sampler.pieces([[0]])
    with pytest.raises(TypeError, match="integer entries, got dtype float64"):
        sampler.pieces(np.array([0.5]))
    # A checkpoint of a truncating sampler names the setting when loaded into a skipping one.
    state = sampler.state_dict()
    with pytest.raises(db.PlanError, match="truncate True vs False"):
        db.BucketSampler([5, 70], max_tokens=64, mode="packed", oversize="skip").load_state_dict(state)


def test_truncating_sampler_pickles_with_its_pieces():
    import pickle

    lengths = np.array([50, 300, 7, 129, 64])
    sampler = db.BucketSampler(lengths, max_tokens=64, mode="packed", oversize="truncate", seed=3)
    again = pickle.loads(pickle.dumps(sampler))
    assert (again.num_samples, again.truncated) == (5, 2)
    np.testing.assert_array_equal(again.plan(2).indices, sampler.plan(2).indices)
    assert windows_of(again, again.plan(2)) == windows_of(sampler, sampler.plan(2))


LONG_ROWS = token_rows(40, seed=9, longest=150)
LONG_LENGTHS = np.array([len(r) for r in LONG_ROWS])


@pytest.fixture(scope="module")
def long_store(tmp_path_factory):
    return db.TokenStore(write_ipc(tmp_path_factory.mktemp("long") / "t.arrow", token_table(LONG_ROWS)))


def in_memory(rows):
    datasets = pytest.importorskip("datasets")
    return db.TokenStore(datasets.Dataset.from_dict({"input_ids": [r.tolist() for r in rows]}))


@pytest.mark.parametrize("mapped", [True, False])
def test_collate_packed_with_windows_matches_numpy(long_store, mapped):
    store = long_store if mapped else in_memory(LONG_ROWS)
    rows, starts, lengths = [3, 0, 3], [0, 5, 40], [40, 7, 1000]  # the last runs to the sample's end
    got = db.collate_packed(store, rows, capacity=300, starts=starts, lengths=lengths)
    pieces = [LONG_ROWS[r][s : s + n] for r, s, n in zip(rows, starts, lengths, strict=True)]
    ids, labels, positions, seq, cu = reference(pieces, 300)
    keys = ("input_ids", "labels", "position_ids", "seq_idx")
    for key, expected in zip(keys, (ids, labels, positions, seq), strict=True):
        np.testing.assert_array_equal(got[key][0], expected, err_msg=key)
    np.testing.assert_array_equal(got["cu_seqlens"], cu)
    assert got["max_seqlen"] == max(len(p) for p in pieces)


@pytest.mark.parametrize("mapped", [True, False])
def test_collate_packed_window_errors(long_store, mapped):
    store = long_store if mapped else in_memory(LONG_ROWS)
    end = int(LONG_LENGTHS[2])
    with pytest.raises(ValueError, match=f"entry 0 starts at token {end}, past the end of its sample"):
        db.collate_packed(store, [2], capacity=300, starts=[end], lengths=[4])
    with pytest.raises(ValueError, match="pass both starts and lengths"):
        db.collate_packed(store, [2], capacity=300, starts=[0])
    with pytest.raises(ValueError, match="starts must be 2 integers, one per index"):
        db.collate_packed(store, [2, 1], capacity=300, starts=[0], lengths=[1, 1])
    with pytest.raises(ValueError, match="lengths must be token counts"):
        db.collate_packed(store, [2], capacity=300, starts=[0], lengths=[-1])


def test_loader_packs_the_pieces_of_long_samples(long_store):
    pytest.importorskip("torch")
    sampler = db.BucketSampler(LONG_LENGTHS, max_tokens=64, mode="packed", oversize="truncate", seed=2)
    assert sampler.truncated == int((LONG_LENGTHS > 64).sum()) > 0
    # Every sample's tokens come back exactly once, piece by piece (positions restart per piece).
    seen: dict[int, list[tuple[int, np.ndarray]]] = {}
    with db.Loader(long_store, sampler, prefetch=2) as loader:
        for batch, entries in zip(loader, sampler.plan(), strict=True):
            rows, starts, _ = sampler.pieces(entries)
            cu = batch["cu_seqlens"].numpy()
            ids, positions = batch["input_ids"].numpy()[0], batch["position_ids"].numpy()[0]
            labels = batch["labels"].numpy()[0]
            for s, (row, start) in enumerate(zip(rows.tolist(), starts.tolist(), strict=True)):
                piece = ids[cu[s] : cu[s + 1]]
                np.testing.assert_array_equal(positions[cu[s] : cu[s + 1]], np.arange(len(piece)))
                assert labels[cu[s]] == -100
                seen.setdefault(row, []).append((start, piece.copy()))
    assert sorted(seen) == list(range(len(LONG_ROWS)))
    for row, pieces in seen.items():
        joined = np.concatenate([p for _, p in sorted(pieces, key=lambda x: x[0])])
        np.testing.assert_array_equal(joined, LONG_ROWS[row])

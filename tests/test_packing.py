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
)
def test_packed_plans_hold_every_sample_once_within_capacity(lengths, capacity, bucketed, world, seed, shuffle):
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
    with pytest.raises(db.PlanError, match="pad_to_multiple_of must be 1"):
        db.BucketSampler([5, 6], max_tokens=64, mode="packed", pad_to_multiple_of=8)
    with pytest.raises(db.PlanError, match="bucketed=True"):
        db.BucketSampler([5, 6], max_tokens=64, mode="packed", boundaries=3)
    with pytest.raises(db.PlanError, match="mode='varlen' is invalid"):
        db.BucketSampler([5, 6], max_tokens=64, mode="varlen")
    with pytest.raises(ValueError, match="bucketed=True applies to mode='packed'"):
        db.BucketSampler([5, 6], max_tokens=64, bucketed=True)
    with pytest.raises(db.PlanError, match="length 70 at row 1 exceeds max_tokens 64"):
        db.BucketSampler([5, 70], max_tokens=64, mode="packed")
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
    with db.Loader(store, sampler, prefetch=2) as loader:
        for step, batch in enumerate(loader):  # host views are valid until the next batch: check now
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

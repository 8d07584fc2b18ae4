"""Context-parallel packing (issue 44): rows whose samples are padded to 2·cp, the batches that carry
``cu_seqlens_padded``, the per-layout attention spread in ``plan.stats()``, and the shard helper — checked
against numpy oracles, on the Loader's real batches, and by a tiny model whose loss over the CP shards
equals its loss over the whole row."""

from __future__ import annotations

import pickle

import dflash_batch as db
import numpy as np
import pytest
from _loading import ROWS, make_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory)


def piece(length, multiple):
    return -(-np.asarray(length, dtype=np.int64) // multiple) * multiple


def rows_of(plan):
    offsets, indices = np.asarray(plan.offsets), np.asarray(plan.indices)
    return [indices[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


def spread_oracle(lengths, plan, capacity, cp, multiple, zigzag):
    """Σ_rows max_rank / Σ_rows mean_rank − 1, each rank's work counted position by position."""
    worst = mean = 0.0
    for row in rows_of(plan):
        work = np.zeros(cp)
        start = 0
        for p in piece(lengths[row], multiple):
            positions = np.arange(p)
            if zigzag:
                chunk = positions // (p // (2 * cp))
                rank = np.minimum(chunk, 2 * cp - 1 - chunk)
            else:
                rank = (start + positions) // (capacity // cp)
            np.add.at(work, rank, positions + 1.0)
            start += p
        worst += work.max()
        mean += work.mean()
    return worst / mean - 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 700), min_size=4, max_size=300),
    cp=st.sampled_from([2, 4, 8]),
    pad=st.sampled_from([1, 3, 16]),
    rows_of_1k=st.integers(1, 4),
    cost=st.sampled_from(["tokens", (1.0, 1 / 4096)]),
    seed=st.integers(0, 2**32),
)
def test_padded_pieces_fit_rows_each_sample_once_and_stats_match_numpy(lengths, cp, pad, rows_of_1k, cost, seed):
    lengths = np.array(lengths)
    multiple = int(np.lcm(2 * cp, pad))
    capacity = -(-1024 * rows_of_1k // multiple) * multiple
    sampler = db.BucketSampler(
        lengths, max_tokens=capacity, mode="packed", context_parallel=cp, pad_to_multiple_of=pad,
        cost=cost, seed=seed, world_size=1, rank=0,
    )  # fmt: skip
    assert sampler.entries.piece_multiple == multiple
    plan = sampler.plan(seed % 3)
    rows = rows_of(plan)
    for row in rows:
        padded = piece(lengths[row], multiple)
        assert padded.sum() <= capacity
        assert np.all(padded % (2 * cp) == 0) and np.all(padded % pad == 0)
    planned = np.concatenate(rows)
    np.testing.assert_array_equal(np.sort(planned), np.arange(len(lengths)))
    stats = plan.stats()
    assert stats["piece_padding_tokens"] == int((piece(lengths, multiple) - lengths).sum())
    assert stats["real_tokens"] == int(lengths.sum())
    assert stats["efficiency"] == pytest.approx(lengths.sum() / (len(rows) * capacity))
    assert stats["context_parallel"] == cp
    assert stats["cp_spread_zigzag"] == pytest.approx(
        spread_oracle(lengths, plan, capacity, cp, multiple, True), abs=1e-9
    )
    assert stats["cp_spread_contiguous"] == pytest.approx(
        spread_oracle(lengths, plan, capacity, cp, multiple, False), rel=1e-9, abs=1e-12
    )
    assert stats["cp_spread_zigzag"] == pytest.approx(0.0, abs=1e-12)  # even by construction
    again = db.BucketSampler(
        lengths, max_tokens=capacity, mode="packed", context_parallel=cp, pad_to_multiple_of=pad,
        cost=cost, seed=seed, world_size=1, rank=0, threads=1,
    ).plan(seed % 3)  # fmt: skip
    np.testing.assert_array_equal(np.asarray(again.indices), np.asarray(plan.indices))


def test_an_exact_small_plan_and_what_padding_costs():
    # cp=2: 5-token samples take 8 of a 16-token row, so 6 need three rows where two held 3 unpadded.
    plain = db.BucketSampler([5] * 6, max_tokens=16, mode="packed", world_size=1, rank=0).plan(0)
    cp = db.BucketSampler([5] * 6, max_tokens=16, mode="packed", context_parallel=2, world_size=1, rank=0).plan(0)
    assert [len(r) for r in rows_of(plain)] == [3, 3]
    assert [len(r) for r in rows_of(cp)] == [2, 2, 2]
    stats = cp.stats()
    assert (stats["real_tokens"], stats["padded_tokens"], stats["piece_padding_tokens"]) == (30, 48, 18)
    assert "cp_spread_zigzag" not in plain.stats() and "piece_padding_tokens" not in plain.stats()


def loader_batches(store, cp, **kwargs):
    sampler = db.BucketSampler(
        store.lengths(),
        max_tokens=264 if kwargs.get("pad_to_multiple_of") == 3 else 256,
        mode="packed",
        context_parallel=cp,
        seed=3,
        world_size=1,
        rank=0,
        **kwargs,
    )
    return sampler, list(db.Loader(store, sampler, prefetch=2))


@pytest.mark.parametrize(("cp", "pad", "multiple"), [(2, 1, 4), (4, 1, 8), (1, 16, 16), (2, 3, 12)])
def test_loader_batches_hold_each_sample_padded_where_cu_seqlens_padded_says(store, cp, pad, multiple):
    sampler, batches = loader_batches(store, cp, pad_to_multiple_of=pad)
    plan_rows = list(sampler)
    assert len(batches) == len(plan_rows)
    assert sampler.entries.piece_multiple == multiple
    for batch, rows in zip(batches, plan_rows, strict=True):
        ids, labels = batch["input_ids"][0].numpy(), batch["labels"][0].numpy()
        positions, seq = batch["position_ids"][0].numpy(), batch["seq_idx"][0].numpy()
        real = np.array([len(ROWS[r]) for r in rows])
        np.testing.assert_array_equal(batch["cu_seqlens"].numpy(), np.concatenate([[0], np.cumsum(real)]))
        padded = piece(real, multiple)
        np.testing.assert_array_equal(batch["cu_seqlens_padded"].numpy(), np.concatenate([[0], np.cumsum(padded)]))
        assert batch["cu_seqlens_padded"].dtype == torch.int32
        assert batch["max_seqlen"] == real.max() and batch["max_seqlen_padded"] == padded.max()
        start = 0
        for s, (r, length, p) in enumerate(zip(rows, real, padded, strict=True)):
            np.testing.assert_array_equal(ids[start : start + length], ROWS[r])
            assert np.all(ids[start + length : start + p] == 0)
            assert np.all(labels[start + length : start + p] == -100) and labels[start] == -100
            np.testing.assert_array_equal(positions[start : start + p], np.arange(p))
            assert np.all(seq[start : start + p] == s)
            start += p
        assert np.all(labels[start:] == -100) and np.all(seq[start:] == -1)
        # What the plan said each step trains on, and the loader's eager path agrees.
        eager = db.Loader(store, sampler).collate(rows)
        for key in ("input_ids", "labels", "cu_seqlens", "cu_seqlens_padded"):
            np.testing.assert_array_equal(eager[key].numpy(), batch[key].numpy())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cp=st.sampled_from([2, 4, 8]), layout=st.sampled_from(["zigzag", "contiguous"]), which=st.integers(0, 10**6))
def test_shards_reassemble_the_row_exactly(store, cp, layout, which):
    capacity = 256
    sampler = db.BucketSampler(
        store.lengths(), max_tokens=capacity, mode="packed", context_parallel=cp, seed=5, world_size=1, rank=0
    )
    rows = list(sampler)
    multiple = sampler.entries.piece_multiple
    batch = db.collate_packed(store, rows[which % len(rows)], capacity=capacity, piece_multiple=multiple)
    shards = [db.context_parallel_shard(batch, cp=cp, rank=r, layout=layout) for r in range(cp)]
    indices = [db.shard_index(batch["cu_seqlens_padded"], capacity, cp, r, layout) for r in range(cp)]
    np.testing.assert_array_equal(np.sort(np.concatenate(indices)), np.arange(capacity))
    for key in ("input_ids", "labels", "position_ids", "seq_idx", "shift_labels"):
        whole = np.empty_like(batch["input_ids"]) if key == "shift_labels" else batch[key]
        rebuilt = np.empty_like(whole)
        for shard, index in zip(shards, indices, strict=True):
            assert shard[key].shape == (1, capacity // cp)
            rebuilt[:, index] = shard[key]
        if key == "shift_labels":
            whole = np.concatenate([batch["labels"][:, 1:], np.full((1, 1), -100)], axis=1)
        np.testing.assert_array_equal(rebuilt, whole)
    if layout == "zigzag":
        np.testing.assert_array_equal(shards[0]["cu_seqlens_padded"], batch["cu_seqlens_padded"] // cp)


def tiny_model(vocab=64, width=16, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def weight(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64) / shape[0] ** 0.5

    return {"embed": weight(vocab, width), "pos": weight(512, width), "q": weight(width, width),
            "k": weight(width, width), "v": weight(width, width), "out": weight(width, vocab)}  # fmt: skip


def token_losses(model, ids, positions, docs, query_at, keys):
    """Per-token cross-entropy terms of one causal attention layer for the queries at row positions
    ``query_at``; ``keys`` is the whole row (ids, positions, docs) as ring attention gathers it."""
    key_ids, key_pos, key_docs = keys
    hidden = model["embed"][ids] + model["pos"][positions]
    key_hidden = model["embed"][key_ids] + model["pos"][key_pos]
    scores = (hidden @ model["q"]) @ (key_hidden @ model["k"]).T
    row_at = torch.arange(len(key_ids))
    allowed = (docs[:, None] == key_docs[None, :]) & (row_at[None, :] <= query_at[:, None])
    attention = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return (attention @ (key_hidden @ model["v"])) @ model["out"]


def test_loss_over_the_cp_shards_equals_the_loss_of_the_whole_row(store):
    """A simulated split: each CP rank computes its shard's queries against the gathered row (what ring
    attention computes in steps), with the shard's own position_ids, seq_idx and shift_labels."""
    model = tiny_model()
    capacity, cp = 256, 4
    sampler = db.BucketSampler(
        store.lengths(), max_tokens=capacity, mode="packed", context_parallel=cp, seed=1, world_size=1, rank=0
    )
    loader = db.Loader(store, sampler, dtype=torch.int64)
    for step, batch in enumerate(loader):
        if step == 3:
            break
        batch["input_ids"] = batch["input_ids"] % 64  # the tiny vocabulary
        batch["labels"] = torch.where(batch["labels"] < 0, batch["labels"], batch["labels"] % 64)
        ids, positions, docs = (batch[k][0] for k in ("input_ids", "position_ids", "seq_idx"))
        docs = torch.where(docs < 0, torch.full_like(docs, 10**6), docs)  # the tail: its own document
        row = torch.arange(capacity)
        shift = torch.cat([batch["labels"][0, 1:], torch.tensor([-100])])
        logits = token_losses(model, ids, positions, docs, row, (ids, positions, docs))
        whole = torch.nn.functional.cross_entropy(logits, shift, ignore_index=-100, reduction="sum")
        for layout in ("zigzag", "contiguous"):
            total = torch.zeros((), dtype=torch.float64)
            for rank in range(cp):
                shard = db.context_parallel_shard(batch, cp=cp, rank=rank, layout=layout)
                at = torch.from_numpy(db.shard_index(batch["cu_seqlens_padded"], capacity, cp, rank, layout))
                shard_docs = torch.where(shard["seq_idx"][0] < 0, torch.full_like(at, 10**6), shard["seq_idx"][0])
                logits = token_losses(
                    model, shard["input_ids"][0], shard["position_ids"][0], shard_docs, at, (ids, positions, docs)
                )
                total += torch.nn.functional.cross_entropy(
                    logits, shard["shift_labels"][0], ignore_index=-100, reduction="sum"
                )
            assert torch.allclose(total, whole, rtol=1e-12), (layout, float(total), float(whole))
        assert whole > 0


def test_unhappy_paths_are_named(store, monkeypatch):
    with pytest.raises(db.PlanError, match="context_parallel=2 splits packed rows over ranks; pass mode='packed'"):
        db.BucketSampler([5, 6], max_tokens=64, context_parallel=2)
    with pytest.raises(db.PlanError, match=r"max_tokens 100 is not a multiple of 8.*2·context_parallel=8.*104 or 96"):
        db.BucketSampler([5, 6], max_tokens=100, mode="packed", context_parallel=4)
    with pytest.raises(db.PlanError, match="context_parallel=0 is invalid"):
        db.BucketSampler([5, 6], max_tokens=64, mode="packed", context_parallel=0)
    with pytest.raises(TypeError):
        db.BucketSampler([5, 6], max_tokens=64, mode="packed", context_parallel="4")
    # Ranks are never guessed from the process count under context parallelism.
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(db.PlanError, match="pass world_size=<data-parallel size> and rank=<data-parallel rank>"):
        db.BucketSampler([5, 6] * 20, max_tokens=64, mode="packed", context_parallel=4)
    db.BucketSampler([5, 6] * 20, max_tokens=64, mode="packed", context_parallel=4, world_size=2, rank=1)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    plain = db.collate_packed(store, [0, 1], capacity=256)
    with pytest.raises(KeyError, match="cu_seqlens_padded"):
        db.context_parallel_shard(plain, cp=2, rank=0)
    batch = db.collate_packed(store, [0, 1], capacity=256, piece_multiple=8)
    for kwargs, message in (
        ({"cp": 0, "rank": 0}, "cp=0 is invalid"),
        ({"cp": 4, "rank": 4}, "rank=4 is invalid for cp=4"),
        ({"cp": 4, "rank": 0, "layout": "ring"}, "layout='ring' is invalid"),
        ({"cp": 8, "rank": 0}, "not a multiple of 2·cp = 16"),  # pieces padded to 8, not 16
        ({"cp": 3, "rank": 0}, "does not split into 3 equal shards"),
    ):
        with pytest.raises(ValueError, match=message):
            db.context_parallel_shard(batch, **kwargs)
    with pytest.raises(db.PlanError, match="piece_multiple=0 is invalid"):
        db.collate_packed(store, [0, 1], capacity=256, piece_multiple=0)
    with pytest.raises(ValueError, match="more than the packed row's capacity 16"):
        db.collate_packed(store, [0, 1], capacity=16, piece_multiple=8)


def test_checkpoints_and_pickles_carry_the_degree(store):
    sampler = db.BucketSampler(
        store.lengths(), max_tokens=256, mode="packed", context_parallel=4, seed=2, world_size=1, rank=0
    )
    assert sampler.schedule.config.settings()["context_parallel"] == 4
    plain = db.BucketSampler(store.lengths(), max_tokens=256, mode="packed", seed=2, world_size=1, rank=0)
    assert "context_parallel" not in plain.schedule.config.settings()  # checkpoints before it still load
    it = iter(sampler)
    next(it)
    state = sampler.state_dict()
    other = db.BucketSampler(
        store.lengths(), max_tokens=256, mode="packed", context_parallel=8, seed=2, world_size=1, rank=0
    )
    with pytest.raises(db.PlanError):
        other.load_state_dict(state)
    again = pickle.loads(pickle.dumps(sampler))
    again.load_state_dict(state)
    rest = [b.tolist() for b in again]
    expected = [b.tolist() for b in list(sampler.plan(0))[1:]]
    assert rest == expected


def test_a_torch_dataloader_and_hf_inputs_see_the_padded_samples(store):
    """The other ways a batch reaches a model: torch's DataLoader over the store (dflash_batch.torch) collates
    as the Loader does, and packed_inputs hands FlashAttention the padded spans."""
    from dflash_batch.adapters.torch import loader as torch_loader

    sampler, batches = loader_batches(store, 4)
    via_torch = list(torch_loader(store, sampler))
    assert len(via_torch) == len(batches)
    for a, b in zip(via_torch, batches, strict=True):
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens", "cu_seqlens_padded"):
            np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())
    pytest.importorskip("transformers")
    from dflash_batch.hf import packed_inputs

    inputs = packed_inputs(batches[0])
    np.testing.assert_array_equal(inputs["cu_seq_lens_q"].numpy(), batches[0]["cu_seqlens_padded"].numpy())
    assert inputs["max_length_q"] == batches[0]["max_seqlen_padded"]


@settings(max_examples=200, deadline=None)
@given(
    cp=st.sampled_from([1, 2, 3, 4, 8]),
    chunks=st.lists(st.integers(0, 6), max_size=12),
    tail=st.integers(0, 5),
    layout=st.sampled_from(["zigzag", "contiguous"]),
)
def test_shard_index_partitions_any_row_and_zigzag_takes_the_paired_chunks(cp, chunks, tail, layout):
    """Any row of samples padded to 2·cp (empty ones too) and any tail: the cp shards are a partition of the
    row, each C / cp long, and under zigzag rank i holds exactly chunks i and 2·cp − 1 − i of every sample."""
    halves = 2 * cp
    lengths = np.array(chunks, dtype=np.int64) * halves
    capacity = int(lengths.sum()) + tail * halves
    if capacity == 0:
        return
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    indices = [db.shard_index(bounds, capacity, cp, r, layout) for r in range(cp)]
    assert all(len(i) == capacity // cp for i in indices)
    np.testing.assert_array_equal(np.sort(np.concatenate(indices)), np.arange(capacity))
    if layout == "zigzag":
        segments = np.append(bounds, capacity) if bounds[-1] < capacity else bounds
        for rank, index in enumerate(indices):
            owner = np.searchsorted(segments, index, side="right") - 1
            size = np.diff(segments)[owner] // halves
            chunk = (index - segments[owner]) // size
            assert np.all((chunk == rank) | (chunk == halves - 1 - rank))


@pytest.mark.parametrize("cp", [np.int64(2), np.uint32(4), np.int8(2)])
def test_a_numpy_integer_context_parallel_never_takes_ranks_from_torchrun(monkeypatch, cp):
    """Regression (issue 59): `context_parallel=np.int64(2)` under torchrun skipped the refusal
    (`isinstance(..., int)`), so CP partners read different rows."""
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(db.PlanError, match="pass world_size=<data-parallel size> and rank=<data-parallel rank>"):
        db.BucketSampler([5, 6] * 20, max_tokens=64, mode="packed", context_parallel=cp)
    sampler = db.BucketSampler([5, 6] * 20, max_tokens=64, mode="packed", context_parallel=cp, world_size=2, rank=1)
    assert sampler.schedule.config.context_parallel == int(cp)


def test_a_cp_checkpoint_resumed_without_cp_names_context_parallel():
    """Regression (issue 59): a cp=2 checkpoint resumed with cp=1 was refused as "different lengths:
    another dataset" (context_parallel is recorded only when > 1)."""
    lengths = [5, 6, 7, 9] * 30
    with_cp = db.BucketSampler(lengths, max_tokens=64, mode="packed", context_parallel=2, world_size=1, rank=0)
    next(iter(with_cp))
    state = with_cp.state_dict()
    plain = db.BucketSampler(lengths, max_tokens=64, mode="packed", world_size=1, rank=0)
    with pytest.raises(db.PlanError, match=r"context_parallel 2 vs 1") as refused:
        plain.load_state_dict(state)
    assert "another dataset" not in str(refused.value)
    with pytest.raises(db.PlanError, match=r"context_parallel 1 vs 2"):
        db.BucketSampler(
            lengths, max_tokens=64, mode="packed", context_parallel=2, world_size=1, rank=0
        ).load_state_dict({**plain.state_dict(), "step": 1})

"""A loss mask beside the tokens (issue 28): found by convention or named, checked row for row, applied by
every collation (padded, packed, packed pieces, the Collator, the Loader) exactly as a numpy reference
says, and counted by ``label_counts`` and the Loader's ``num_items_in_batch``."""

from __future__ import annotations

import pickle

import dflash_batch as db
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

datasets = pytest.importorskip("datasets")


def reference_labels(tokens, mask, kind, label_pad_id):
    """A row's labels: the tokens (or a labels column's values), ``label_pad_id`` where masked."""
    tokens, mask = np.asarray(tokens, dtype=np.int64), np.asarray(mask, dtype=np.int64)
    if kind == "labels":
        return np.where(mask == -100, label_pad_id, mask)
    return np.where(mask == 0, label_pad_id, tokens)


def table(rows, masks, kind):
    return pa.table({"input_ids": pa.array(rows, pa.list_(pa.int32())), kind: pa.array(masks, pa.list_(pa.int64()))})


@st.composite
def masked_rows(draw):
    kind = draw(st.sampled_from(["labels", "completion_mask", "assistant_masks", "loss_mask"]))
    count = draw(st.integers(1, 12))
    rows, masks = [], []
    for _ in range(count):
        row = draw(st.lists(st.integers(1, 500), min_size=0, max_size=20))
        if kind == "labels":
            mask = [draw(st.sampled_from([-100, token, token + 1])) for token in row]
        else:
            mask = draw(st.lists(st.integers(0, 1), min_size=len(row), max_size=len(row)))
        rows.append(row)
        masks.append(mask)
    return kind, rows, masks


@settings(max_examples=150, deadline=None)
@given(data=masked_rows(), label_pad_id=st.sampled_from([-100, -1]), dtype=st.sampled_from(["int64", "int32"]))
def test_padded_collation_applies_the_mask_like_numpy(data, label_pad_id, dtype):
    kind, rows, masks = data
    store = db.TokenStore(table(rows, masks, kind))
    assert store.mask == kind
    indices = np.arange(len(rows))[::-1].copy()
    batch = db.collate(store, indices, label_pad_id=label_pad_id, dtype=dtype)
    width = batch["labels"].shape[1]
    for r, i in enumerate(indices):
        expected = np.full(width, label_pad_id)
        expected[: len(rows[i])] = reference_labels(
            rows[i], masks[i], "labels" if kind == "labels" else "binary", label_pad_id
        )
        np.testing.assert_array_equal(batch["labels"][r], expected)
    counts = [
        int((reference_labels(r, m, "labels" if kind == "labels" else "binary", -100)[1:] != -100).sum())
        for r, m in zip(rows, masks, strict=True)
    ]
    np.testing.assert_array_equal(store.label_counts(), counts)


@settings(max_examples=150, deadline=None)
@given(data=masked_rows(), capacity=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_packed_pieces_apply_their_part_of_the_mask_like_numpy(data, capacity, seed):
    kind, rows, masks = data
    binary = "labels" if kind == "labels" else "binary"
    store = db.TokenStore(table(rows, masks, kind))
    rng = np.random.default_rng(seed)
    # Windows of random rows, as oversize="truncate" plans pieces, packed until the row is full.
    indices, starts, lengths, used = [], [], [], 0
    for i in rng.permutation(len(rows)):
        n = len(rows[i])
        start = int(rng.integers(0, n)) if n else 0
        length = int(rng.integers(0, n - start + 1)) if n else 0
        if used + length > capacity:
            break
        indices.append(i), starts.append(start), lengths.append(length)
        used += length
    batch = db.collate_packed(
        store, np.asarray(indices, dtype=np.int64), capacity=capacity, starts=starts, lengths=lengths
    )
    expected = np.full(capacity, -100)
    at = 0
    for i, start, length in zip(indices, starts, lengths, strict=True):
        piece = reference_labels(rows[i], masks[i], binary, -100)[start : start + length]
        expected[at : at + len(piece)] = piece
        if len(piece):
            expected[at] = -100
        at += len(piece)
    np.testing.assert_array_equal(batch["labels"][0], expected)
    # label_counts of windows: the labels the row keeps after each piece's first token
    got = store.native.label_counts(
        np.asarray(indices, dtype=np.uint64), np.asarray(starts, dtype=np.uint32), np.asarray(lengths, dtype=np.uint32)
    )
    assert int(got.sum()) == int((expected != -100).sum())


def test_the_collator_applies_the_rows_mask_like_the_store():
    rows, masks = [[5, 6, 7, 8], [9, 10]], [[0, 0, 1, 1], [True, False]]
    got = db.Collator()([{"input_ids": r, "completion_mask": m} for r, m in zip(rows, masks, strict=True)])
    assert got["labels"].tolist() == [[-100, -100, 7, 8], [9, -100, -100, -100]]
    plain = db.Collator(mask=None)([{"input_ids": r, "completion_mask": m} for r, m in zip(rows, masks, strict=True)])
    assert plain["labels"].tolist() == [[5, 6, 7, 8], [9, 10, -100, -100]]
    with pytest.raises(ValueError, match="Collator\\(mask='loss_mask'\\): the rows have no such column"):
        db.Collator(mask="loss_mask")([{"input_ids": rows[0]}])


# -- on disk, the Loader, num_items_in_batch --------------------------------------------------------------


@pytest.fixture(scope="module")
def prompt_completion(tmp_path_factory):
    """Rows of a prompt (masked) then a completion, saved as a HF dataset."""
    rng = np.random.default_rng(0)
    rows, masks = [], []
    for _ in range(150):
        prompt, completion = int(rng.integers(1, 30)), int(rng.integers(1, 40))
        rows.append(rng.integers(1, 1000, prompt + completion).tolist())
        masks.append([0] * prompt + [1] * completion)
    path = str(tmp_path_factory.mktemp("mask") / "ds")
    datasets.Dataset.from_dict({"input_ids": rows, "completion_mask": masks}).save_to_disk(path)
    return path, rows, masks


def test_a_store_on_disk_finds_the_mask_and_keeps_it_through_pickling(prompt_completion):
    path, _, masks = prompt_completion
    store = db.TokenStore(path)
    assert store.mask == "completion_mask" and "mask='completion_mask'" in repr(store)
    assert pickle.loads(pickle.dumps(store)).mask == "completion_mask"
    assert db.TokenStore(path, mask=None).mask is None
    np.testing.assert_array_equal(store.label_counts(), [sum(m[1:]) for m in masks])
    # a shuffled datasets view keeps rows and masks together
    shuffled = datasets.load_from_disk(path).shuffle(seed=1)
    view = db.TokenStore(shuffled)
    order = shuffled._indices.column(0).to_numpy()
    np.testing.assert_array_equal(view.label_counts(), [sum(masks[i][1:]) for i in order])


@pytest.mark.parametrize("kind", ["completion_mask", "assistant_masks", "labels"])
@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_the_loader_trains_the_mask_and_counts_only_its_tokens(prompt_completion, tmp_path, mode, kind):
    """Both ranks of a 2-rank plan, GA 4, 2 epochs through ``Loader.set_epoch``: every sample's labels in
    every micro-batch are its mask's (packed rows also mask each sample's first token), and every
    micro-batch of an optimizer step carries the step's label tokens over both ranks."""
    pytest.importorskip("torch")
    _, rows, masks = prompt_completion
    if kind == "labels":
        column = [[t if m else -100 for t, m in zip(r, k, strict=True)] for r, k in zip(rows, masks, strict=True)]
    else:
        column = masks
    path = str(tmp_path / kind)
    datasets.Dataset.from_dict({"input_ids": rows, kind: column}).save_to_disk(path)
    store = db.TokenStore(path)
    assert store.mask == kind
    counted = {}
    for rank in range(2):
        sampler = db.BucketSampler(
            store.lengths(), max_tokens=128, seed=2, mode=mode, accumulation=4, world_size=2, rank=rank
        )
        loader = db.Loader(store, sampler, num_items_in_batch=True)
        for epoch in range(2):
            loader.set_epoch(epoch)
            plan = sampler.plan(epoch)
            for step, batch in enumerate(loader):
                labels, cu = batch["labels"].numpy(), batch.get("cu_seqlens")
                for k, i in enumerate(plan[step * 2 + rank].tolist()):
                    want = reference_labels(rows[i], masks[i], "completion_mask", -100)
                    if cu is None:
                        got = labels[k, : len(rows[i])]
                    else:
                        got, want = labels[0, int(cu[k]) : int(cu[k + 1])], np.r_[-100, want[1:]]
                    np.testing.assert_array_equal(got, want, err_msg=f"sample {i}, epoch {epoch}")
                key = (epoch, step // 4)
                counted.setdefault(key, set()).add(int(batch["num_items_in_batch"]))
    for epoch in range(2):  # the step's count over both ranks: the masked tokens of every sample trained
        plan = sampler.plan(epoch)
        steps = len(plan) // 2
        for window in range(0, steps, 4):
            batches = [plan[s * 2 + r] for s in range(window, min(window + 4, steps)) for r in range(2)]
            want = sum(sum(masks[i][1:]) for b in batches for i in b.tolist())
            assert counted[(epoch, window // 4)] == {want}, (epoch, window)
        planned = sampler.label_tokens(epoch, store=store).tolist()  # what the plan says, without a pass
        assert [counted[(epoch, w)] for w in range(len(planned))] == [{n} for n in planned]


def test_truncated_pieces_count_their_own_part_of_the_mask(prompt_completion):
    path, _, _ = prompt_completion
    store = db.TokenStore(path)
    sampler = db.BucketSampler(store.lengths(), max_tokens=24, mode="packed", oversize="truncate", seed=4)
    assert sampler.truncated > 0
    total = 0
    for batch in sampler:
        entries, starts, lengths = sampler.pieces(batch)
        packed = db.collate_packed(store, entries, capacity=24, starts=starts, lengths=lengths)
        total += int((packed["labels"] != -100).sum())
    assert int(sampler.label_tokens(store=store).sum()) == total


# -- errors, one per kind -----------------------------------------------------------------------------


def test_a_mask_row_of_another_length_names_the_row_and_both_lengths():
    table = pa.table({"input_ids": [[1, 2, 3], [4, 5]], "completion_mask": [[1, 1, 1], [1]]})
    with pytest.raises(db.DataError, match="row 1 has 2 tokens but 1 loss-mask values"):
        db.TokenStore(table)


def test_a_mask_column_of_the_wrong_type_names_the_column_and_the_fix(tmp_path):
    path = str(tmp_path / "strings")
    datasets.Dataset.from_dict({"input_ids": [[1, 2]], "loss_mask": [["a", "b"]]}).save_to_disk(path)
    with pytest.raises(db.DataError, match=r"loss_mask.*reading the loss mask 'loss_mask': store it as integers"):
        db.TokenStore(path)
    assert db.TokenStore(path, mask=None).mask is None


def test_a_named_mask_that_is_not_there_lists_the_columns():
    with pytest.raises(db.DataError, match="no loss-mask column 'labels'; pass mask= one of them"):
        db.TokenStore(pa.table({"input_ids": [[1, 2]]}), mask="labels")
    with pytest.raises(TypeError, match="mask must be 'auto', None or a column name"):
        db.TokenStore(pa.table({"input_ids": [[1, 2]]}), mask=1)


def test_a_megatron_mask_is_a_pair_beside_the_tokens(tmp_path):
    from _megatron import write_pair

    rows, masks = [[1, 2, 3], [4], [5, 6]], [[0, 1, 1], [1], [0, 0]]
    prefix = write_pair(tmp_path / "d", rows)
    assert db.TokenStore(prefix).mask is None  # "auto" and no PREFIX_loss_mask pair: every token trains
    with pytest.raises(db.DataError, match=r"d_labels\.bin/\.idx is missing"):
        db.TokenStore(prefix, mask="labels")
    write_pair(tmp_path / "d_loss_mask", masks, dtype=np.uint8)
    store = db.TokenStore(prefix)
    assert store.mask == "loss_mask"
    assert db.collate(store, [0, 1, 2])["labels"].tolist() == [[-100, 2, 3], [4, -100, -100], [-100, -100, -100]]
    np.testing.assert_array_equal(store.label_counts(), [2, 0, 0])
    assert pickle.loads(pickle.dumps(store)).mask == "loss_mask"
    for found in (db.TokenStore(tmp_path), db.TokenStore(str(tmp_path / "d*"))):  # the mask pair is no data
        assert len(found) == 3 and found.mask == "loss_mask"
    write_pair(tmp_path / "e", rows)
    write_pair(tmp_path / "e_loss_mask", [[0, 1, 1], [1], [0]], dtype=np.uint8)
    with pytest.raises(db.DataError, match="row 2 has 2 tokens but 1 loss-mask values"):
        db.TokenStore(str(tmp_path / "e"))


@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_a_steps_loss_is_the_token_mean_over_the_masks_sample_by_sample(prompt_completion, mode):
    """Micro-batches of one optimizer step, each loss summed and divided by the Loader's
    ``num_items_in_batch``, add up to the mean over the step's masked-in tokens computed one sample at a
    time — the loss a user means, with prompts left out."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from dflash_batch.hf import packed_inputs

    path, rows, masks = prompt_completion
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa",
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    store = db.TokenStore(path)
    sampler = db.BucketSampler(store.lengths(), max_tokens=128, seed=3, mode=mode, accumulation=4)
    plan, total, samples = sampler.plan(), 0.0, []
    with torch.no_grad():
        for step, batch in enumerate(db.Loader(store, sampler, num_items_in_batch=True)):
            if step == 4:
                break
            inputs = packed_inputs(batch) if mode == "packed" else batch
            total += float(model(**inputs).loss)
            samples += plan[step].tolist()
        summed, count = 0.0, 0
        for i in samples:
            ids = torch.tensor([rows[i]])
            labels = torch.tensor([[t if m else -100 for t, m in zip(rows[i], masks[i], strict=True)]])
            kept = int((labels[0, 1:] != -100).sum())
            if kept:
                summed += float(model(input_ids=ids, labels=labels).loss) * kept
                count += kept
    assert total == pytest.approx(summed / count, rel=1e-4)

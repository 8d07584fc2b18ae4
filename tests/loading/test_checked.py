"""``db.checked``: a user's dataset and collator through the sampler, every batch compared with the lengths it
was planned from — a row longer than planned is a DataError at that batch (in-process and from DataLoader
workers), a shorter one a warning once, matching lengths pass silently and train every sample once."""

from __future__ import annotations

import warnings

import dflash_batch as db
import numpy as np
import pytest

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
TEXTS = [" ".join(f"w{int(w)}" for w in RNG.integers(0, 50, size=int(n))) for n in RNG.integers(1, 60, size=300)]


def collate(examples):  # the user's: a chat template adds 3 tokens around every text, pads to the longest
    ids = [[1, 2] + [3] * len(t.split()) + [4] for t in examples]
    longest = max(map(len, ids))
    return {
        "input_ids": torch.tensor([i + [0] * (longest - len(i)) for i in ids]),
        "attention_mask": torch.tensor([[1] * len(i) + [0] * (longest - len(i)) for i in ids]),
    }


def right(text: str) -> int:
    return len(text.split()) + 3


def test_lengths_that_match_the_collator_train_every_sample_once_without_a_word():
    lengths = db.measure_lengths(TEXTS, length=right, workers=1)
    sampler = db.BucketSampler(lengths, max_tokens=256, seed=0)
    dataset, collate_fn = db.checked(TEXTS, collate, lengths)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn)
        for batch, indices in zip(loader, sampler.plan(0), strict=True):
            assert batch["input_ids"].numel() <= 256
            seen += list(indices)
    assert sorted(seen) == list(range(len(TEXTS)))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_length_function_that_leaves_the_template_out_is_refused_at_the_first_batch(workers):
    short = db.measure_lengths(TEXTS, length=lambda t: len(t.split()), workers=1)
    sampler = db.BucketSampler(short, max_tokens=256, seed=0)
    dataset, collate_fn = db.checked(TEXTS, collate, short)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn, num_workers=workers)
    with pytest.raises(db.DataError, match=r"collated to \d+ tokens but planned at \d+.*exceed the budget"):
        next(iter(loader))


def test_lengths_longer_than_the_collators_warn_once_and_the_budget_holds():
    long = db.measure_lengths(TEXTS, length=lambda t: right(t) + 2, workers=1)
    sampler = db.BucketSampler(long, max_tokens=256, seed=0)
    dataset, collate_fn = db.checked(TEXTS, collate, long)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn)
    with pytest.warns(RuntimeWarning, match="collated shorter than planned") as caught:
        batches = list(loader)
    assert len([w for w in caught if "shorter" in str(w.message)]) == 1
    assert all(b["input_ids"].numel() <= 256 for b in batches)


def test_a_batch_without_a_mask_needs_lengths_of_and_bad_arguments_are_refused():
    lengths = np.asarray([right(t) for t in TEXTS])

    def bare(examples):
        return torch.tensor([[1] * right(t) + [0] * (70 - right(t)) for t in examples])

    dataset, collate_fn = db.checked(TEXTS, bare, lengths)
    with pytest.raises(TypeError, match="pass lengths_of="):
        collate_fn([dataset[0], dataset[1]])
    dataset, collate_fn = db.checked(TEXTS, bare, lengths, lengths_of=lambda b: (b != 0).sum(-1))
    assert collate_fn([dataset[3], dataset[7]]).shape == (2, 70)
    with pytest.raises(TypeError, match="pairs of checked's dataset"):
        collate_fn([TEXTS[0]])
    with pytest.raises(TypeError, match="one a row"):
        db.checked(TEXTS, bare, lengths, lengths_of=lambda b: [1])[1]([dataset[0], dataset[1]])
    with pytest.raises(ValueError, match="299 lengths for a dataset of 300"):
        db.checked(TEXTS, bare, lengths[:-1])
    with pytest.raises(TypeError, match="1-D integer array"):
        db.checked(TEXTS, bare, lengths.astype(float))

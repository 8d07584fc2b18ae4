"""The Loader consumes its iteration's plan and the store (issue 60): once an iteration has begun, no batch
asks the sampler for pieces, sources, label tokens or the plan — the sampler only moves the position. Each
test makes those sampler methods raise for the whole iteration and checks the batches against the plan."""

from __future__ import annotations

import dflash_batch as db
import numpy as np
import pytest
from _arrow import token_rows, token_table, write_ipc

torch = pytest.importorskip("torch")

ASKED = ("plan", "pieces", "sources_of", "label_tokens", "truncated", "max_tokens", "mixture")


def refuse_per_batch_questions(monkeypatch):
    """Every sampler method a batch could ask, made to fail the test."""
    for name in ASKED:

        def asked(*_args, name=name, **_kwargs):
            raise AssertionError(f"a batch asked the sampler for {name}")

        monkeypatch.setattr(db.BucketSampler, name, property(asked) if name in ASKED[4:] else asked)


def test_a_packed_epoch_of_pieces_is_read_from_its_plan_alone(tmp_path, monkeypatch):
    rows = token_rows(80, longest=70)
    store = db.TokenStore(write_ipc(tmp_path / "t.arrow", token_table(rows)))
    sampler = db.BucketSampler(store.lengths(), max_tokens=32, mode="packed", oversize="truncate", seed=2)
    plan, entries = sampler.plan(0), sampler.entries
    loader = db.Loader(store, sampler, num_items_in_batch=True)
    windows = [entries.pieces(plan[s]) for s in range(len(plan))]
    refuse_per_batch_questions(monkeypatch)
    got = list(loader)
    assert len(got) == len(windows)
    for batch, (rows_of, starts, lengths) in zip(got, windows, strict=True):
        cu = batch["cu_seqlens"].long().tolist()
        ids = batch["input_ids"][0]
        for k, (row, start, length) in enumerate(zip(rows_of, starts, lengths, strict=True)):
            assert ids[cu[k] : cu[k + 1]].tolist() == rows[row][start : start + length].tolist()
    loader.close()


def test_a_mixtures_sources_and_step_counts_are_read_from_its_plan_alone(tmp_path, monkeypatch):
    a = db.TokenStore(write_ipc(tmp_path / "a.arrow", token_table(token_rows(90, longest=40))))
    b = db.TokenStore(write_ipc(tmp_path / "b.arrow", token_table(token_rows(60, longest=50))))
    mix = db.Mixture({"a": (a, 0.4), "b": (b, 0.6)}, unit="samples")
    sampler = db.BucketSampler(mix, max_tokens=128, world_size=2, rank=0, accumulation=2)
    plan = sampler.plan(0)
    counts = sampler.label_tokens(0, by_source=True)
    loader = db.Loader(mix, sampler, num_items_in_batch=True)
    refuse_per_batch_questions(monkeypatch)
    for step, batch in enumerate(loader):
        assert batch["source"].tolist() == mix.source_of(plan[step * 2]).tolist()
        assert np.array_equal(batch["num_items_per_source"].numpy(), counts[step // 2])
    loader.close()

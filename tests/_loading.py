"""What the Loader's test files share: a small token store and the samplers over it."""

from __future__ import annotations

import threading

import dflash_batch as db
from _arrow import token_rows, token_table, write_ipc

ROWS = token_rows(300, longest=60)


def make_store(tmp_path_factory):
    """The token store of ``ROWS`` (each test file makes it its module-scoped ``store`` fixture)."""
    return db.TokenStore(write_ipc(tmp_path_factory.mktemp("l") / "t.arrow", token_table(ROWS)))


def sampler_for(store, **kwargs):
    kwargs.setdefault("max_tokens", 256)
    return db.BucketSampler(store.lengths(), seed=4, **kwargs)


def workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dflash-batch-loader"]


def as_numpy(batch):
    return {k: v.numpy().copy() for k, v in batch.items()}

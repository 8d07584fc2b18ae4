"""A token store for the GPU scripts: ``lengths`` rows of token ids below ``vocab``, written as an Arrow IPC
stream (1000-row record batches, as HF ``datasets`` writes them) and memory-mapped."""

from __future__ import annotations

import tempfile

import dflash_batch as db
import numpy as np


def token_store(lengths: np.ndarray, vocab: int = 32_000) -> db.TokenStore:
    import pyarrow as pa

    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.asarray(lengths, dtype=np.int64), out=offsets[1:])
    values = (np.arange(offsets[-1], dtype=np.int64) * 7919 % vocab).astype(np.int32)
    table = pa.table({"input_ids": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))})
    path = tempfile.mkdtemp() + "/tokens.arrow"
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=1000):
            writer.write_batch(batch)
    return db.TokenStore(path)

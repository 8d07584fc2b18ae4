"""Arrow fixtures written with pyarrow: small token datasets in both IPC formats."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa


def token_rows(n: int, seed: int = 0, longest: int = 40) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50_000, int(k)).astype(np.int64) for k in rng.integers(1, longest, n)]


def token_table(rows: list[np.ndarray], value_type=None, large: bool = False, seq_len_type=None):
    value_type = value_type or pa.int32()
    seq_len_type = seq_len_type or pa.int64()
    list_type = pa.large_list(value_type) if large else pa.list_(value_type)
    return pa.table(
        {
            "text": pa.array([f"sample {i}" for i in range(len(rows))]),
            "input_ids": pa.array([r.tolist() for r in rows], type=list_type),
            "seq_len": pa.array([len(r) for r in rows], type=seq_len_type),
        }
    )


def write_ipc(path: Path, table: pa.Table, stream: bool = True, batch_rows: int = 7) -> Path:
    """Writes ``table`` uncompressed in record batches of ``batch_rows`` rows."""
    writer_type = pa.ipc.new_stream if stream else pa.ipc.new_file
    with pa.OSFile(str(path), "wb") as sink, writer_type(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)
    return path

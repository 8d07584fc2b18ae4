"""Megatron-LM indexed datasets for the tests: written by the documented layout (fast, no torch: the
mutation children use it), and by megatron-core's own ``IndexedDatasetBuilder`` (the real writer, which
``test_megatron`` checks the layout writer against byte for byte)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

#: The dtype codes of ``megatron.core.datasets.indexed_dataset.DType``.
CODES = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}
DTYPES = {code: dtype for dtype, code in CODES.items()}


def write_pair(prefix: Path | str, rows: list, dtype=np.uint16, documents: list[int] | None = None) -> str:
    """Writes ``prefix.bin``/``prefix.idx`` holding ``rows`` (one sequence each); ``documents`` are the
    boundaries (default: one document per sequence). Returns the prefix."""
    dtype = np.dtype(dtype)
    arrays = [np.asarray(r).astype(dtype) for r in rows]
    lengths = np.array([len(a) for a in arrays], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)[:-1]]).astype(np.int64) * dtype.itemsize
    if documents is None:
        documents = list(range(len(rows) + 1))
    prefix = str(prefix)
    with open(prefix + ".bin", "wb") as f:
        for a in arrays:
            f.write(a.tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", CODES[dtype]))
        f.write(struct.pack("<Q", len(rows)) + struct.pack("<Q", len(documents)))
        f.write(lengths.tobytes() + pointers[: len(rows)].tobytes() + np.asarray(documents, np.int64).tobytes())
    return prefix


def read_with_megatron(prefix: str):
    """megatron-core's own reader of ``prefix`` (imported here: collecting the tests needs no megatron-core)."""
    import warnings

    with warnings.catch_warnings():  # megatron-core warns that Transformer Engine and Apex are absent
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset

    return IndexedDataset(prefix)


def write_with_megatron(prefix: Path | str, documents: list[list], dtype=np.uint16) -> str:
    """Writes ``documents`` (each a list of sequences) with megatron-core's builder. Returns the prefix."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = str(prefix)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.dtype(dtype).type)
    for document in documents:
        for sequence in document:
            builder.add_item(torch.from_numpy(np.asarray(sequence, dtype=np.int64)))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix

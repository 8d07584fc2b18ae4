"""``collate``: a batch of rows padded into ``input_ids``, ``attention_mask``, ``labels``, ``position_ids``.

The work happens in Rust with the GIL released: rows are copied straight from the mapped token files into
the output arrays (right padding). ``L`` is the longest row of the batch rounded up to
``pad_to_multiple_of``; real tokens get mask 1, their token as label and positions ``0..len-1``; padding
gets ``pad_id``, mask 0, ``label_pad_id`` (-100: ignored by cross-entropy) and position 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import dflash_batch._core as _core

from ..base.errors import invalid_setting
from ..data.reading import INDEX_DTYPES, MASK_COLUMNS, TokenStore, index_array
from .context_parallel import padded_cu_seqlens

KEYS = ("input_ids", "attention_mask", "labels", "position_ids")


def output_dtype(dtype: Any) -> str:
    """``"int64"`` or ``"int32"`` from a numpy or torch dtype or its name."""
    name = str(dtype).removeprefix("torch.")
    if name in ("int64", "int32"):
        return name
    try:
        name = np.dtype(dtype).name
    except TypeError:
        pass
    if name not in ("int64", "int32"):
        raise invalid_setting("dtype", f"dtype={dtype!r} is invalid; use int64 (the default) or int32")
    return name


def collate(
    store: TokenStore,
    indices: Any,
    *,
    pad_id: int = 0,
    label_pad_id: int = -100,
    pad_to_multiple_of: int = 1,
    dtype: Any = "int64",
    out: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The padded batch of ``indices`` from ``store``: four ``[rows, L]`` arrays in a dict.

    Without ``out`` the arrays are new (owned by Rust, no extra copy). With ``out`` — a dict of four
    contiguous, writeable arrays of one dtype (int64 or int32, e.g. numpy views of pinned torch
    tensors), each holding at least ``rows × L`` elements — the batch is written into them and the
    returned arrays are ``[rows, L]`` views of their fronts; ``dtype`` is then theirs.
    """
    if not isinstance(store, TokenStore):
        raise TypeError(f"store must be a dflash_batch.TokenStore, got {type(store).__name__}")
    if not (isinstance(indices, np.ndarray) and indices.dtype in INDEX_DTYPES and indices.ndim == 1):
        indices = index_array(indices)
    return _collate(store.native, indices, pad_id, label_pad_id, pad_to_multiple_of, dtype, out)


def _collate(
    inner: _core.TokenStore,
    indices: np.ndarray,
    pad_id: int,
    label_pad_id: int,
    pad_to_multiple_of: int,
    dtype: Any,
    out: dict[str, np.ndarray] | None,
) -> dict[str, np.ndarray]:
    settings = (
        check_token("pad_id", pad_id),
        check_token("label_pad_id", label_pad_id),
        check_multiple(pad_to_multiple_of),
    )
    if out is None:
        *arrays, (rows, width) = _core.collate_new(inner, indices, *settings, output_dtype(dtype))
        return {key: array.reshape(rows, width) for key, array in zip(KEYS, arrays, strict=True)}
    buffers = _buffers(out)
    ids, mask, labels, positions = buffers
    rows, width = _core.collate_into(inner, indices, ids, mask, labels, positions, *settings)
    return {key: _front(buffer, rows, width) for key, buffer in zip(KEYS, buffers, strict=True)}


def check_multiple(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"pad_to_multiple_of must be an int, got {type(value).__name__} {value!r}")
    if not 1 <= value <= 2**32 - 1:
        raise invalid_setting(
            "pad_to_multiple_of", f"pad_to_multiple_of={value!r} is invalid; pass an integer between 1 and 4294967295"
        )
    return int(value)


def check_token(name: str, value: Any) -> int:
    """A pad value as an int64 (the output dtype may narrow it further: checked where it is written)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{name}={value!r} does not fit int64; pass a token id the output dtype holds")
    return int(value)


def _buffers(out: dict[str, np.ndarray]) -> list[np.ndarray]:
    if not isinstance(out, dict) or set(out) != set(KEYS):
        got = sorted(out) if isinstance(out, dict) else type(out).__name__
        raise TypeError(f"out must be a dict with exactly the keys {list(KEYS)}, got {got}")
    return [out[key] for key in KEYS]


def _front(buffer: np.ndarray, rows: int, width: int) -> np.ndarray:
    return buffer.reshape(-1)[: rows * width].reshape(rows, width)


PACKED_KEYS = ("input_ids", "labels", "position_ids", "seq_idx")


def collate_packed(
    store: TokenStore,
    indices: Any,
    *,
    capacity: int,
    pad_id: int = 0,
    label_pad_id: int = -100,
    dtype: Any = "int64",
    starts: Any = None,
    lengths: Any = None,
    piece_multiple: int = 1,
) -> dict[str, Any]:
    """The packed batch of ``indices``: its samples end to end in one row of ``capacity`` tokens.

    Returns ``input_ids``, ``labels``, ``position_ids`` and ``seq_idx`` as ``[1, capacity]`` arrays,
    ``cu_seqlens`` (int32, ``samples + 1`` entries: 0, then each sample's end) and ``max_seqlen`` (int).
    Positions restart at 0 for every sample; ``labels`` hold the tokens (the model shifts them) with
    ``label_pad_id`` at each sample's first token, so no sample learns to predict from the previous
    one; ``seq_idx`` numbers the samples, -1 on padding. Raises ``ValueError`` when the samples hold
    more than ``capacity`` tokens (plan with ``mode="packed", max_tokens=capacity``).

    ``starts`` and ``lengths`` (one per index, or neither) make entry ``s`` the tokens
    ``starts[s] : starts[s] + lengths[s]`` of row ``indices[s]`` (cut at the row's end, like a slice; a
    start past the end is an error): the pieces of a sampler with ``oversize="truncate"``, as
    ``rows, starts, lengths = sampler.pieces(batch)`` gives them.

    ``piece_multiple`` > 1 (context parallelism: ``sampler.entries.piece_multiple``) pads every
    sample to a multiple of it — ``pad_id`` tokens labelled ``label_pad_id``, positions counting on — and
    adds ``cu_seqlens_padded`` (int32: where each sample starts in the row, then the last one's padded
    end) and ``max_seqlen_padded``; ``cu_seqlens`` then sums the real lengths (Megatron THD's
    convention). See :mod:`dflash_batch.loading.context_parallel`.
    """
    if not isinstance(store, TokenStore):
        raise TypeError(f"store must be a dflash_batch.TokenStore, got {type(store).__name__}")
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or not 0 < capacity < 2**31:
        raise invalid_setting(
            "capacity", f"capacity={capacity!r} is invalid; pass the row length in tokens (max_tokens of the plan)"
        )
    if not (isinstance(indices, np.ndarray) and indices.dtype in INDEX_DTYPES and indices.ndim == 1):
        indices = index_array(indices)
    windows = _windows(starts, lengths, len(indices))
    slot = np.empty((len(PACKED_KEYS), int(capacity)), dtype=output_dtype(dtype))
    cu_seqlens = np.empty(len(indices) + 1, dtype=np.int32)
    samples, _, max_seqlen = pack_into(
        store,
        indices,
        slot,
        cu_seqlens,
        check_token("pad_id", pad_id),
        check_token("label_pad_id", label_pad_id),
        windows=windows,
        piece_multiple=_multiple(piece_multiple),
    )
    result: dict[str, Any] = {key: slot[k : k + 1] for k, key in enumerate(PACKED_KEYS)}
    result["cu_seqlens"] = cu_seqlens[: samples + 1]
    result["max_seqlen"] = max_seqlen
    if piece_multiple > 1:
        add_padded(result, piece_multiple)
    return result


def add_padded(batch: dict[str, Any], multiple: int) -> None:
    """Adds ``cu_seqlens_padded`` and ``max_seqlen_padded`` to a packed ``batch`` whose samples are padded
    to ``multiple`` (numpy or torch: computed where ``cu_seqlens`` lies)."""
    batch["cu_seqlens_padded"] = padded_cu_seqlens(batch["cu_seqlens"], multiple)
    batch["max_seqlen_padded"] = -(-int(batch["max_seqlen"]) // multiple) * multiple


def _multiple(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 < value < 2**32:
        raise invalid_setting(
            "piece_multiple",
            f"piece_multiple={value!r} is invalid; pass sampler.entries.piece_multiple (an int ≥ 1)",
        )
    return int(value)


def _windows(starts: Any, lengths: Any, entries: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``starts`` and ``lengths`` as uint32 arrays of one entry per index, or ``None`` for whole samples."""
    if starts is None and lengths is None:
        return None
    if starts is None or lengths is None:
        raise ValueError("pass both starts and lengths (rows, starts, lengths = sampler.pieces(batch)), or neither")
    arrays = []
    for name, values in (("starts", starts), ("lengths", lengths)):
        array = np.asarray(values)
        if array.ndim != 1 or len(array) != entries or (array.size and array.dtype.kind not in "iu"):
            raise ValueError(f"{name} must be {entries} integers, one per index; got {array.shape} of {array.dtype}")
        if array.size and (array.min() < 0 or array.max() >= 2**32):
            raise ValueError(f"{name} must be token counts (0 ≤ value < 2**32)")
        arrays.append(np.ascontiguousarray(array, dtype=np.uint32))
    return arrays[0], arrays[1]


def pack_into(
    store: TokenStore, indices, slot, cu_seqlens, pad_id, label_pad_id, windows=None, piece_multiple=1
) -> tuple[int, int, int]:
    """Packs into a ``[4, capacity]`` slot and ``cu_seqlens``, in Rust.
    ``windows``: ``(starts, lengths)`` of every entry within its sample (see :func:`collate_packed`)."""
    starts, lengths = windows if windows is not None else (None, None)
    return _core.collate_packed_slot(
        store.native, indices, slot, cu_seqlens, pad_id, label_pad_id, starts, lengths, piece_multiple
    )


class Collator:
    """A picklable ``collate_fn`` for a torch ``DataLoader`` over a dataset of tokenized rows — e.g.
    ``DataLoader(hf_dataset, batch_sampler=sampler, collate_fn=db.Collator(), num_workers=2)``.

    Takes the rows the DataLoader fetched (dicts with a ``column`` of token ids, as a HF dataset
    returns them, or the token sequences themselves) and pads them exactly as :func:`collate` does:
    ``input_ids``, ``attention_mask``, ``labels`` and ``position_ids`` as ``[rows, L]`` torch tensors.
    A class, not a lambda, so that DataLoader workers started with ``spawn`` can unpickle it.

    ``mask``: the rows' loss-mask column, applied as a :class:`TokenStore`'s (``"auto"``: the first of
    ``MASK_COLUMNS`` the rows hold; ``None``: none).
    """

    def __init__(
        self,
        *,
        column: str = "input_ids",
        mask: str | None = "auto",
        pad_id: int = 0,
        label_pad_id: int = -100,
        pad_to_multiple_of: int = 1,
        dtype: Any = "int64",
    ) -> None:
        self.column, self.mask, self.pad_id, self.label_pad_id = column, mask, int(pad_id), int(label_pad_id)
        self.pad_to_multiple_of, self.dtype = check_multiple(pad_to_multiple_of), output_dtype(dtype)

    def __call__(self, examples: list[Any]) -> dict[str, Any]:
        import torch

        if not examples:
            raise ValueError("Collator got no examples; a batch needs at least one row")
        store = _rows_store([np.asarray(e[self.column] if isinstance(e, dict) else e) for e in examples], self.column)
        name = self._mask_column(examples[0])
        if name is not None:
            lacking = next((i for i, e in enumerate(examples) if not isinstance(e, dict) or name not in e), None)
            if lacking is not None:
                raise ValueError(
                    f"Collator(mask={self.mask!r}): row {lacking} of this batch has no {name!r} column, which row 0 "
                    "has; every row of a dataset carries the same columns — fix the rows, or pass mask=None"
                )
            values = [np.asarray(e[name]) for e in examples]
            masks = _rows_store([m.astype(np.int8) if m.dtype == bool else m for m in values], name)
            store = store.with_mask(masks, "labels" if name == "labels" else "binary")
        indices = np.arange(len(examples), dtype=np.int64)
        arrays = _collate(store, indices, self.pad_id, self.label_pad_id, self.pad_to_multiple_of, self.dtype, None)
        return {key: torch.from_numpy(array) for key, array in arrays.items()}

    def _mask_column(self, example: Any) -> str | None:
        if self.mask is None or not isinstance(example, dict):
            return None
        if self.mask != "auto":
            if self.mask not in example:
                raise ValueError(
                    f"Collator(mask={self.mask!r}): the rows have no such column; they hold {list(example)}"
                )
            return self.mask
        return next((name for name in MASK_COLUMNS if name in example), None)

    def __repr__(self) -> str:
        return (
            f"Collator(column={self.column!r}, mask={self.mask!r}, pad_id={self.pad_id}, "
            f"label_pad_id={self.label_pad_id})"
        )


def _rows_store(rows: list[np.ndarray], column: str) -> _core.TokenStore:
    """The rows a DataLoader fetched (integer arrays of any width) as a store the Rust collator reads."""
    bad = next((r for r in rows if r.ndim != 1 or (r.size and r.dtype.kind not in "iu")), None)
    if bad is not None:
        raise TypeError(
            f"Collator needs rows of integer token ids in column {column!r}, got an array of "
            f"shape {bad.shape} and dtype {bad.dtype}"
        )
    # Empty rows (numpy makes them float64) must not promote the others' type.
    tokens = np.concatenate([r for r in rows if r.size] or [np.zeros(0, dtype=np.int64)])
    if tokens.dtype.name not in ("int32", "int64", "uint32"):
        if tokens.dtype == np.uint64 and tokens.size and tokens.max() > np.iinfo(np.int64).max:
            raise ValueError(f"Collator got the token id {tokens.max()}, which no output dtype holds")
        tokens = tokens.astype(np.int64)
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([r.size for r in rows], out=offsets[1:])
    return _core.TokenStore.from_rows(tokens, offsets)

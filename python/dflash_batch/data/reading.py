"""``read_lengths``, ``TokenStore`` and ``read_documents``: a dataset's lengths and tokens, read by Rust from
mapped files (Arrow IPC, or Megatron-LM ``.bin``/``.idx`` pairs), or from a table in memory, handed to Rust
through the Arrow C stream interface without a copy.

Lengths are copied out of the files (4 bytes a row), so planning never touches a mapped page and a file
replaced later cannot crash it. Tokens stay mapped: ``store[i]`` is a read-only view into the file.
**Token files must not change while a store maps them** — truncating a mapped file makes the operating
system kill the process on the next read of a lost page (SIGBUS); write new files instead.
"""

from __future__ import annotations

import operator
import os
import sys
from typing import Any

import numpy as np

import dflash_batch._core as _core

from . import lengths_cache
from .sources import Source, resolve


def read_lengths(
    source: Any,
    column: str | None = None,
    *,
    progress: bool | None = None,
    cache: str | os.PathLike[str] | None = None,
) -> np.ndarray:
    """The token length of every row of ``source``, as a read-only 1-D ``uint32`` array (with ``cache``, a
    read-only map of ``uint16`` or ``uint32``).

    Args:
        source: an Arrow IPC file or stream, a ``save_to_disk`` directory, a Megatron-LM dataset by its
            prefix (``path/data_text_document`` for the ``.bin``/``.idx`` pair), a glob, a list of these,
            a ``datasets.Dataset`` (its indices mapping is applied), or a table in memory (a pyarrow
            ``Table``, or any object with ``__arrow_c_stream__``), read in place without a copy.
        column: an integer column (any width), or a list column such as ``"input_ids"`` whose lengths
            come from its offsets without reading the tokens. Default: ``"seq_len"`` when the data has
            it, else ``"input_ids"`` (the column a :class:`TokenStore` reads) — the one rule of every
            reader of lengths (``BucketSampler(path)``, ``dflash-batch analyze``). A Megatron dataset has one
            sequence per sample and no columns: its ``.idx`` lengths are read, whatever ``column`` says.
        progress: show a progress bar over the files (default: when there are several and stderr is a
            terminal).
        cache: a ``.npy`` path in a machine-local directory (``/dev/shm/...`` keeps it in memory). The
            first call writes the lengths there (``uint16`` when they fit) and every call returns a
            read-only map of that file, which a ``BucketSampler`` borrows instead of copying: the
            processes of a machine share one copy. Written again when the files (path, size, modification
            time), the column or the row mapping changed; one process writes while the others wait.

    Raises:
        FileNotFoundError / OSError: the source or one of its files cannot be opened.
        DataError: a file is not Arrow, is truncated or compressed, lacks the column, or holds nulls or
            negative lengths (or a table in memory does); a Megatron pair has a half missing, or an
            ``.idx`` whose magic, version, dtype, counts, pointers or document boundaries do not hold
            against itself and its ``.bin``. The message names the file and the fix.
        IndexError: a ``datasets`` indices mapping names a row past the data.
        ValueError: ``cache`` with a table in memory (no files to tell a stale cache by).
        DataError: ``cache`` names a file this library did not write (it is not overwritten), or a damaged one.
    """
    resolved = resolve(source)
    if cache is not None:
        if resolved.table is not None:
            raise ValueError(
                "cache= keeps lengths read from files, and an in-memory table has none to tell a stale cache by; "
                "np.save the lengths yourself and pass np.load(path, mmap_mode='r') to the sampler"
            )
        # The default's choice follows from the files, which the key names.
        key = lengths_cache.source_key(resolved.paths, column or "", resolved.rows)
        return lengths_cache.cached(cache, key, lambda: _read(resolved, column, progress))
    return _read(resolved, column, progress)


#: The columns lengths are read from when none is named, in order: the first the data has.
DEFAULT_COLUMNS = ("seq_len", "input_ids")


def _read(resolved: Source, column: str | None, progress: bool | None) -> np.ndarray:
    if column is not None:
        return _read_column(resolved, column, progress)
    try:
        return _read_column(resolved, DEFAULT_COLUMNS[0], progress)
    except _core.DataError as missing:
        if not missing_column(missing, DEFAULT_COLUMNS[0]):
            raise
        try:
            return _read_column(resolved, DEFAULT_COLUMNS[1], progress)
        except _core.DataError as again:
            if missing_column(again, DEFAULT_COLUMNS[1]):
                raise missing from None  # it names every column the data has
            raise


def missing_column(error: Exception, column: str) -> bool:
    """Whether ``error`` is the core's refusal of data without ``column`` (its message names it so)."""
    return f"has no column {column!r}".replace("'", '"') in str(error)


def _read_column(resolved: Source, column: str, progress: bool | None) -> np.ndarray:
    if resolved.table is not None:
        return _core.read_table_lengths(resolved.table, column, resolved.rows)
    with Progress(len(resolved.paths), "reading lengths", progress) as bar:
        return _core.read_lengths(list(resolved.paths), column, resolved.rows, bar.callback)


def read_documents(source: Any) -> np.ndarray:
    """The document boundaries of a Megatron-LM dataset, as a read-only ``uint64`` array.

    A sample is one sequence of the ``.idx`` (what SFT-style training reads); documents group
    consecutive sequences. Boundary ``k`` is the sequence that starts document ``k``, and the last is the
    sequence count, so document ``k`` is sequences ``b[k]:b[k + 1]``. Several pairs share one row space
    (as in :func:`read_lengths`): each pair's boundaries are shifted by the sequences before it, and a
    pair whose last document was left open is closed at its end.

    Args:
        source: Megatron prefixes, halves, a glob or a directory of pairs (see :func:`read_lengths`).

    Raises:
        FileNotFoundError: no such pair. DataError: as for :func:`read_lengths`, or a file that is not a
            Megatron dataset (only those record documents).
    """
    resolved = resolve(source)
    if resolved.table is not None or resolved.rows is not None:
        raise _core.DataError(
            f"{resolved.describe()} has no document boundaries: only Megatron .bin/.idx datasets record them"
        )
    return _core.read_documents(list(resolved.paths))


#: Loss-mask columns found by convention (``mask="auto"``), in this order: ``labels`` (each position's
#: label, -100 where the loss ignores it, as Hugging Face models take them), then the 0/1 masks TRL and
#: chat templates write (1 where the loss counts).
MASK_COLUMNS = ("labels", "completion_mask", "assistant_masks", "loss_mask")


class TokenStore:
    """A token column kept memory-mapped, for random access to any sample's tokens.

    ``len(store)``, ``store.lengths()``, ``store[i]`` (a read-only numpy view of row ``i``'s tokens,
    no copy) and ``store.gather(indices)`` (the rows' tokens concatenated, and int64 offsets delimiting
    them). Tokens keep the column's type: any integer width from int8/uint8 to int64/uint32, or a
    Megatron dataset's dtype (uint16 and int32 usually; its float32/float64 codes too, which collation
    requires to hold whole numbers). Pickles as its source: a process that unpickles it maps the files
    again.

    A loss mask beside the tokens is applied by every collation of the store (the :class:`Loader`,
    :func:`collate`, :func:`collate_packed`): positions it masks get ``label_pad_id`` as their label,
    and :meth:`label_counts` counts only the positions it keeps.

    Args:
        source: as for :func:`read_lengths`.
        column: a list (or large list) column of token ids (not used for a Megatron dataset).
        mask: the loss-mask column, row for row with the tokens: ``labels`` (-100 = ignored, any integer
            width) or a 0/1 mask (integers). ``"auto"`` (default) takes the first of
            :data:`MASK_COLUMNS` the data has (none: every token is trained); ``None`` ignores any.
            A row whose mask length differs from its tokens is a ``DataError``. A Megatron dataset's
            mask is a pair beside its own: ``PREFIX_loss_mask.bin/.idx`` (or ``PREFIX_<mask>``).
        progress: as for :func:`read_lengths`.
    """

    def __init__(
        self, source: Any, column: str = "input_ids", *, mask: str | None = "auto", progress: bool | None = None
    ) -> None:
        if mask is not None and not isinstance(mask, str):
            raise TypeError(f"mask must be 'auto', None or a column name, got {type(mask).__name__} {mask!r}")
        self._open(resolve(source), column, mask, progress)

    def _open(self, source: Source, column: str, mask: str | None, progress: bool | None) -> None:
        self._source, self._column, self._mask = source, column, None
        self._inner = _mapped(source, column, progress)
        if mask is None:
            return
        if any(path.endswith(".idx") for path in source.paths):
            self._open_megatron_mask(source, mask)
            return
        for name in MASK_COLUMNS if mask == "auto" else (mask,):
            try:
                masks = _mapped(source, name, False, mask=True)
            except _core.DataError as error:
                if mask == "auto" and "has no column" in str(error):
                    continue
                if "has no column" in str(error):  # the reader's own fix names column=, not mask=
                    raise _core.DataError(
                        f"{str(error).split('; pass column=')[0]}: no loss-mask column {name!r}; pass mask= one of "
                        "them, 'auto', or None"
                    ) from None
                raise _core.DataError(
                    f"{error} (reading the loss mask {name!r}: store it as integers, or pass mask=None to train "
                    "on every token)"
                ) from None
            self._inner = self._inner.with_mask(masks, "labels" if name == "labels" else "binary")
            self._mask = name
            return

    def _open_megatron_mask(self, source: Source, mask: str) -> None:
        """A Megatron dataset's mask is a pair of its own beside each token pair, ``PREFIX_<mask>`` (with
        ``mask="auto"``, the first of :data:`MASK_COLUMNS` present, as for Arrow: ``PREFIX_labels`` with
        -100 ignored, or a 0/1 ``PREFIX_loss_mask``...), with the token pair's sequences and lengths (write
        it with the same indexed-dataset builder)."""

        def halves_of(name: str) -> tuple[str, ...]:
            return tuple(path[: -len(".idx")] + f"_{name}.idx" for path in source.paths)

        candidates = MASK_COLUMNS if mask == "auto" else (mask,)
        found = [n for n in candidates if all(os.path.exists(h) for h in halves_of(n))]
        if mask == "auto" and not found:
            partial = [n for n in candidates if any(os.path.exists(h) for h in halves_of(n))]
            if not partial:
                return
            found = partial  # a mask beside some pairs only: refused below, naming the missing half
        name = found[0] if found else mask
        halves = halves_of(name)
        present = [os.path.exists(half) for half in halves]
        if not all(present):
            missing = halves[present.index(False)]
            raise _core.DataError(
                f"{missing[: -len('.idx')]}.bin/.idx is missing: a Megatron dataset's loss mask {name!r} is a pair "
                "beside each token pair, with the same sequences; write it, or pass mask=None"
            )
        masks = _mapped(Source(paths=halves, rows=source.rows), name, False, mask=True)
        self._inner = self._inner.with_mask(masks, "labels" if name == "labels" else "binary")
        self._mask = name

    @property
    def mask(self) -> str | None:
        """The loss-mask column applied, or ``None``."""
        return self._mask

    @property
    def native(self) -> _core.TokenStore:
        """The Rust store the collators read (mapped tokens, and the mask when one is applied)."""
        return self._inner

    def label_counts(self, rows: Any = None, starts: Any = None, lengths: Any = None) -> np.ndarray:
        """Label tokens of every row (uint32): its positions after the first (a causal LM never predicts
        a row's first token) that the loss mask keeps. With ``rows``, ``starts`` and ``lengths`` (as
        :meth:`BucketSampler.pieces` gives them), those of each token window instead."""
        if rows is None:
            return self._inner.label_counts(np.arange(len(self), dtype=np.uint64))
        return self._inner.label_counts(np.asarray(rows, dtype=np.uint64), starts, lengths)

    @property
    def column(self) -> str:
        return self._column

    @property
    def paths(self) -> tuple[str, ...]:
        """The files mapped, in row order (empty for an in-memory table)."""
        return self._source.paths

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._inner.dtype)

    def __len__(self) -> int:
        return len(self._inner)

    def lengths(self) -> np.ndarray:
        """Tokens per row, as a read-only ``uint32`` array."""
        return self._inner.lengths()

    def __getitem__(self, index: int) -> np.ndarray:
        if isinstance(index, slice):
            raise TypeError("TokenStore rows are read one at a time; use store.gather(indices) for many rows")
        index, rows = operator.index(index), len(self)
        if not -rows <= index < rows:
            raise IndexError(f"row {index} is out of range for a dataset of {rows} rows; valid rows are 0..{rows - 1}")
        return self._inner[index]

    def gather(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        """The tokens of ``indices`` concatenated, and the ``len(indices) + 1`` int64 offsets of each row."""
        if not (isinstance(indices, np.ndarray) and indices.dtype in INDEX_DTYPES and indices.ndim == 1):
            indices = index_array(indices)
        return self._inner.gather(indices)

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self._source, "column": self._column, "mask": self._mask}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._open(state["source"], state["column"], state.get("mask"), False)

    def __repr__(self) -> str:
        mask = f", mask={self._mask!r}" if self._mask else ""
        return (
            f"TokenStore({self._source.describe()}, column={self._column!r}{mask}, rows={len(self)}, "
            f"dtype={self.dtype})"
        )


def _mapped(source: Source, column: str, progress: bool | None, *, mask: bool = False) -> _core.TokenStore:
    """The Rust store of ``column``; ``mask``: a loss-mask column (integers or bools, in memory as in files)."""
    if source.table is not None:
        return _core.TokenStore.from_table(source.table, column, source.rows, mask=mask)
    with Progress(len(source.paths), "mapping tokens", progress) as bar:
        return _core.TokenStore(list(source.paths), column, source.rows, bar.callback, mask=mask)


INDEX_DTYPES = (np.dtype(np.uint32), np.dtype(np.int64), np.dtype(np.uint64), np.dtype(np.int32))


def index_array(indices: Any) -> np.ndarray:
    """Row numbers as a 1-D array of a dtype the Rust side takes (sampler batches already are)."""
    array = np.asarray(indices)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        raise TypeError(f"indices must be a 1-D array of integers, got {array.dtype} of shape {array.shape}")
    return array.astype(np.uint64 if array.dtype.kind == "u" else np.int64)


class Progress:
    """A tqdm bar over ``total`` files (or other ``unit``), fed the count done so far (the Rust reader's
    callback); silent when off. On by default when stderr is a terminal and ``total`` exceeds ``least``."""

    def __init__(self, total: int, what: str, enabled: bool | None, unit: str = "file", least: int = 1) -> None:
        if enabled is None:
            enabled = total > least and sys.stderr.isatty()
        self._bar = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=what, unit=unit)

    def callback(self, done: int) -> None:
        if self._bar is not None:
            self._bar.update(done - self._bar.n)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.close()

"""Streams of examples that can be read again from any example: what :class:`~dflash_batch.Windows` plans.

A stream here is read from its start every pass, and from example ``n`` on a resume, so it must give the same
examples in the same order every time it is opened: a list of Parquet files (skipped a row group at a time,
by its metadata, without decoding), a ``datasets.IterableDataset`` without shuffling, any re-iterable
collection, or a function returning a fresh iterator. A one-shot iterator or generator is refused: it could
not be read again on the next pass or after a restart.
"""

from __future__ import annotations

import glob
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from .._core import DataError
from .measured import _validated


class Stream:
    """A source of examples, opened at any example."""

    def __init__(self, source: Any) -> None:
        self._files: list[str] | None = None
        self._open: Callable[[], Iterable[Any]] | None = None
        if isinstance(source, (str, os.PathLike)) or (
            isinstance(source, (list, tuple)) and source and all(isinstance(s, (str, os.PathLike)) for s in source)
        ):
            self._files = _parquet_files(source)
        elif isinstance(source, (bytes, Mapping)):
            raise TypeError(
                f"source must be a stream of examples, got a {type(source).__name__}: for a dict of splits, "
                "pick one (ds['train'])"
            )
        elif callable(source) and not hasattr(source, "__iter__"):
            self._open = source
        elif isinstance(source, Iterator) or not hasattr(source, "__iter__"):
            raise TypeError(
                f"source must be readable again (every pass, and after a restart), got a one-shot "
                f"{type(source).__name__}: pass a list of Parquet files, a datasets.IterableDataset, a list, "
                "or a function returning a fresh iterator (lambda: my_generator())"
            )
        else:
            self._open = lambda: source

    def describe(self) -> str:
        return f"{len(self._files)} Parquet file(s)" if self._files is not None else "a stream"

    def shards(self) -> Shards | None:
        """Parquet files as row groups that can be read a column or a few rows at a time; None for other
        streams."""
        return None if self._files is None else Shards(self._files)

    def examples(self, start: int) -> Iterator[Any]:
        """The examples from example ``start`` on."""
        if self._files is not None:
            return Shards(self._files).examples(start)
        assert self._open is not None
        opened = self._open()
        if isinstance(opened, (str, bytes, Mapping)) or not hasattr(opened, "__iter__"):
            raise TypeError(f"the source function must return an iterator of examples, got {type(opened).__name__}")
        return itertools.islice(iter(opened), start, None)


def _parquet_files(source: Any) -> list[str]:
    names = [os.fspath(source)] if isinstance(source, (str, os.PathLike)) else [os.fspath(s) for s in source]
    files: list[str] = []
    for name in names:
        if glob.has_magic(name):
            matched = sorted(glob.glob(name))
            if not matched:
                raise FileNotFoundError(f"no file matches {name!r}")
            files.extend(matched)
        elif os.path.isdir(name):
            found = sorted(glob.glob(os.path.join(name, "*.parquet")))
            if not found:
                raise FileNotFoundError(f"{name!r} holds no .parquet file")
            files.extend(found)
        elif not os.path.exists(name):
            raise FileNotFoundError(
                f"{name!r} does not exist: check the path (a list of Parquet files, a glob, a directory)"
            )
        else:
            files.append(name)
    return files


class Shards:
    """Parquet files indexed by row group (their metadata, read when a pass begins): a column of any rows,
    and whole rows of a few, converted to Python only for the rows asked for."""

    def __init__(self, files: list[str]) -> None:
        import pyarrow.parquet as pq

        self._readers: list[Any] = []
        self._groups: list[tuple[int, int, int]] = []  # (file, row group, its first row)
        first = 0
        for f, path in enumerate(files):
            reader = _open_parquet(pq, path)
            self._readers.append(reader)
            for group in range(reader.metadata.num_row_groups):
                self._groups.append((f, group, first))
                first += reader.metadata.row_group(group).num_rows
        self.rows = first
        self._files = files
        self._starts = np.asarray([g[2] for g in self._groups], dtype=np.int64)

    def examples(self, start: int) -> Iterator[dict[str, Any]]:
        """Every example from row ``start`` on, as dicts; row groups before it are skipped by their metadata."""
        for table in self._tables(start, self.rows, None):
            yield from table.to_pylist()

    def column(self, name: str, start: int, stop: int) -> Any:
        """Column ``name`` of rows ``start`` to ``stop`` (an Arrow chunked array), reading that column only."""
        import pyarrow as pa

        parts = []
        for table in self._tables(start, stop, [name]):
            if name not in table.column_names:
                raise TypeError(
                    f"the Parquet files have no column {name!r} (they hold {self._schema_names()}); pass column= "
                    "naming the length field"
                )
            parts.append(table.column(name))
        return pa.chunked_array([c for part in parts for c in part.chunks], type=parts[0].type)

    def take(self, rows: np.ndarray) -> list[dict[str, Any]]:
        """The examples at ``rows`` (ascending), as dicts: each row group they fall in is read, and only those
        rows are converted to Python."""
        out: list[dict[str, Any]] = []
        groups = np.searchsorted(self._starts, rows, side="right") - 1
        for g in np.unique(groups):
            wanted = rows[groups == g] - self._starts[g]
            out.extend(self._read(int(g), None).take(wanted).to_pylist())
        return out

    def _schema_names(self) -> list[str]:
        return list(self._readers[0].schema_arrow.names) if self._readers else []

    def _tables(self, start: int, stop: int, columns: list[str] | None) -> Iterator[Any]:
        first = max(0, int(np.searchsorted(self._starts, start, side="right")) - 1)
        for g in range(first, len(self._groups)):
            lo = int(self._starts[g])
            if lo >= stop:
                break
            table = self._read(g, columns)
            yield table.slice(max(0, start - lo), min(stop, lo + table.num_rows) - max(start, lo))

    def _read(self, g: int, columns: list[str] | None) -> Any:
        import pyarrow as pa

        f, group, _ = self._groups[g]
        path = self._files[f]
        try:
            return self._readers[f].read_row_group(group, columns=columns)
        except (pa.ArrowInvalid, OSError) as error:
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path!r} is gone: the stream's files changed while it was read") from None
            raise DataError(f"{path!r}, row group {group}: cannot be read ({error}): a corrupt shard") from None


def _open_parquet(pq: Any, path: str) -> Any:
    import pyarrow as pa

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as error:
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path!r} is gone: the stream's files changed while it was read") from None
        raise DataError(f"{path!r} is not a readable Parquet file ({error}): a truncated or corrupt shard") from None


def column_lengths(values: Any, column: str, start: int) -> np.ndarray:
    """A window's length column (integers, or lists whose lengths count) as ``uint32`` (``start``: the stream's
    index of its first value, which errors name)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
        values = pc.list_value_length(values)
    elif not pa.types.is_integer(values.type):
        raise TypeError(f"column {column!r} holds {values.type}: pass column= naming an integer or a list column")
    if values.null_count:
        first = int(np.flatnonzero(pc.is_null(values).to_numpy(zero_copy_only=False))[0])
        raise DataError(f"example {start + first}: its {column!r} is null; every example needs a length")
    return _validated(values.to_numpy(), start).astype(np.uint32)


def length_in(example: Any, column: str) -> Any:
    """An example's length field, or the length of its token list."""
    try:
        value = example[column]
    except (KeyError, TypeError, IndexError):
        fields = list(example) if isinstance(example, dict) else type(example).__name__
        raise TypeError(
            f"an example ({fields}) has no field {column!r}; pass column= naming its length field"
        ) from None
    return len(value) if isinstance(value, (list, tuple, np.ndarray)) else value


def held(examples: list[Any], rows: np.ndarray) -> list[Any]:
    """The examples at ``rows`` of a window held in memory."""
    return [examples[i] for i in rows.tolist()]


def taken(shards: Shards, first: int, rows: np.ndarray) -> list[Any]:
    """The examples at ``rows`` of the window of ``shards`` starting at example ``first``."""
    return shards.take(rows.astype(np.int64) + first)

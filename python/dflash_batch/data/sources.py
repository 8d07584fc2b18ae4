"""Turning what users pass as a dataset into what the Rust readers take: a list of files.

Accepted sources: one Arrow IPC file or stream (``.arrow``, ``.feather``, ``.ipc``), a directory
written by ``datasets.Dataset.save_to_disk`` (its shards in the order ``state.json`` lists), any other
directory of Arrow files (sorted by name), a glob, a list of any of these, a ``datasets.Dataset``, or a
table in memory (a pyarrow ``Table``, or any object with ``__arrow_c_stream__``), which Rust reads in place.

Megatron-LM indexed datasets are named by their prefix (``path/data_text_document`` for the pair
``data_text_document.bin`` + ``.idx``), by either half, by a glob over prefixes or halves, or by a
directory of pairs (sorted by name); each pair is passed on as its ``.idx``, and Rust maps both halves.

A ``Dataset`` backed by its cache files (the usual case: loaded from disk, or produced by ``.map()``)
is read from those files directly; an indices mapping (from ``select``/``shuffle``/``filter``) becomes
a row mapping applied on top. A ``Dataset`` whose table is not simply its files — held in memory, or
with lazy operations such as a rename or a slice recorded on top of them — is handed to Rust as its
pyarrow table instead (the Arrow C stream interface), still without copying the token column.
"""

from __future__ import annotations

import errno
import glob
import json
import os
import stat
from dataclasses import dataclass
from typing import Any

import numpy as np

ARROW_SUFFIXES = (".arrow", ".feather", ".ipc", ".arrows")
MEGATRON_SUFFIXES = (".idx", ".bin")


@dataclass(frozen=True)
class Source:
    """A resolved source: Arrow files in order, or a pyarrow table; plus an optional row mapping."""

    paths: tuple[str, ...] = ()
    table: Any = None
    rows: np.ndarray | None = None

    def describe(self) -> str:
        if self.table is not None:
            return "an in-memory table"
        return self.paths[0] if len(self.paths) == 1 else f"{len(self.paths)} files"


def resolve(source: Any) -> Source:
    """Resolves ``source`` (see the module docs); raises ``FileNotFoundError`` or ``TypeError``."""
    refuse_collections_and_streams(source)
    if is_dataset(source):
        return _from_dataset(source)
    if hasattr(source, "__arrow_c_stream__"):  # a pyarrow Table, or any table that speaks the Arrow C stream
        return Source(table=source)
    if isinstance(source, (list, tuple)):
        if not source:
            raise FileNotFoundError("the list of files is empty; pass at least one Arrow file")
        return Source(paths=tuple(p for item in source for p in _paths(item)))
    # What each path is (a FIFO would block the open forever) is the core's check, where it maps them.
    return Source(paths=tuple(_paths(source)))


def _as_index(path: str) -> str:
    """A Megatron pair named by either half, as its ``.idx``; any other path as it is."""
    return path[: -len(".bin")] + ".idx" if path.endswith(".bin") else path


def _once(paths: list[str]) -> list[str]:
    """One glob's matches with each pair kept once (``data/*`` matches both halves), and without the
    loss-mask pairs that sit beside token pairs (``X_loss_mask`` beside ``X``: see ``TokenStore``). A
    pair the user lists twice is read twice, as an Arrow file listed twice is."""
    return _without_mask_pairs(list(dict.fromkeys(paths)))


#: Suffixes of the Megatron mask pairs a ``TokenStore`` finds beside a token pair (``MASK_COLUMNS``).
MASK_PAIRS = ("_labels.idx", "_completion_mask.idx", "_assistant_masks.idx", "_loss_mask.idx")


def _without_mask_pairs(paths: list[str]) -> list[str]:
    kept = set(paths)
    return [p for p in paths if not any(p.endswith(s) and p[: -len(s)] + ".idx" in kept for s in MASK_PAIRS)]


def regular_file(path: str, fix: str, limit: int | None = None) -> None:
    """A file Python opens itself (a sidecar, a lengths file the CLI reads) must be a regular one: opening a
    FIFO blocks until a writer comes, forever for a reader of a dataset, and a device reads forever. With
    ``limit``, a file over that many bytes is refused too (what a reader of text would hold in memory)."""
    try:
        mode = os.stat(path).st_mode
    except PermissionError as error:
        raise PermissionError(f"{path} cannot be read ({error.strerror}); check its permissions") from None
    if not stat.S_ISREG(mode):
        kinds = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket"}
        kind = next((name for test, name in kinds.items() if test(mode)), "a device")
        raise _data_error(f"{path} is {kind}, not a regular file; {fix}")
    size = os.stat(path).st_size
    if limit is not None and size > limit:
        raise _data_error(f"{path} holds {size:,} bytes, over the {limit:,} this reads; {fix}")


def is_source(value: Any) -> bool:
    """Whether ``value`` names files or a dataset (rather than holding lengths)."""
    if isinstance(value, (str, os.PathLike)) or is_dataset(value) or _dataset_kind(value) is not None:
        return True
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, (str, os.PathLike)) for v in value)


def is_dataset(value: Any) -> bool:
    """A ``datasets.Dataset`` (map-style, not a dict of splits or a stream), without importing datasets."""
    return any(k.__name__ == "Dataset" and k.__module__.startswith("datasets") for k in type(value).__mro__)


def _dataset_kind(value: Any) -> str | None:
    """``"splits"`` for a ``DatasetDict`` (or its iterable kind), ``"stream"`` for an iterable or streaming
    dataset (``datasets`` or torch), else ``None``."""
    kinds = {(klass.__module__.split(".")[0], klass.__name__) for klass in type(value).__mro__}
    if kinds & {("datasets", "DatasetDict"), ("datasets", "IterableDatasetDict")}:
        return "splits"
    if kinds & {("datasets", "IterableDataset"), ("torch", "IterableDataset")}:
        return "stream"
    return None


def refuse_collections_and_streams(value: Any) -> None:
    kind = _dataset_kind(value)
    if kind == "splits":
        splits = list(value.keys())
        first = splits[0] if splits else "train"
        raise TypeError(
            f"got a {type(value).__name__} with splits {splits}; dflash_batch reads one split: pass dataset[{first!r}]"
        )
    if kind == "stream":
        raise TypeError(
            f"got an iterable dataset ({type(value).__name__}), whose rows are produced one by one and are not "
            "on disk or in memory; dflash_batch plans whole epochs from every row's length: materialize it "
            "(datasets.Dataset.from_generator(lambda: (yield from stream)), or load it without streaming=True) "
            "or save_to_disk it and pass the directory"
        )


def _paths(item: Any) -> list[str]:
    if not isinstance(item, (str, os.PathLike)):
        raise TypeError(f"a source must be a path, a list of paths or a datasets.Dataset, got {type(item).__name__}")
    path = os.fspath(item)
    if os.path.isdir(path):
        return _directory(path)
    if os.path.exists(path):
        return [_as_index(path)]
    if any(os.path.exists(path + suffix) for suffix in MEGATRON_SUFFIXES):
        return [path + ".idx"]  # a Megatron prefix (Rust names a missing half)
    if glob.has_magic(path):
        matches = _once([_as_index(m) for m in sorted(glob.glob(path))])
        if not matches:  # a glob over Megatron prefixes: `data/*_text_document`
            matches = sorted({m[:-4] + ".idx" for suffix in MEGATRON_SUFFIXES for m in glob.glob(path + suffix)})
        if not matches:
            _reachable(os.path.dirname(path) or ".", path)
            raise FileNotFoundError(f"no files match the pattern {path!r}")
        return [p for m in matches for p in (_directory(m) if os.path.isdir(m) else [m])]
    _reachable(path, path)
    raise FileNotFoundError(
        f"{path} does not exist; pass an Arrow file, a save_to_disk directory, a Megatron prefix "
        "(the path before .bin/.idx) or a glob"
    )


def _reachable(path: str, given: str) -> None:
    """Raises what keeps ``path`` out of reach when it is not that it is missing: ``exists()`` and
    ``glob`` say nothing for a path behind an unsearchable directory, or one longer than the system takes."""
    try:
        os.stat(path)
    except PermissionError as error:
        raise PermissionError(
            f"{given} cannot be reached ({error.strerror}): a directory on its path cannot be searched; "
            "check its permissions"
        ) from None
    except OSError as error:
        if error.errno == errno.ENAMETOOLONG:
            raise OSError(
                errno.ENAMETOOLONG,
                f"{given[:80]}... ({len(given)} characters) is longer than the system accepts in a path "
                f"({os.pathconf('/', 'PC_PATH_MAX')} bytes) or a name in it; pass a shorter path, or a "
                "symlink to the folder",
            ) from None
    if glob.has_magic(given) and os.path.isdir(path) and not os.access(path, os.R_OK | os.X_OK):
        raise PermissionError(f"the pattern {given!r} cannot be matched: directory {path} cannot be listed")


def _directory(path: str) -> list[str]:
    state = os.path.join(path, "state.json")
    if os.path.exists(state):
        files = _state_files(state)
        if files:
            return [os.path.join(path, name) for name in files]
    splits = os.path.join(path, "dataset_dict.json")
    if os.path.exists(splits):
        fix = "pass one split's directory (the folders beside dataset_dict.json)"
        names = _json_object(splits, "the object DatasetDict.save_to_disk writes", fix).get("splits", [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise _data_error(f"{splits}: splits is {names!r}, not a list of split names; {fix}")
        example = os.path.join(path, names[0]) if names else os.path.join(path, "train")
        raise FileNotFoundError(
            f"{path} holds a DatasetDict with splits {names}; pass one split's directory, e.g. {example!r}"
        )
    names = os.listdir(path)
    files = sorted(os.path.join(path, n) for n in names if n.endswith(ARROW_SUFFIXES))
    if not files:  # a directory of Megatron pairs, each named once
        files = sorted({os.path.join(path, n[:-4] + ".idx") for n in names if n.endswith(MEGATRON_SUFFIXES)})
        files = _without_mask_pairs(files)
    if not files:
        raise FileNotFoundError(
            f"no Arrow files ({', '.join('*' + s for s in ARROW_SUFFIXES)}) nor Megatron pairs (*.bin + *.idx) in "
            f"directory {path}; pass a directory written by datasets' save_to_disk or one holding Arrow IPC files"
        )
    return files


def _state_files(state: str) -> list[str]:
    """The shard file names a ``save_to_disk`` directory's ``state.json`` lists, checked entry by entry."""
    fix = "write the dataset again with save_to_disk, or delete state.json to read the directory's Arrow files"
    content = _json_object(state, "the object save_to_disk writes", fix)
    files = content.get("_data_files", [])
    if not isinstance(files, list):
        raise _data_error(f"{state}: _data_files is a {type(files).__name__}, not a list of shards; {fix}")
    names = []
    for k, entry in enumerate(files):
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise _data_error(f"{state}: shard entry {k} ({entry!r}) has no filename; {fix}")
        names.append(name)
    return names


def _json_object(path: str, expected: str, fix: str) -> dict:
    """A sidecar JSON file's object (``state.json``, ``dataset_dict.json``): anything else — not a regular
    file, not JSON in UTF-8, not an object — is a ``DataError`` naming the file and what was expected."""
    regular_file(path, f"it should be a file holding {expected}; {fix}")
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise _data_error(f"{path} is not JSON in UTF-8 ({error}); it should hold {expected}; {fix}") from None
    if not isinstance(content, dict):
        raise _data_error(f"{path} holds a {type(content).__name__}, not {expected}; {fix}")
    return content


def _data_error(message: str) -> Exception:
    from .._core import DataError

    return DataError(message)


def _from_dataset(dataset: Any) -> Source:
    if len(dataset) == 0:
        raise _data_error(
            "the datasets.Dataset holds no rows (an empty select or filter leaves none); pass a dataset with at "
            "least one sample"
        )
    rows = None
    # `datasets` publishes no accessor for a dataset's indices mapping (`flatten_indices()` would copy
    # every row): its `_indices` table is the one private field this library reads, to map rows in place.
    indices = getattr(dataset, "_indices", None)
    if indices is not None:
        rows = np.ascontiguousarray(indices.column(0).to_numpy(), dtype=np.uint64)
    paths = _plain_files(dataset.data)
    if paths is None:
        return Source(table=dataset.data.table, rows=rows)
    return Source(paths=tuple(paths), rows=rows)


def _plain_files(table: Any) -> list[str] | None:
    """The files behind a ``datasets`` table when the table is exactly those files stacked in order:
    memory-mapped, with no lazy operations recorded on top; else ``None``."""
    from datasets.table import ConcatenationTable, MemoryMappedTable

    if isinstance(table, MemoryMappedTable):
        return [table.path] if not table.replays else None
    if isinstance(table, ConcatenationTable):
        paths: list[str] = []
        for row in table.blocks:
            if len(row) != 1:  # horizontally concatenated: columns come from several tables
                return None
            inner = _plain_files(row[0])
            if inner is None:
                return None
            paths += inner
        return paths
    return None

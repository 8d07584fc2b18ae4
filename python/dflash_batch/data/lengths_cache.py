"""``read_lengths(..., cache=path)``: a dataset's lengths kept in one ``.npy`` file, which every process of a
machine maps read-only, so each :class:`~dflash_batch.BucketSampler` borrows them instead of copying and the
page cache holds them once (``docs/billion.md``).

The file is numpy's ``.npy`` (``uint16`` when every length fits, else ``uint32``) followed by a trailer: a
magic word, a digest of what the lengths were read from (each file's path, inode, size, modification
and change times, the column, a ``datasets`` row mapping) and a CRC-32 of the array's bytes, checked each
time the file is mapped (a bit flipped in the data is a ``DataError``, never lengths planned from; the
check reads every page, which the planner then reads from the page cache anyway). The change time is in
the key because tools that copy a dataset into place (``cp -p``, ``rsync -t``, ``tar x``) set the
modification time back to the source's: a rewritten file of the same size would otherwise pass for the
one cached. No call sets a change time back, and replacing a file by renaming gives another inode.

A cache whose digest differs — the files changed, another column — is written again; a file at the path
that does not end with the trailer was not written here and is refused rather than overwritten. One
process writes while the others wait on ``<path>.lock`` (``flock``, so a machine-local directory), to a
temporary name renamed into place: a writer killed midway leaves no file at the path. This stays in Python
because the file is numpy's format, mapped by numpy.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import dflash_batch._core as _core

from .sources import regular_file

MAGIC = b"DFLLENS2"
#: What caches written before the content checksum began with: theirs to rewrite, not to refuse.
OLD_MAGIC = b"DFLLENS1"
#: The fix a refusal of a FIFO, socket or device at the cache's (or its lock's) name names.
_NOT_REGULAR = "remove it, or pass another cache="
#: The magic word, a SHA-256 digest of the source and the data's CRC-32 (8 bytes, little-endian), after
#: the array.
TRAILER = len(MAGIC) + 32 + 8


def source_key(paths: Sequence[str], column: str, rows: np.ndarray | None) -> bytes:
    """The digest of what lengths read from ``paths`` (in order) and ``column`` through ``rows`` depend on."""
    digest = hashlib.sha256(b"dflash_batch lengths\0" + column.encode() + b"\0")
    for path in paths:
        status = os.stat(path)
        stamp = (status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)
        digest.update(f"{os.path.abspath(path)}\0{stamp}\0".encode())
    if rows is not None:
        digest.update(b"rows\0" + np.ascontiguousarray(rows, dtype=np.int64).tobytes())
    return digest.digest()


def cached(path: str | os.PathLike[str], key: bytes, read: Callable[[], np.ndarray]) -> np.ndarray:
    """The lengths kept at ``path`` for ``key``, read with ``read()`` and written there first when the file
    is missing or was written for another key; a read-only ``numpy.memmap`` of the file."""
    path = os.path.abspath(os.fspath(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.lexists(path + ".lock"):
        regular_file(path + ".lock", _NOT_REGULAR)  # a FIFO would block the open below
    with open(path + ".lock", "ab") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        found = _mapped(path, key)
        if found is None:
            _write(path, key, read())
            found = _mapped(path, key)
    if found is None:  # another process rewrote it between the write and the map: it is not ours to trust
        raise _core.DataError(f"the lengths cache {path} changed while it was written; run again")
    return found


def _mapped(path: str, key: bytes) -> np.ndarray | None:
    """A read-only map of the cache at ``path`` when it was written for ``key``; ``None`` when there is no
    file or it holds another key's lengths; ``DataError`` for a file this module did not write."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return None
    regular_file(path, _NOT_REGULAR)
    with open(path, "rb") as file:
        file.seek(max(size - TRAILER, 0))
        trailer = file.read(TRAILER)
        file.seek(max(size - (len(OLD_MAGIC) + 32), 0))
        if file.read(len(OLD_MAGIC)) == OLD_MAGIC:
            return None  # an earlier version's cache (no content checksum): written again
    if len(trailer) < TRAILER or not trailer.startswith(MAGIC):
        raise _core.DataError(
            f"{path} is not a lengths cache dflash_batch wrote (it does not end with one's trailer), so "
            "cache= will not overwrite it; delete it or pass another path"
        )
    if trailer[len(MAGIC) : len(MAGIC) + 32] != key:
        return None
    try:
        lengths: Any = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as err:
        raise _core.DataError(f"the lengths cache {path} is damaged ({err}); delete it and read again") from err
    whole = isinstance(lengths, np.memmap) and lengths.offset + lengths.nbytes + TRAILER == size
    if not whole or lengths.ndim != 1 or lengths.dtype not in (np.uint16, np.uint32):
        raise _core.DataError(f"the lengths cache {path} is damaged (its array and size disagree); delete it")
    if _checksum(lengths) != trailer[len(MAGIC) + 32 :]:
        raise _core.DataError(
            f"the lengths cache {path} is damaged: its data does not match the checksum written with it (a "
            "changed byte: disk or memory corruption, or an edit); delete it and read the lengths again"
        )
    return lengths


def _checksum(lengths: np.ndarray) -> bytes:
    """CRC-32 of the array's bytes, as the trailer's 8 bytes."""
    data = np.ascontiguousarray(lengths).view(np.uint8)  # a view: no copy of the lengths
    return zlib.crc32(data.data).to_bytes(8, "little")


def _write(path: str, key: bytes, lengths: np.ndarray) -> None:
    """Writes ``lengths`` (narrowed to ``uint16`` when they fit) and the trailer for ``key`` to ``path``,
    through a temporary renamed into place. The caller holds the lock: temporaries left are dead writers'."""
    for dead in glob.glob(glob.escape(path) + ".tmp-*"):
        os.remove(dead)
    narrow = lengths.astype(np.uint16) if lengths.size == 0 or int(lengths.max()) < 1 << 16 else lengths
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with open(temporary, "wb") as file:
            np.save(file, narrow, allow_pickle=False)
            file.write(MAGIC + key + _checksum(narrow))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise

"""``measure_lengths``: the token length of every example after the user's own preprocessing (a chat
template, truncation, image tokens: any ``fn(example) -> length``, or a tokenizer fed ``text(example)``),
computed in parallel and cached.

With a ``tokenizers`` tokenizer (or a ``transformers`` fast one, through its ``backend_tokenizer``) the
lengths come from its own batch encoding, which counts tokens in Rust; what runs in Python per example (the
``text`` function, a ``length`` function) runs in worker processes, each on a contiguous chunk, so the
result is the same whatever the worker count. The workers are forked (where the system forks): a lambda and
an in-memory dataset reach them without pickling, and each worker tokenizes on one thread, so ``workers``
processes use ``workers`` cores. Forking is what a torch ``DataLoader`` and ``datasets.map(num_proc=)`` do too,
with the same caveat: a function that itself starts threads or runs OpenMP kernels (torch ops) in the
workers belongs in ``workers=1``.

The cache is ``read_lengths``'s (``lengths_cache.py``): one ``.npy`` file with a trailer naming what the
lengths depend on, mapped read-only by every process of a machine, written by one while the others wait.
Here that is the data — the files behind a ``datasets.Dataset`` (path, inode, size, times) and its row
mapping, or, for data in memory, a digest of its content — and the function: the tokenizer's own
serialization (vocabulary, normalizer, post-processor), ``add_special_tokens``, and ``version``, a string the
user changes when their preprocessing changes (a cache cannot see inside a function, so ``version`` is
required wherever one is involved).
"""

from __future__ import annotations

import gc
import hashlib
import multiprocessing
import os
import pickle
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

import dflash_batch._core as _core

from . import lengths_cache
from .reading import Progress
from .sources import is_dataset, refuse_collections_and_streams, resolve

#: Examples a worker measures at a time (and a progress step).
CHUNK = 1024


def measure_lengths(
    examples: Any,
    *,
    tokenizer: Any = None,
    text: Callable[[Any], str] | None = None,
    length: Callable[[Any], int] | None = None,
    version: str | None = None,
    add_special_tokens: bool = True,
    cache: str | os.PathLike[str] | None = None,
    workers: int | None = None,
    progress: bool | None = None,
) -> np.ndarray:
    """The token length of every example, as your preprocessing makes it, for ``BucketSampler(lengths)``.

    Args:
        examples: a ``datasets.Dataset`` (one split, map-style) or any sequence of examples
            (``len`` and ``[i]``), in the order the sampler's indices refer to.
        tokenizer: a ``tokenizers.Tokenizer`` or a ``transformers`` tokenizer: a length is the number of
            tokens it encodes ``text(example)`` to. Exactly one of ``tokenizer`` and ``length``.
        text: what is tokenized, from an example: for chat data, your template
            (``lambda ex: tok.apply_chat_template(ex["messages"], tokenize=False)``). Default: the example
            itself when it is a string, else its ``"text"`` field.
        length: ``fn(example) -> int``, any other preprocessing (image tokens, truncation).
        version: names your preprocessing (``text`` / ``length``, the template, the truncation); change it
            when they change, and a cache is measured again. Required with ``cache`` and a function.
        add_special_tokens: as the tokenizer's own argument (BOS/EOS): pass what your collator passes.
        cache: a ``.npy`` path in a machine-local directory: measured once, then every call (every
            process of the machine) maps the file. Measured again when the data or the function changed.
        workers: processes for ``text`` / ``length`` and a tokenizer without a Rust backend (default: this
            machine's cores; 1 measures in this process).
        progress: a progress bar over examples (default: when stderr is a terminal and there are many).

    Returns:
        A read-only 1-D ``uint32`` array (with ``cache``, a read-only map of ``uint16`` or ``uint32``).

    Raises:
        TypeError: not one of ``tokenizer`` and ``length``; ``text`` without a tokenizer; examples that are
            not a sized sequence (a stream, a dict of splits); an example with no text to tokenize.
        ValueError: ``cache`` with a function and no ``version``; ``workers`` below 1.
        DataError: a ``length`` function returned something that is not a length (the example is named), or
            ``cache`` names a file this library did not write.
        RuntimeError: a worker process died (killed, out of memory).
        Whatever your ``text`` / ``length`` function raises, as it raised it.
    """
    measure = _measure_of(tokenizer, text, length, add_special_tokens)
    refuse_collections_and_streams(examples)
    if isinstance(examples, (str, bytes, Mapping)):
        raise TypeError(
            f"examples must be a sequence of examples, got a {type(examples).__name__}: for columns, "
            "datasets.Dataset.from_dict(...); for one text, [text]"
        )
    if not hasattr(examples, "__len__") or not hasattr(examples, "__getitem__"):
        raise TypeError(
            f"examples must be a sequence (len and [i]) or a datasets.Dataset, got {type(examples).__name__}; "
            "materialize a stream first (list(...), or datasets.Dataset.from_generator)"
        )
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be an integer ≥ 1, got {workers!r}")
    if version is not None and not isinstance(version, str):
        raise TypeError(f"version must be a string naming your preprocessing, got {type(version).__name__}")
    if cache is None:
        return _measured(examples, measure, workers, progress)
    if version is None and (text is not None or length is not None or measure.needs_version):
        raise ValueError(
            "cache= with a text or length function needs version='…' naming your preprocessing: a cache cannot "
            "see inside a function, so a changed template would be served stale lengths. Change the version "
            "whenever the function changes"
        )
    key = _key(examples, measure.identity + b"\0" + (version or "").encode())
    return lengths_cache.cached(cache, key, lambda: _measured(examples, measure, workers, progress))


class _Measure:
    """How a chunk of examples becomes lengths, and what that depends on."""

    def __init__(self, lengths_of: Callable[[list[Any]], Any], identity: bytes, needs_version: bool) -> None:
        self.lengths_of, self.identity, self.needs_version = lengths_of, identity, needs_version


def _measure_of(tokenizer: Any, text: Callable[[Any], str] | None, length: Any, special: bool) -> _Measure:
    if (tokenizer is None) == (length is None):
        raise TypeError("pass exactly one of tokenizer= (with text= if needed) and length=")
    if length is not None:
        if text is not None:
            raise TypeError("text= feeds a tokenizer; with length= your function measures the example itself")
        if not callable(length):
            raise TypeError(f"length must be a function of an example, got {type(length).__name__}")
        return _Measure(lambda chunk: [length(example) for example in chunk], b"length", True)
    if text is not None and not callable(text):
        raise TypeError(f"text must be a function of an example, got {type(text).__name__}")
    render = text or _default_text
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if hasattr(backend, "encode_batch_fast") and hasattr(backend, "to_str"):
        identity = b"tokenizers\0" + hashlib.sha256(backend.to_str().encode()).digest() + bytes([special])

        def encoded(chunk: list[Any]) -> np.ndarray:
            texts = [render(example) for example in chunk]
            return np.fromiter((len(e) for e in backend.encode_batch_fast(texts, add_special_tokens=special)), np.int64)

        return _Measure(encoded, identity, False)
    if not callable(tokenizer):
        raise TypeError(
            f"tokenizer must be a tokenizers.Tokenizer or a transformers tokenizer, got {type(tokenizer).__name__}"
        )

    def slow(chunk: list[Any]) -> np.ndarray:
        ids = tokenizer([render(example) for example in chunk], add_special_tokens=special)["input_ids"]
        return np.fromiter((len(i) for i in ids), np.int64)

    return _Measure(slow, b"tokenizer\0" + type(tokenizer).__qualname__.encode() + bytes([special]), True)


def _default_text(example: Any) -> str:
    if isinstance(example, str):
        return example
    if isinstance(example, Mapping) and isinstance(example.get("text"), str):
        return example["text"]
    fields = list(example) if isinstance(example, Mapping) else type(example).__name__
    raise TypeError(
        f"an example ({fields}) has no text to tokenize: pass text=lambda ex: … returning what your collator "
        "tokenizes (for chat data, tokenizer.apply_chat_template(ex['messages'], tokenize=False))"
    )


def _validated(values: Any, start: int) -> np.ndarray:
    """``values`` (a chunk's lengths from example ``start``) as ``int64``; ``DataError`` naming the first
    example whose length is not an integer from 0 to 2**32 - 1."""
    bad: Any
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        bad = np.flatnonzero((values < 0) | (values >= 1 << 32))
    else:
        values = list(values)
        bad = [
            i for i, v in enumerate(values)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not 0 <= v < 1 << 32
        ]  # fmt: skip
    if len(bad):
        raise _core.DataError(
            f"example {start + int(bad[0])}: its length is {values[bad[0]]!r}; length= must return the example's "
            "token count, an integer from 0 to 2**32 - 1"
        )
    return np.asarray(values, dtype=np.int64)


def _measured(examples: Any, measure: _Measure, workers: int | None, progress: bool | None) -> np.ndarray:
    total = len(examples)
    starts = list(range(0, total, CHUNK))
    workers = min(workers or os.cpu_count() or 1, max(1, len(starts)))
    out = np.empty(total, dtype=np.uint32)
    done = 0
    with Progress(total, "measuring lengths", progress, unit="example", least=10 * CHUNK) as bar:
        for start, got in _chunks(examples, measure, starts, workers):
            if len(got) != min(CHUNK, total - start):
                raise _core.DataError(
                    f"examples {start}…: the function gave {len(got)} lengths for {min(CHUNK, total - start)} examples"
                )
            out[start : start + len(got)] = got
            done += len(got)
            bar.callback(done)
    out.flags.writeable = False
    return out


# What forked workers measure: set before the pool forks, so nothing of it is pickled.
_JOB: tuple[Any, _Measure] | None = None


def _chunks(examples: Any, measure: _Measure, starts: list[int], workers: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, lengths)`` of every chunk, in order."""
    global _JOB
    if workers == 1 or "fork" not in multiprocessing.get_all_start_methods():
        for start in starts:
            yield start, _measure_chunk_of(examples, measure, start)
        return
    _JOB = (examples, measure)
    # The workers share the examples copy-on-write; a garbage collection in a worker would walk (and so copy)
    # every object of this process's heap: frozen, they stay out of its reach until the pool is gone. (A
    # caller who froze the heap already keeps their own freeze, untouched.)
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    try:
        context = multiprocessing.get_context("fork")
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_one_thread)
        try:
            yield from zip(starts, pool.map(_worker, starts), strict=True)
        finally:  # an error, or a caller that stops early: the chunks not started are dropped, not measured
            pool.shutdown(wait=True, cancel_futures=True)
    except BrokenProcessPool:
        raise RuntimeError(
            "a worker process measuring lengths died (killed, or out of memory); pass workers=1 to measure in "
            "this process, or fewer workers"
        ) from None
    finally:
        if freeze:
            gc.unfreeze()
        _JOB = None


def _one_thread() -> None:
    # Each worker is one of `workers` processes: the tokenizer's Rust pool would otherwise take every core.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _worker(start: int) -> np.ndarray:
    assert _JOB is not None
    return _measure_chunk_of(*_JOB, start)


def _measure_chunk_of(examples: Any, measure: _Measure, start: int) -> np.ndarray:
    return _validated(measure.lengths_of(_rows(examples, start, min(start + CHUNK, len(examples)))), start)


def _rows(examples: Any, start: int, stop: int) -> list[Any]:
    """Examples ``start`` to ``stop`` as a list: a ``datasets.Dataset`` is read a column batch at a time
    (a row at a time costs ~20 µs each), a list sliced, anything else indexed."""
    if is_dataset(examples):
        columns = examples[start:stop]
        names = list(columns)
        return [dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    if isinstance(examples, (list, tuple)):
        return list(examples[start:stop])
    return [examples[i] for i in range(start, stop)]


def _key(examples: Any, function: bytes) -> bytes:
    """What the lengths depend on: the data (its files and row mapping, or its content) and ``function``."""
    tag = "measured\0" + function.hex()
    if is_dataset(examples):
        source = resolve(examples)
        if source.table is None:
            return lengths_cache.source_key(source.paths, tag, source.rows)
        return _content_key(tag, _table_bytes(source.table, source.rows))
    return _content_key(tag, (pickle.dumps(example, protocol=5) for example in examples))


def _content_key(tag: str, parts: Any) -> bytes:
    digest = hashlib.sha256(b"dflash_batch measured lengths\0" + tag.encode() + b"\0")
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.digest()


def _table_bytes(table: Any, rows: np.ndarray | None):
    """An in-memory table's content, batch by batch, as Arrow IPC bytes (and its row mapping)."""
    import pyarrow as pa

    for batch in table.to_batches():
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        yield sink.getvalue()  # hashed through the buffer protocol: no copy
    if rows is not None:
        yield b"rows" + np.ascontiguousarray(rows, dtype=np.uint64).tobytes()

"""The convergence benchmark's data, built offline from this Python's own standard library: documents whose
kind tracks their length — docstrings (short prose), functions and classes (medium code), whole modules
(long) — tokenized with a byte-level BPE trained here with ``tokenizers``, and drawn so their lengths
follow the seed workload's histogram scaled to ``max_len`` (``shared/CONTEXT.md``: 5.4% under 1/16 of the
longest, then 19.2%, 33.7%, 28.3%, 13.4% in bins that double). Files are split whole into training and
held-out documents, so no function is in both."""

from __future__ import annotations

import ast
import hashlib
import json
import pathlib
import sysconfig
from dataclasses import dataclass

import numpy as np

#: The seed histogram's bins as fractions of its longest sample (8,192 tokens), and their shares.
SEED_BINS = ((64 / 8192, 512 / 8192), (512 / 8192, 1024 / 8192), (1 / 8, 1 / 4), (1 / 4, 1 / 2), (1 / 2, 1.0))
SEED_SHARES = (0.054, 0.192, 0.337, 0.283, 0.134)
#: Characters of text the tokenizer is trained on (about).
TOKENIZER_CHARS = 3_000_000
#: Every n-th source file (by a hash of its path) is held out.
HELD_OUT_EVERY = 8


@dataclass
class Corpus:
    """Token ids of the training and held-out documents, the length bands (token edges), the vocabulary."""

    train: list[np.ndarray]
    held_out: list[np.ndarray]
    bands: list[tuple[int, int]]
    vocab: int
    kinds: dict[str, int]

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(t) for t in self.train], dtype=np.uint32)


def source_files(limit: int | None = None) -> list[pathlib.Path]:
    """The standard library's modules (no tests, no third-party packages), in a fixed order."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
    files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
    return files[:limit] if limit else files


def documents(path: pathlib.Path) -> list[tuple[str, str]]:
    """``(kind, text)`` of one source file: every docstring, every function and class, the module."""
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    found = [("module", text)]
    lines = text.splitlines(keepends=True)  # whole lines: ast.get_source_segment rescans the file per node
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            doc = ast.get_docstring(node)
            if doc:
                found.append(("docstring", doc))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.end_lineno:
            segment = "".join(lines[node.lineno - 1 : node.end_lineno])
            found.append(("class" if isinstance(node, ast.ClassDef) else "function", segment))
    return found


def held_out(path: pathlib.Path) -> bool:
    return int(hashlib.sha256(str(path.name).encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


def tokenizer(texts: list[str], vocab: int):
    """A byte-level BPE of ``vocab`` ids trained on ``texts`` (deterministic for the same texts)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def matched(lengths: np.ndarray, max_len: int, samples: int | None, rng: np.random.Generator) -> np.ndarray:
    """Indices of documents drawn so their lengths follow the seed shares in its bins scaled to ``max_len``:
    as many as the scarcest bin allows (or ``samples``), each bin at its share, at random within a bin."""
    bins = [(max(2, int(lo * max_len)), int(hi * max_len)) for lo, hi in SEED_BINS]
    members = [np.flatnonzero((lengths >= lo) & (lengths < hi + (k == 4))) for k, (lo, hi) in enumerate(bins)]
    total = min(len(m) / share for m, share in zip(members, SEED_SHARES, strict=True))
    if samples is not None:
        total = min(total, samples)
    picked = [rng.choice(m, int(total * share), replace=False) for m, share in zip(members, SEED_SHARES, strict=True)]
    return np.sort(np.concatenate(picked))


def build(cache: pathlib.Path, *, max_len: int, vocab: int, samples: int | None, files: int | None) -> Corpus:
    """The corpus for these settings, from ``cache`` when it was built there before."""
    key = f"stdlib-{max_len}-{vocab}-{samples}-{files}"
    place = cache / key
    if (place / "corpus.json").exists():
        return load(place)
    paths = source_files(files)
    train_docs, held_docs, kinds = [], [], {}
    for path in paths:
        for kind, text in documents(path):
            (held_docs if held_out(path) else train_docs).append((kind, text))
    # A BPE of a few thousand ids learns as much from a few MB as from all 13: every k-th document.
    texts = [text for _, text in train_docs]
    step = max(1, sum(map(len, texts)) // TOKENIZER_CHARS)
    tok = tokenizer(texts[::step], vocab)
    rng = np.random.default_rng(0)
    splits = []
    for docs, count in ((train_docs, samples), (held_docs, None)):
        ids = [np.asarray(e.ids, dtype=np.int32) for e in tok.encode_batch([t for _, t in docs])]
        chosen = matched(np.array([len(i) for i in ids]), max_len, count, rng)
        splits.append([ids[i] for i in chosen])
        if docs is train_docs:
            for i in chosen:
                kinds[docs[i][0]] = kinds.get(docs[i][0], 0) + 1
    bands = [(max(2, int(lo * max_len)), int(hi * max_len)) for lo, hi in SEED_BINS]
    corpus = Corpus(splits[0], splits[1], bands, tok.get_vocab_size(), kinds)
    save(place, corpus)
    return corpus


def save(place: pathlib.Path, corpus: Corpus) -> None:
    place.mkdir(parents=True, exist_ok=True)
    for name, docs in (("train", corpus.train), ("held_out", corpus.held_out)):
        np.save(place / f"{name}.npy", np.concatenate(docs))
        np.save(place / f"{name}_lengths.npy", np.array([len(d) for d in docs], dtype=np.int64))
    meta = {"bands": corpus.bands, "vocab": corpus.vocab, "kinds": corpus.kinds}
    (place / "corpus.json").write_text(json.dumps(meta))


def load(place: pathlib.Path) -> Corpus:
    meta = json.loads((place / "corpus.json").read_text())
    splits = []
    for name in ("train", "held_out"):
        flat, lengths = np.load(place / f"{name}.npy"), np.load(place / f"{name}_lengths.npy")
        splits.append(np.split(flat, np.cumsum(lengths)[:-1]))
    return Corpus(splits[0], splits[1], [tuple(b) for b in meta["bands"]], meta["vocab"], meta["kinds"])


def write_store(docs: list[np.ndarray], path: pathlib.Path):
    """``docs`` as an Arrow IPC file of one ``input_ids`` list column, memory-mapped as a TokenStore."""
    import dflash_batch as db
    import pyarrow as pa

    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum([len(d) for d in docs], out=offsets[1:])
        values = pa.array(np.concatenate(docs).astype(np.int32))
        table = pa.table({"input_ids": pa.LargeListArray.from_arrays(pa.array(offsets), values)})
        partial = path.with_suffix(".partial")
        with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=1000)
        partial.rename(path)
    return db.TokenStore(str(path))

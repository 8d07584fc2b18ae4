"""A corpus-free Arrow mutator: hypothesis writes a token dataset (list types, batch sizes, stream or file
format), then damages it — bit flips, 4-byte words overwritten with boundary values, truncations, splices
of its stream and file encodings, repeated ranges — and a capped child reads every damaged file both ways
(tests/_adversary_child.py ``run_arrow``). dflash_batch must raise a clear error, or read exactly what
pyarrow reads and fully validates (rows and tokens), or, where pyarrow refuses the file, the original's
rows (a flipped token is undetectable by any reader: Arrow has no checksums). No row lost or invented.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pyarrow as pa
import pytest
from _adversary import EXAMPLES, run_cases
from _arrow import token_table, write_ipc
from _mutate import mutate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.fuzz, pytest.mark.skipif(os.name != "posix", reason="RLIMIT_AS")]

FILES = 24  # damaged files per child
WORDS = [0, 1, 7, 8, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0xFFFFFFF8, 0x10000]


@st.composite
def datasets(draw):
    rows = draw(st.integers(1, 50))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    longest = draw(st.sampled_from([2, 12, 200]))
    token_rows = [rng.integers(0, 30_000, int(k)) for k in rng.integers(1, longest + 1, rows)]
    value_type = draw(st.sampled_from([pa.int32(), pa.int64(), pa.uint16(), pa.uint32()]))
    table = token_table(token_rows, value_type=value_type, large=draw(st.booleans()))
    return table, draw(st.integers(1, 20)), draw(st.booleans())


def mutation():
    return st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 2**40)),
        st.tuples(st.just("word"), st.integers(0, 2**40), st.sampled_from(WORDS)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("splice"), st.floats(0, 1), st.floats(0, 1)),
        st.tuples(st.just("repeat"), st.floats(0, 1), st.integers(1, 64)),
    )


def damage(data: bytes, other: bytes, ops) -> bytes:
    """``data`` after ``ops``; ``other`` is the same table in the other IPC format (for splices)."""

    def special(out: bytearray, op) -> bytearray:
        if op[0] == "word":
            at = (op[1] % len(out)) & ~3  # Arrow's fields are aligned to 4 or 8 bytes
            out[at : at + 4] = op[2].to_bytes(4, "little")[: len(out) - at]
            return out
        # a splice: this file's head, the other encoding's tail
        return out[: int(op[1] * len(out))] + bytearray(other[int(op[2] * len(other)) :])

    return mutate(data, ops, special)


def digest(table: pa.Table) -> str:
    tokens = table.column("input_ids").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:16]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    dataset=datasets(), damages=st.lists(st.lists(mutation(), min_size=1, max_size=3), min_size=FILES, max_size=FILES)
)
def test_damaged_arrow_files_never_lose_rows_silently(tmp_path_factory, dataset, damages):
    table, batch_rows, stream = dataset
    root = tmp_path_factory.mktemp("mutated")
    encodings = [
        write_ipc(root / f"{kind}.arrow", table, stream=kind == "stream", batch_rows=batch_rows).read_bytes()
        for kind in ("stream", "file")
    ]
    data, other = encodings if stream else encodings[::-1]
    cases = []
    for i, ops in enumerate(damages):
        path = root / f"damaged{i}.arrow"
        path.write_bytes(damage(data, other, ops))
        cases.append(
            {
                "kind": "arrow",
                "path": str(path),
                "rows": table.num_rows,
                "digest": digest(table),
                "ops": [list(op) for op in ops],
            }
        )
    outcomes, failures = run_cases(cases, {})
    assert not failures, "\n\n".join(failures)
    assert len(outcomes) == len(cases)


def test_the_mutator_damages_and_the_reference_reads_the_undamaged():
    table = token_table([np.arange(5), np.arange(3)])
    stream = pa.BufferOutputStream()
    with pa.ipc.new_stream(stream, table.schema) as writer:
        writer.write_table(table)
    data = stream.getvalue().to_pybytes()
    assert damage(data, data, [("flip", 3)]) != data
    assert len(damage(data, data, [("truncate", 0.5)])) == len(data) // 2
    assert damage(data, b"xyz", [("splice", 0.0, 0.0)]) == b"xyz"
    assert len(damage(data, data, [("repeat", 0.0, 8)])) == len(data) + 8

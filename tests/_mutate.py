"""The byte mutations the file mutators share: bit flips, truncations and repeated ranges. Each test adds
the ones its format calls for (Arrow's aligned words and splices, Megatron's counts and pointers)."""

from __future__ import annotations

from collections.abc import Callable

Op = tuple


def mutate(data: bytes, ops: list[Op], special: Callable[[bytearray, Op], bytearray] | None = None) -> bytes:
    """``data`` after ``ops``: ``("flip", bit)``, ``("truncate", fraction)``, ``("repeat", fraction, n)``;
    any other op goes to ``special(out, op)``, which returns the new bytes."""
    out = bytearray(data)
    for op in ops:
        if not out:
            break
        if op[0] == "flip":
            bit = op[1] % (len(out) * 8)
            out[bit // 8] ^= 1 << (bit % 8)
        elif op[0] == "truncate":
            del out[int(op[1] * len(out)) :]
        elif op[0] == "repeat":
            at = int(op[1] * len(out))
            out[at:at] = out[at : at + op[2]]
        elif special is not None:
            out = special(out, op)
        else:
            raise ValueError(f"unknown mutation {op!r}")
    return bytes(out)

"""A dflash_batch strategy at another ``target_efficiency``, as the quality benchmarks take it: written
``dflash_padded@0.93`` on the command line, recorded as ``dflash_padded_at_093`` (no dot, so that a figure's
dotted path in the docs reaches it)."""

from __future__ import annotations


def split(strategy: str) -> tuple[str, float | None]:
    """``(name, target)`` of ``name`` or ``name@target``; ``ValueError`` naming a target that is no number
    in (0, 1] or one given to a strategy that is not dflash_batch's."""
    name, at, target = strategy.partition("@")
    if not at:
        return name, None
    if not name.startswith("dflash"):
        raise ValueError(f"{strategy!r}: only a dflash_batch strategy takes a target_efficiency (@t)")
    try:
        value = float(target)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise ValueError(f"{strategy!r}: the target after @ is a number in (0, 1], e.g. 0.97")
    return name, value


def key(strategy: str) -> str:
    """The strategy's key in a record: ``dflash_padded_at_093`` for ``dflash_padded@0.93``."""
    name, target = split(strategy)
    return name if target is None else f"{name}_at_{target:g}".replace(".", "")


def words(target: float | None) -> str:
    """What a title adds for a target: ``, target_efficiency=0.93``."""
    return "" if target is None else f", target_efficiency={target:g}"

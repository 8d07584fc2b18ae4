"""The planning settings in typed groups that mirror the core's own types: :class:`Padded` or :class:`Packed`
(the core's ``Mode``, each holding its batch sizing), :class:`Balance` (rank balance of an optimizer step) and
:class:`World` (the ranks). A rule between settings that a type can hold is a field one group has and the
other has not — ``batch_size`` and ``trim_steps`` only padded, ``bucketed`` and ``context_parallel`` only
packed, ``max_tokens`` required packed — so ``Packed(4096, trim_steps=True)`` is refused as it is written
(and by a type checker), not when the planner is built.

    >>> import dflash_batch as db
    >>> sampler = db.BucketSampler(
    ...     db.seed_workload(2_000), batching=db.Packed(4096, bucketed=True), world=db.World(size=2), rank=0
    ... )
    >>> sampler.mode, sampler.world_size
    ('packed', 2)

The fields are the settings declared once in the binding (``_core.SETTINGS``, with each setting's group);
the classes between the markers below are written from that declaration by ``python -m dflash_batch.tools.docs``
and checked against it by ``tests/planning/test_settings.py``. The flat keywords users write today keep
working: :func:`flatten` reads groups into them, in this one place, and :func:`of` reads a ``Config`` back into
groups.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, fields
from typing import Any, cast

import numpy as np

from . import settings


# <settings> written from _core.SETTINGS: python -m dflash_batch.tools.docs
@dataclass(frozen=True)
class Padded:
    """Rows padded to their batch's longest (``mode="padded"``): ``batch_size`` rows, or as many rows as
    ``max_tokens`` holds.

    Args:
        batch_size: fixed rows per batch. Exactly one of ``batch_size`` and ``max_tokens``. Default ``None``;
            accepts 1 to 2**32 - 1.
        max_tokens: padded-token budget per batch: ``rows × round_up(longest row) ≤ max_tokens``; with a
            ``cost`` model, a budget in its units; the row capacity with ``mode="packed"``. Default ``None``;
            accepts ≥ 1 (≤ 2**32 - 1 packed).
        oversize: samples longer than ``max_tokens``: ``"error"`` raises naming the row, ``"skip"`` leaves them
            out (counted in ``plan.stats()["skipped"]``), ``"truncate"`` (``mode="packed"``) splits each into
            ``max_tokens``-token pieces packed as separate sequences (``sampler.pieces``). Default ``'error'``;
            accepts 'error', 'skip' or 'truncate' (packed).
        pad_to_multiple_of: padded lengths are rounded up to a multiple of this; the budget counts it, and the
            Loader pads with it. With ``mode="packed"`` every sample in a row is padded to a multiple of it (FP8
            and sequence-parallel kernels: ``docs/context_parallel.md``). Default ``1``; accepts 1 to 2**32 - 1
            (packed: dividing max_tokens).
        trim_steps: trim each step's batches to a common cost and re-form the rows trimmed into extra steps
            spread through the epoch: ranks wait less for a few percent more steps and some mixing. Default
            ``False``; accepts a bool (max_tokens, padded, balance_tolerance=None).
    """

    _: KW_ONLY
    batch_size: int | None = None
    max_tokens: int | None = None
    oversize: str = "error"
    pad_to_multiple_of: int = 1
    trim_steps: bool = False


@dataclass(frozen=True)
class Packed:
    """Samples packed end to end into rows of ``max_tokens`` tokens (``mode="packed"``), a batch being one row,
    for varlen attention.

    Args:
        max_tokens: the row capacity in tokens (required); accepts ≥ 1 (≤ 2**32 - 1 packed).
        oversize: samples longer than ``max_tokens``: ``"error"`` raises naming the row, ``"skip"`` leaves them
            out (counted in ``plan.stats()["skipped"]``), ``"truncate"`` (``mode="packed"``) splits each into
            ``max_tokens``-token pieces packed as separate sequences (``sampler.pieces``). Default ``'error'``;
            accepts 'error', 'skip' or 'truncate' (packed).
        pad_to_multiple_of: padded lengths are rounded up to a multiple of this; the budget counts it, and the
            Loader pads with it. With ``mode="packed"`` every sample in a row is padded to a multiple of it (FP8
            and sequence-parallel kernels: ``docs/context_parallel.md``). Default ``1``; accepts 1 to 2**32 - 1
            (packed: dividing max_tokens).
        bucketed: with ``mode="packed"``, pack only samples of one length bucket together (``boundaries``;
            ``"auto"``: 2 buckets), which bounds each row's longest sample at some cost in fill. Default
            ``False``; accepts a bool (packed only).
        context_parallel: with ``mode="packed"``, the ranks each row is split over (ring or Ulysses attention):
            every sample is padded to a multiple of ``2·context_parallel`` (and of ``pad_to_multiple_of``), the
            padding counted as waste, so it splits into equal zigzag chunks; ``plan.stats()`` reports the
            attention spread per layout and ``db.context_parallel_shard`` cuts a batch for one rank
            (``docs/context_parallel.md``). Default ``1``; accepts 1 to 2**32 - 1 (packed; max_tokens a multiple
            of 2·context_parallel).
        max_docs_per_row: with ``mode="packed"``, the most samples (pieces, under ``oversize="truncate"``) a row
            holds: attention kernels and per-document bookkeeping (``cu_seqlens`` buffers, position resets) cost
            per document. A row closes at the cap whatever its room, so fill falls where samples are short
            (``docs/packing.md``). ``None``: no cap. Default ``None``; accepts None, or 1 to 2**32 - 1 (packed
            only).
    """

    max_tokens: int
    _: KW_ONLY
    oversize: str = "error"
    pad_to_multiple_of: int = 1
    bucketed: bool = False
    context_parallel: int = 1
    max_docs_per_row: int | None = None


@dataclass(frozen=True)
class Balance:
    """How an optimizer step's batches are matched across ranks.

    Args:
        accumulation: micro-batches per optimizer step: windows of ``accumulation × world_size`` batches are
            what one optimizer step sees; mixing is measured and rank balance matched over them. Pass your real
            value (``BucketTrainer`` binds its ``gradient_accumulation_steps``). Default ``None``; accepts ≥ 1
            (None: 1, or a trainer's gradient accumulation).
        tolerance: ``None`` keeps mixing first (steps matched by cost inside each optimizer window); a number
            ``t`` forms every step, where the data allows, from batches whose costs are within ``1 + t``: lower
            rank imbalance, less mixing. Default ``None``; accepts None, or > 0.
        rank_cost: the price ranks are balanced by, when it differs from ``cost``: the budget, and so every
            batch and the step count, stay as ``cost`` forms them. What ``db.StepTimer`` sets from measured step
            times (``docs/calibration.md``). Default ``None``; accepts None, or (a, b) as for cost (not with
            trim_steps).
    """

    _: KW_ONLY
    accumulation: int | None = None
    tolerance: float | None = None
    rank_cost: tuple[float, float] | None = None


@dataclass(frozen=True)
class World:
    """The ranks a plan is split over.

    Args:
        size: ranks the plan is split over (default: ``torch.distributed``'s when it is initialized, else
            torchrun's ``WORLD_SIZE``, else 1). Default ``None``; accepts ≥ 1.
        drop_last: drop the last ``batches mod world_size`` batches (counted in ``plan.stats()["dropped"]``)
            instead of splitting batches so that every rank gets the same number of steps. Default ``False``;
            accepts a bool.
        whole_steps: round the steps of a plan up to whole optimizer steps (a multiple of ``accumulation`` on
            every rank) by splitting batches, as for ranks, so a plan never ends inside an optimizer step.
            ``db.Windows`` sets it: each window of a stream then starts a step of its own. Default ``False``;
            accepts a bool.
    """

    _: KW_ONLY
    size: int | None = None
    drop_last: bool = False
    whole_steps: bool = False


# </settings>

#: The keyword each group is passed as, with the types it takes.
KEYWORDS: dict[str, tuple[type, ...]] = {"batching": (Padded, Packed), "balance": (Balance,), "world": (World,)}

#: Each group field's flat setting: ``(group type, field)`` → name.
_FLAT = {(s["group"], s["field"]): s["name"] for s in settings.SETTINGS}


def _setting(group: type, field: str) -> str:
    """The flat setting a group's field is (a field of both batching types is declared as ``batching``)."""
    return _FLAT.get((group.__name__.lower(), field)) or _FLAT[("batching", field)]


def flatten(given: dict[str, Any], **groups: Any) -> dict[str, Any]:
    """``given`` (every flat setting, as the signature received it) with the fields of the groups passed
    (``batching=``, ``balance=``, ``world=``; ``None``: not passed) written in, ``mode`` from the batching
    group's type. A setting the flat keywords and a group both set to different values, each not its
    default, raises ``TypeError`` naming both; otherwise the value that is not the default is kept."""
    flat = dict(given)
    for keyword, group in groups.items():
        if group is None:
            continue
        types = KEYWORDS[keyword]
        if not isinstance(group, types):
            names = " or ".join(f"db.{t.__name__}" for t in types)
            raise TypeError(f"{keyword}= takes {names}, got {type(group).__name__}: {group!r}")
        chosen = cast("Padded | Packed | Balance | World", group)
        values = {_setting(type(chosen), f.name): getattr(chosen, f.name) for f in fields(chosen)}
        if keyword == "batching":
            values["mode"] = "packed" if isinstance(group, Packed) else "padded"
        for name, value in values.items():
            default, before = settings.default(name), flat[name]
            if _is(value, default) and name != "mode":  # the batching group's type is always a choice
                continue
            if not _is(before, default) and not _is(before, value):
                raise TypeError(f"{name}={before!r} and {keyword}={group!r} both set {name}; pass it in one place")
            flat[name] = value
    return flat


def _is(a: Any, b: Any) -> bool:
    """Whether two setting values are the same (``1`` is not ``True``: a bool is a setting type of its own; an
    array never is: it compares element-wise)."""
    try:
        return bool(a == b) and isinstance(a, (bool, np.bool_)) == isinstance(b, (bool, np.bool_))
    except (TypeError, ValueError):
        return False


def of(config: Any) -> dict[str, Any]:
    """A ``Config``'s settings read back into groups: ``{"batching": Padded | Packed, "balance": Balance,
    "world": World}`` — what :func:`flatten` reads into the same ``Config``."""
    out: dict[str, Any] = {}
    batching: type = Packed if config.get("mode") == "packed" else Padded
    for keyword, group in (("batching", batching), ("balance", Balance), ("world", World)):
        values = {f.name: config.get(_setting(group, f.name)) for f in fields(group)}
        out[keyword] = group(**values)
    return out

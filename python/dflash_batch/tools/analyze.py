"""``dflash-batch analyze``: a dataset's length histogram, the buckets dflash_batch would choose, and a
side-by-side table of batching strategies scored on efficiency, mixing, churn and rank balance.

Strategies, all under the same batching rule (fixed rows, or greedily cut under the token budget):
sorted static batches, a full shuffle, the seed's 6 hand-picked buckets, HF-style mega-batch sorting
(``LengthGroupedSampler``: mega-batches of 50 × 8 samples sorted longest first), and dflash_batch — with
``trim_steps=True`` beside it on several ranks under a token budget, to show what trimming gains.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..planning.sampler import BucketSampler
from ..planning.schedule import Schedule
from . import baselines, metrics

#: The mixing figures of ``Plan.stats()`` (and :func:`metrics.mixing`), each over all windows and the tail.
MIXING = ("window_tv", "window_tv_tail", "length_gap", "length_gap_tail")
COLUMNS = (
    "efficiency", *MIXING, "churn", "rank_imbalance_p99", "sync_efficiency", "sync_efficiency_step",
    "end_to_end_efficiency", "end_to_end_efficiency_step", "steps",
)  # fmt: skip


def histogram(lengths: np.ndarray, bins: int = 12) -> list[dict[str, Any]]:
    """Log-spaced bins between the shortest and longest length: ``[{low, high, count, share}]``."""
    low, high = max(int(lengths.min()), 1), int(lengths.max())
    edges = np.unique(np.geomspace(low, high + 1, bins + 1).astype(np.int64))
    counts, _ = np.histogram(lengths, bins=edges)
    return [
        {"low": int(a), "high": int(b) - 1, "count": int(c), "share": float(c / len(lengths))}
        for a, b, c in zip(edges[:-1], edges[1:], counts, strict=True)
    ]


def strategies(
    lengths: np.ndarray, *, sampler: BucketSampler, rule: dict[str, int], window: int, peers: bool = True
) -> dict:
    """Every strategy's figures: two epochs each (seeds 0 and 1) for churn; steps per rank. ``peers``: HF's
    ``BatchRebalanceSampler`` too, at its own price and at the sampler's (needs ``max_tokens`` and
    transformers ≥ 5.24; a few seconds per million samples)."""
    world = sampler.world_size
    price = sampler.schedule.config.price

    def scored(epochs: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
        order, offsets = epochs[0]
        imbalance = metrics.rank_imbalance(lengths, order, offsets, world)
        sync = metrics.sync_efficiency(lengths, order, offsets, world, window // world, cost=price)
        end = metrics.end_to_end(lengths, order, offsets, world, window // world, cost=price)
        mixed = metrics.mixing(lengths, order, offsets, window) or {}
        return {
            "efficiency": baselines.efficiency(lengths, order, offsets),
            **{key: mixed.get(key) for key in MIXING},
            "churn": metrics.churn(len(lengths), epochs[0], epochs[1]),
            "rank_imbalance_p99": None if imbalance is None else imbalance[1],
            "sync_efficiency": None if sync is None else sync[0],
            "sync_efficiency_step": None if sync is None else sync[1],
            "end_to_end_efficiency": None if end is None else end[0],
            "end_to_end_efficiency_step": None if end is None else end[1],
            "steps": (len(offsets) - 1) // world,
        }

    def cut(order):
        return baselines.cut(lengths, order, **rule)

    rows = {
        "sorted static": scored([cut(np.argsort(lengths, kind="stable"))] * 2),
        "full shuffle": scored([cut(np.random.default_rng(s).permutation(len(lengths))) for s in (0, 1)]),
        "seed's 6 buckets": scored([baselines.seed_bucketed(lengths, **rule, seed=s) for s in (0, 1)]),
        "HF mega-batch sorting": scored([cut(baselines.megabatch_sorted(lengths, 8, seed=s)) for s in (0, 1)]),
    }
    if peers and "max_tokens" in rule:
        for name, coefficient in (("HF batch rebalance", None), ("HF batch rebalance, same price", price[1])):
            epochs = [
                baselines.batch_rebalance(
                    lengths, world_size=world, accumulation=window // world, max_tokens=rule["max_tokens"],
                    coefficient=coefficient, seed=s,
                )
                for s in (0, 1)
            ]  # fmt: skip
            done = [e for e in epochs if e is not None]
            if len(done) < len(epochs):  # transformers without BatchRebalanceSampler
                break
            rows[name] = scored([e[:2] for e in done])
    schedule = sampler.schedule
    rows["dflash_batch"] = planned(schedule)
    config = schedule.config
    if world > 1 and config.max_tokens and config.mode == "padded" and config.get("balance_tolerance") is None:
        # What trimming would gain here (see BucketSampler's trim_steps).
        rows["dflash_batch + trim"] = planned(schedule.replace(trim_steps=True))
    return rows


def planned(schedule: Schedule) -> dict[str, Any]:
    """A schedule's figures from its own plans of epochs 0 and 1."""
    plans = [schedule.plan(epoch) for epoch in (0, 1)]
    stats = plans[0].stats()
    return {
        "efficiency": stats["efficiency"],
        **{key: stats[key] for key in MIXING},
        "churn": plans[0].churn(plans[1]),
        "rank_imbalance_p99": stats["rank_imbalance_p99"],
        "sync_efficiency": stats["sync_efficiency"],
        "sync_efficiency_step": stats["sync_efficiency_step"],
        "end_to_end_efficiency": stats["end_to_end_efficiency"],
        "end_to_end_efficiency_step": stats["end_to_end_efficiency_step"],
        "steps": stats["steps"],
    }


def packing(lengths: np.ndarray, sampler: BucketSampler) -> dict[str, Any] | None:
    """Under a token budget, the same samples packed into rows of ``max_tokens`` (the sampler's ranks and
    accumulation): the rows an epoch plans, the fewest any packing could use (``⌈Σ L / max_tokens⌉``), and
    the fill; ``None`` with ``batch_size``."""
    capacity = sampler.max_tokens
    if capacity is None or not len(lengths):
        return None
    packed = BucketSampler(
        lengths, max_tokens=capacity, mode="packed", world_size=sampler.world_size, rank=0,
        accumulation=sampler.accumulation, oversize="skip",
    )  # fmt: skip
    plan = packed.plan(0)
    fits = lengths[lengths <= capacity]
    return {
        "capacity": int(capacity),
        "rows": len(plan),
        "lower_bound": -(-int(fits.sum()) // int(capacity)),
        "fill": plan.stats()["utilization"],
    }


def report(
    lengths: np.ndarray, *, sampler: BucketSampler, rule: dict[str, int], accumulation: int, peers: bool = True
) -> dict:
    """Everything ``analyze`` prints, as one JSON-ready dict."""
    window = accumulation * sampler.world_size
    return {
        "packing": packing(lengths, sampler),
        "samples": len(lengths),
        "histogram": histogram(lengths),
        "edges": sampler.edges,
        "buckets": len(sampler.edges) - 1,
        "predicted_efficiency": sampler.predicted_efficiency,
        # What "auto" edges aimed at (None under explicit edges or a count): the default follows the step shape.
        "target_efficiency": _aimed_at(sampler),
        "window": window,
        "world_size": sampler.world_size,
        "rule": rule,
        "strategies": strategies(lengths, sampler=sampler, rule=rule, window=window, peers=peers),
    }


def _aimed_at(sampler: BucketSampler) -> float | None:
    """The target ``boundaries="auto"`` aimed at (the default follows the step shape); None for a bucket count
    or explicit edges."""
    settings = sampler.state_dict()["settings"]
    return settings.get("target_efficiency") if settings.get("boundaries") is None else None


def _figure(value: Any) -> str:
    if value is None:
        return "—"
    return f"{value:,}" if isinstance(value, int) else f"{value:.4f}"


def print_report(result: dict) -> None:
    print(f"{result['samples']:,} samples")
    skipped = result.get("skipped")
    if skipped is not None:
        print(
            f"oversize='skip' left out {skipped['samples']:,} samples longer than a batch holds: "
            f"{skipped['tokens']:,} tokens, {skipped['token_share']:.1%} of the dataset's"
        )
    widest = max(h["share"] for h in result["histogram"]) or 1
    for h in result["histogram"]:
        bar = "#" * round(40 * h["share"] / widest)
        print(f"  {h['low']:>7}–{h['high']:<7} {h['count']:>10,} {h['share']:6.1%} {bar}")
    target = result.get("target_efficiency")
    aimed = f" aimed at target_efficiency {target:g}" if target is not None else ""
    print(
        f"\nbuckets: {result['buckets']}{aimed}, predicted padding efficiency {result['predicted_efficiency']:.4f}"
        f"\nedges: {result['edges']}"
    )
    rule = ", ".join(f"{k}={v}" for k, v in result["rule"].items())
    print(f"\n{rule}; world_size={result['world_size']}; mixing windows of {result['window']} batches")
    print(f"{'strategy':<32}" + "".join(f"{_HEADS.get(c, c):>{len(_HEADS.get(c, c)) + 2}}" for c in COLUMNS))
    for name, row in result["strategies"].items():
        print(f"{name:<32}" + "".join(f"{_figure(row[c]):>{len(_HEADS.get(c, c)) + 2}}" for c in COLUMNS))
    print(
        "(sync: the share of GPU time that does work when ranks wait for the slowest every micro-batch, or"
        " every optimizer step under DDP's no_sync; e2e: the share that trains real tokens, padding included)"
    )
    packed = result.get("packing")
    if packed is not None:
        print(
            f"\npacked (mode='packed') into rows of {packed['capacity']:,} tokens: {packed['rows']:,} rows an epoch, "
            f"fill {packed['fill']:.4f}; the fewest any packing could use: {packed['lower_bound']:,} (⌈Σ L / "
            f"max_tokens⌉, {packed['lower_bound'] / packed['rows']:.4f} of the rows)"
        )


#: Short column heads, so the table fits a terminal.
_HEADS = {
    "window_tv_tail": "tv tail", "length_gap": "len gap", "length_gap_tail": "gap tail",
    "rank_imbalance_p99": "p99 imbalance", "sync_efficiency": "sync/micro", "sync_efficiency_step": "sync/step",
    "end_to_end_efficiency": "e2e/micro", "end_to_end_efficiency_step": "e2e/step",
}  # fmt: skip


def plot(result: dict, path: str) -> None:
    """The histogram with bucket edges, and efficiency and window_tv per strategy, as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError("--plot needs matplotlib: pip install 'dflash-batch[plot]'") from err
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    bins = result["histogram"]
    left.bar(
        [b["low"] for b in bins],
        [b["count"] for b in bins],
        width=[b["high"] - b["low"] + 1 for b in bins],
        align="edge",
        color="#8fb3d9",
    )
    for edge in result["edges"][1:-1]:
        left.axvline(edge, color="#c44", linewidth=0.6)
    left.set_xscale("log")
    left.set_xlabel("tokens per sample (log)")
    left.set_title(f"lengths and {result['buckets']} bucket edges")
    names = list(result["strategies"])
    rows = [result["strategies"][n] for n in names]
    x = np.arange(len(names))
    right.bar(x - 0.2, [r["efficiency"] for r in rows], width=0.4, label="efficiency")
    right.bar(x + 0.2, [r["window_tv"] or 0 for r in rows], width=0.4, label="window_tv")
    right.set_xticks(x, names, rotation=20, ha="right")
    right.legend()
    right.set_title("efficiency (higher) and window_tv (lower)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def to_json(result: dict) -> str:
    """Strict JSON (RFC 8259 has no NaN): a figure that is not a number is ``null``."""
    return json.dumps(_finite(result), indent=2, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value

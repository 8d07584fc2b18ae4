"""The convergence benchmark's outputs: ``convergence.json`` (every curve), ``convergence.md`` (the table)
and ``convergence.png`` (held-out loss against real tokens and against projected time, per view)."""

from __future__ import annotations

import json
import pathlib

import numpy as np
from _equivalence import verdict as tost

NAMES = {
    "sorted": "sorted static batches",
    "shuffle": "full shuffle",
    "seed_buckets": "seed's 6 buckets",
    "dflash_padded": "dflash_batch padded",
    "dflash_packed": "dflash_batch packed",
    "hf_rebalance": "HF BatchRebalanceSampler",
    "hf_length_grouped": "HF LengthGroupedSampler",
}


def name_of(strategy: str) -> str:
    """A strategy's name in the tables; one recorded at a target (``dflash_padded_at_093``) says it."""
    base, at, digits = strategy.partition("_at_")
    if not at or base not in NAMES:
        return NAMES.get(strategy, strategy)
    return f"{NAMES[base]}, target_efficiency={float(digits[0] + '.' + digits[1:]):g}"


VIEWS = {"tokens": "equal real tokens per step", "steps": "equal steps (4 micro-batches)"}


def noise(losses: list[float]) -> float:
    """The step loss's noise over the second half of training: the spread of consecutive differences
    (what a smooth trend leaves), ÷ √2 for one step's share."""
    half = np.asarray(losses[len(losses) // 2 :])
    return float(np.std(np.diff(half)) / np.sqrt(2)) if len(half) > 2 else float("nan")


def at(curve: list[dict], key: str, x: float) -> float:
    """Held-out loss interpolated at ``x`` of ``key`` (tokens or time) along a curve."""
    xs = [p[key] for p in curve]
    return float(np.interp(x, xs, [p["all"] for p in curve]))


def summarize(runs, margin: float | None = None) -> dict:
    """Per view and strategy: every figure over the seeds (mean, min, max)."""
    out: dict = {}
    for view in dict.fromkeys(r.view for r in runs):
        mine = [r for r in runs if r.view == view]
        fastest = min(r.curve[-1]["time"] for r in mine)
        for strategy in dict.fromkeys(r.strategy for r in mine):
            group = [r for r in mine if r.strategy == strategy]
            bands = [k for k in group[0].curve[-1] if k not in ("step", "tokens", "time", "all")]
            figures = {
                "held_out": [r.curve[-1]["all"] for r in group],
                "at_equal_time": [at(r.curve, "time", fastest) for r in group],
                "tokens": [r.curve[-1]["tokens"] for r in group],
                "time": [r.curve[-1]["time"] for r in group],
                "noise": [noise(r.step_loss) for r in group],
                **{f"band {b}": [r.curve[-1][b] for r in group] for b in bands},
            }
            out.setdefault(view, {})[strategy] = {
                key: {"mean": float(np.mean(v)), "min": float(np.min(v)), "max": float(np.max(v))}
                for key, v in figures.items()
            }
            if strategy != "dflash_padded":
                differences = paired(runs, view, strategy)
                out[view][strategy]["versus_padded"] = differences
                out[view][strategy]["verdict"] = verdict(differences)
            against = paired(runs, view, strategy, base="shuffle")
            if strategy != "shuffle" and margin is not None and len(against) >= 2:
                out[view][strategy]["versus_shuffle"] = against
                out[view][strategy]["equivalence"] = tost(against, margin)
    return out


def equivalence_table(summary: dict, margin: float, seeds: int) -> str:
    """The TOST verdicts against a full shuffle, per view."""
    lines = [
        f"**Equivalence to a full shuffle** (TOST at ±{margin:.3f} nats of held-out loss, stated before the run; "
        f"{seeds} seeds, paired; 90% interval of the mean difference, strategy − shuffle)",
        "",
        "| view | strategy | mean difference | 90% interval | verdict |",
        "|---|---|---|---|---|",
    ]
    for view, rows in summary.items():
        for strategy, f in rows.items():
            e = f.get("equivalence")
            if e is not None:
                lines.append(
                    f"| {VIEWS.get(view, view)} | {name_of(strategy)} | {e['mean']:+.3f} | "
                    f"[{e['low']:+.3f}, {e['high']:+.3f}] | {e['verdict']} |"
                )
    return "\n".join(lines) + "\n"


def paired(runs, view: str, strategy: str, base: str = "dflash_padded") -> list[float]:
    """Held-out loss of ``strategy`` minus ``base``'s, seed by seed (a seed fixes the model's init for every
    strategy, which moves the loss more than the batching does: paired, that part cancels)."""
    final = {(r.strategy, r.seed): r.curve[-1]["all"] for r in runs if r.view == view}
    seeds = sorted({seed for s, seed in final if s == strategy} & {seed for s, seed in final if s == base})
    return [final[(strategy, seed)] - final[(base, seed)] for seed in seeds]


def verdict(differences: list[float]) -> str:
    """The mean paired difference, or "within noise" when the seeds disagree on its sign."""
    if not differences:
        return "—"
    low, high = min(differences), max(differences)
    if low <= 0 <= high:
        return f"within noise ({low:+.3f} to {high:+.3f})"
    return f"{np.mean(differences):+.3f} ({low:+.3f} to {high:+.3f})"


def table(summary: dict, seeds: int) -> str:
    lines = []
    for view, rows in summary.items():
        bands = [k for k in next(iter(rows.values())) if k.startswith("band ")]
        lines += [
            f"**{VIEWS.get(view, view)}** (mean of {seeds} seeds, [min, max]; lower is better)",
            "",
            "| strategy | held-out loss | vs dflash padded, paired by seed | at the fastest's time | "
            + " | ".join(f"tokens {b[5:]}" for b in bands)
            + " | real tokens | projected time | step-loss noise |",
            "|---" * (7 + len(bands)) + "|",
        ]
        for strategy, f in rows.items():
            h = f["held_out"]
            cells = [
                f"{name_of(strategy)}",
                f"{h['mean']:.3f} [{h['min']:.3f}, {h['max']:.3f}]",
                f.get("verdict", "—"),
                f"{f['at_equal_time']['mean']:.3f}",
                *(f"{f[b]['mean']:.3f}" for b in bands),
                f"{f['tokens']['mean']:,.0f}",
                f"{f['time']['mean']:,.0f}",
                f"{f['noise']['mean']:.3f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(runs, path: pathlib.Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    views = list(dict.fromkeys(r.view for r in runs))
    fig, axes = plt.subplots(len(views), 2, figsize=(12, 4.2 * len(views)), squeeze=False)
    for row, view in zip(axes, views, strict=True):
        for strategy in dict.fromkeys(r.strategy for r in runs):
            group = [r for r in runs if r.view == view and r.strategy == strategy]
            if not group:
                continue
            for ax, key, label in ((row[0], "tokens", "real tokens seen"), (row[1], "time", "projected time")):
                xs = np.mean([[p[key] for p in r.curve] for r in group], axis=0)
                ys = np.array([[p["all"] for p in r.curve] for r in group])
                (line,) = ax.plot(xs, ys.mean(axis=0), label=name_of(strategy))
                ax.fill_between(xs, ys.min(axis=0), ys.max(axis=0), color=line.get_color(), alpha=0.2)
                ax.set_xlabel(label)
                ax.set_ylabel("held-out loss")
                ax.set_title(VIEWS.get(view, view))
        row[0].legend(fontsize=8)
    for ax in axes.flat:
        lows = [line.get_ydata()[-1] for line in ax.get_lines()]
        if lows:  # the early curve is steep: show the end of training
            ax.set_ylim(min(lows) - 0.3, max(lows) + 1.0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def report(runs, corpus, out: pathlib.Path, meta: dict) -> tuple[dict, str]:
    """Writes the three files; returns the summary and the table."""
    summary = summarize(runs, meta.get("margin"))
    seeds = len({r.seed for r in runs})
    text = table(summary, seeds)
    if meta.get("margin") is not None and any("equivalence" in f for rows in summary.values() for f in rows.values()):
        text += "\n" + equivalence_table(summary, meta["margin"], seeds)
    curves = [
        {"strategy": r.strategy, "seed": r.seed, "view": r.view, "curve": r.curve, "step_loss": r.step_loss,
         "seconds": r.seconds, "plan": r.plan}
        for r in runs
    ]  # fmt: skip
    record = {**meta, "documents": len(corpus.train), "kinds": corpus.kinds, "bands": corpus.bands}
    (out / "convergence.json").write_text(json.dumps({**record, "summary": summary, "runs": curves}, indent=1))
    (out / "convergence.md").write_text(text + "\n")
    plot(runs, out / "convergence.png")
    return summary, text

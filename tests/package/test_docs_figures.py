"""No figure in the docs is typed by hand (issue 30): every figure in ``README.md`` and ``docs/*.md`` is a marker
that ``benchmarks/_figures.py`` fills from ``docs/figures.json``, which the benchmarks write with ``--json``.
Here: every marker shows its recorded figure; the figures that are not timings equal what the code computes
now (the benchmarks' own functions, rerun); a timing is within noise of a fresh measurement; and the tool
itself notices a figure that differs."""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import dflash_batch as db
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _figures  # noqa: E402

FIGURES = json.loads(_figures.FIGURES.read_text())
#: Keys of timings (and of what is scaled from them): recorded, not recomputed.
TIMED = ("median", "best", "median_ms", "best_ms", "plan_ms", "ratio", "build", "seconds", "command")


def leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out = {}
        for key, inner in value.items():
            out.update(leaves(inner, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def same(recorded: dict[str, Any], computed: dict[str, Any], section: str) -> None:
    """Every figure of ``recorded`` that is not a timing equals ``computed``'s (floats to 1e-9)."""
    want = {k: v for k, v in leaves(_figures.plain(computed)).items() if k.rsplit(".", 1)[-1] not in TIMED}
    got = {k: v for k, v in leaves(recorded).items() if k in want}
    assert set(got) == set(want), f"{section}: recorded figures differ in keys from the benchmark's"
    for key, value in want.items():
        if isinstance(value, float):
            assert math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-12), f"{section}.{key}: {got[key]} vs {value}"
        else:
            assert got[key] == value, f"{section}.{key}: {got[key]!r} vs {value!r}"


def test_every_page_shows_its_recorded_figures():
    assert _figures.stale() == []
    quoted = {key for page in _figures.pages() for key, _, _ in _figures.markers(page.read_text())}
    assert len(quoted) > 60, "the docs quote fewer figures than expected: markers lost?"
    assert any(key.startswith("mixing.") for key in quoted) and any(key.startswith("plan.") for key in quoted)


def test_the_tool_notices_a_figure_that_differs():
    changed = json.loads(json.dumps(FIGURES))
    changed["mixing"]["default"]["efficiency"] += 0.01
    problems = _figures.stale(changed)
    assert problems and all("mixing.default.efficiency" in p for p in problems)
    with pytest.raises(KeyError, match="no 'nope'"):
        _figures.lookup(FIGURES, "mixing.nope")
    text = "x <!--fig mixing.default.efficiency .2f-->0.00<!--/fig--> y"
    assert _figures.render(text, FIGURES) == (
        f"x <!--fig mixing.default.efficiency .2f-->{FIGURES['mixing']['default']['efficiency']:.2f}<!--/fig--> y"
    )
    assert _figures.formatted(0.0123, ".1fms") == "12.3" and _figures.formatted(2.5e8, "M") == "250"


def test_mixing_figures_are_what_the_planner_computes(capsys):
    import mixing

    assert FIGURES["mixing"]["samples"] == db.SEED_SAMPLES
    same(FIGURES["mixing"], mixing.collect(db.SEED_SAMPLES, repeats=1, peers=False), "mixing")


def test_step_figures_are_what_the_planner_computes(capsys):
    import plan

    same(FIGURES["plan"]["steps"], plan.same_steps(db.seed_workload(db.SEED_SAMPLES, seed=0)), "plan.steps")


def test_packing_figures_are_what_the_planner_computes(capsys):
    import packing

    lengths = db.seed_workload(db.SEED_SAMPLES, seed=0)
    for key in ("plain", "best_fit", "bucketed"):
        same(FIGURES["packing"][key], packing.scored(lengths, key, 1), f"packing.{key}")


@pytest.mark.slow  # seven epochs of four scheduled mixtures at 902K samples, and 14 of the cycle check
def test_schedule_figures_are_what_the_planner_computes(capsys):
    import schedules

    assert FIGURES["schedules"]["samples"] == db.SEED_SAMPLES
    same(FIGURES["schedules"], schedules.collect(db.SEED_SAMPLES, repeats=1), "schedules")


@pytest.mark.slow  # a wall-clock figure: never in the fast lane, whose workers share the cores
def test_the_quoted_planning_time_is_within_noise_of_a_fresh_one():
    """A timing cannot be recomputed exactly; on a shared machine it swings ~2× between runs, so a
    recorded median 6× away from a fresh one means the figure is out of date, not noise."""
    sampler = db.BucketSampler(db.seed_workload(db.SEED_SAMPLES, seed=0), max_tokens=16384, world_size=8, rank=0)
    sampler.plan(0)
    times = []
    for epoch in range(1, 8):
        start = time.perf_counter()
        sampler.plan(epoch)
        times.append(time.perf_counter() - start)
    recorded, fresh = FIGURES["plan"]["auto"]["median"], statistics.median(times)
    assert 1 / 6 < recorded / fresh < 6, f"recorded {recorded * 1e3:.1f} ms, measured now {fresh * 1e3:.1f} ms"

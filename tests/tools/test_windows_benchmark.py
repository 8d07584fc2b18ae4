"""The windows benchmark (``benchmarks/windows.py``) on a small stream: every window's plan is checked (it
asserts every sample once), the joined windows are scored beside the global plan, and the figures recorded."""

from __future__ import annotations

import json

import windows


def test_a_small_run_scores_every_window_size_that_fits_beside_the_global_plan(tmp_path):
    figures = tmp_path / "figures.json"
    assert windows.main(["--samples", "40000", "--json", str(figures)]) == 0
    got = json.loads(figures.read_text())["windows"]
    assert got["command"] == "python benchmarks/windows.py --samples 40000"
    assert set(got["windows"]) == {"10000", "30000"}
    ten = got["windows"]["10000"]
    assert ten["windows"] == 4 and got["windows"]["30000"]["windows"] == 1  # 30,000 + a tail of 10,000 < 15,000
    for row in (got["global"], ten):
        assert 0.8 < row["efficiency"] <= 1 and 0 <= row["window_tv"] < 1 and row["p99"] >= 1
    assert ten["efficiency_gap"] == got["global"]["efficiency"] - ten["efficiency"]


def test_joined_windows_are_a_plan_of_the_whole_stream_in_window_order():
    import dflash_batch as db
    import numpy as np

    lengths = db.seed_workload(24_000, seed=1)
    offsets, indices, seconds = windows.windowed(lengths, 10_000)
    assert len(seconds) == 2  # 10,000, then 14,000 (a tail of 4,000 joins the last)
    assert np.array_equal(np.sort(indices), np.arange(24_000))
    batches = [indices[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
    changes = [i for i in range(1, len(batches)) if (batches[i].min() >= 10_000) != (batches[i - 1].min() >= 10_000)]
    assert len(changes) == 1 and changes[0] % 8 == 0  # one switch of window, at a step boundary

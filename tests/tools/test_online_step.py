"""The online-step benchmark (``benchmarks/online_step.py``) on small steps: every way's split is checked (every
sequence once, within budget: it asserts), the baselines are what they say, and the figures are recorded."""

from __future__ import annotations

import json

import numpy as np
import online_step


def test_a_small_run_records_every_shape_and_way_with_equal_counts_for_split_step(tmp_path):
    figures = tmp_path / "figures.json"
    assert online_step.main(["--sequences", "512", "--steps", "2", "--json", str(figures)]) == 0
    got = json.loads(figures.read_text())["online_step"]
    assert got["command"] == "python benchmarks/online_step.py --sequences 512 --steps 2"
    assert set(got["shapes"]) == {"grpo", "reasoning", "mixed"}
    for shape in got["shapes"].values():
        assert set(shape) == {"dflash_batch", "karmarkar_karp", "greedy"}
        assert shape["dflash_batch"]["equal_counts"]
        assert all(1 <= way["imbalance"] < 2 and 0 < way["useful"] <= way["lockstep"] <= 1 for way in shape.values())


def test_karmarkar_karp_gives_equal_counts_and_a_near_even_split_of_known_numbers():
    lengths = np.array([8, 7, 6, 5, 4, 3, 2, 1])
    ranks = online_step.karmarkar_karp(lengths, 2)
    assert sorted(i for r in ranks for i in r) == list(range(8)) and [len(r) for r in ranks] == [4, 4]
    assert sorted(int(lengths[r].sum()) for r in ranks) == [18, 18]
    greedy = online_step.greedy(lengths, 2)
    assert sorted(int(lengths[r].sum()) for r in greedy) == [18, 18]

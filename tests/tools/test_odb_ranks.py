"""The ODB rank-balance benchmark (``benchmarks/odb_ranks.py``) on a few thousand examples: ODB's two ranks run in
a gloo group and, with dflash_batch's global plan, every way trains every example once; the figures are
recorded."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("odb")
pytest.importorskip("torch")

import odb_ranks

pytestmark = pytest.mark.multiprocess  # a gloo group of two ranks: make test-all


def test_two_ranks_of_each_way_train_every_example_once_and_are_scored(tmp_path):
    figures = tmp_path / "figures.json"
    assert odb_ranks.main(["--samples", "3000", "--json", str(figures)]) == 0
    got = json.loads(figures.read_text())["odb_ranks"]
    assert got["command"] == "python benchmarks/odb_ranks.py --samples 3000"
    assert set(got["ways"]) == {"dflash_batch", "dflash_batch_rank_cost", "odb"}
    for name, way in got["ways"].items():
        assert way["missing"] == 0 and way["repeated"] == 0, name
        assert way["p99"] >= 1 and 0 < way["sync"] <= 1, name
    assert got["ways"]["dflash_batch_rank_cost"]["sync"] >= got["ways"]["dflash_batch"]["sync"]

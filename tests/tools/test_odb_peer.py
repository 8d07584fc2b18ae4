"""The ODB peer benchmark (``benchmarks/odb_peer.py``) on a few thousand examples: every way runs an epoch through
real DataLoader workers, every example is trained once by each, no batch is over the budget, and the figures
are recorded."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("odb")
pytest.importorskip("torch")

import odb_peer

pytestmark = pytest.mark.slow  # worker and collate processes: make test-all


def test_a_small_run_trains_every_example_once_within_the_budget_in_every_way(tmp_path):
    figures = tmp_path / "figures.json"
    assert odb_peer.main(["--samples", "3000", "--json", str(figures)]) == 0
    got = json.loads(figures.read_text())["odb_peer"]
    assert got["command"] == "python benchmarks/odb_peer.py --samples 3000"
    assert set(got["ways"]) == {"dflash_batch", "dflash_batch_099", "odb", "odb_buffer_8192"}
    for name, way in got["ways"].items():
        assert way["missing"] == 0 and way["repeated"] == 0, name
        assert way["over_budget"] == 0 and 0.8 < way["efficiency"] <= 1, name
    assert got["ways"]["dflash_batch_099"]["efficiency"] > got["ways"]["dflash_batch"]["efficiency"]

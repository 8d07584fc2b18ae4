"""The length-pass benchmark (``benchmarks/lengths_pass.py``) on a few thousand chats: the three ways agree on
every length (it exits otherwise), its figures are recorded, and a length function that leaves the template
out is caught overflowing the budget."""

from __future__ import annotations

import json

import lengths_pass


def test_a_small_run_records_agreeing_lengths_and_catches_a_short_length_function(tmp_path):
    figures = tmp_path / "figures.json"
    assert lengths_pass.main(["--samples", "3000", "--workers", "2", "--json", str(figures)]) == 0
    got = json.loads(figures.read_text())["lengths_pass"]
    assert got["samples"] == 3000 and got["command"] == "python benchmarks/lengths_pass.py --samples 3000 --workers 2"
    assert set(got["seconds"]) == {"tokenizing alone", "measure_lengths", "measure_lengths, cached", "datasets.map"}
    assert got["ratio"] > 0 and got["cached_ratio"] < got["ratio"]
    plan = got["plan"]
    assert 0.9 < plan["efficiency"] <= 1 and plan["template_tokens"] > 0
    assert plan["overflowing"] > 0 and plan["worst"] > 1, "lengths without the template overflow the budget"


def test_conversations_are_deterministic_and_shaped_like_chat_data():
    a, b = lengths_pass.conversations(200, seed=4), lengths_pass.conversations(200, seed=4)
    assert a == b and a != lengths_pass.conversations(200, seed=5)
    assert all(m["role"] in ("user", "assistant") for c in a for m in c["messages"])
    assert {len(c["messages"]) for c in a} == {2, 4, 6}

"""The convergence benchmark (``benchmarks/convergence.py``): the equal-real-tokens control, the corpus, and a
smoke run of every strategy and view that checks the table and that each run trained exactly the samples
planned for it."""

from __future__ import annotations

import json

import _corpus
import convergence
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(1, 5000), min_size=1, max_size=200),
    target=st.floats(1.0, 30_000.0, allow_nan=False),
)
def test_steps_hold_their_real_tokens_near_the_target(tokens, target):
    ends = convergence.group_steps(tokens, target)
    assert ends[-1] == len(tokens) and all(a < b for a, b in zip([0, *ends], ends, strict=False))
    cumulative = np.cumsum(tokens)
    largest = max(tokens)
    for k, end in enumerate(ends[:-1], start=1):
        step = cumulative[end - 1] - (cumulative[ends[k - 2] - 1] if k > 1 else 0)
        if largest <= target:
            # The running total stays within half a micro-batch of k steps' worth, so a step's tokens
            # are within one micro-batch of the target and the mean converges on it.
            assert abs(cumulative[end - 1] - k * target) <= largest / 2 + 1e-6, (k, end)
            assert abs(step - target) <= largest + 1e-6
        else:
            assert step >= 1


def test_steps_of_equal_micro_batches_are_exact_and_bad_targets_are_errors():
    assert convergence.group_steps([10] * 12, 40) == [4, 8, 12]
    # Goals 25, 50, 75, 100: totals 30, 50, 80, 100 (ties join the step), steps of 3 and 2 micro-batches.
    assert convergence.group_steps([10] * 12, 25) == [3, 5, 8, 10, 12]
    assert convergence.group_steps([], 10) == []
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="target must be positive"):
            convergence.group_steps([1, 2], bad)


def test_the_corpus_follows_the_seed_shares_and_holds_whole_files_out():
    lengths = np.concatenate(
        [np.full(n, length) for n, length in ((100, 20), (100, 40), (100, 80), (100, 200), (100, 400))]
    )
    picked = _corpus.matched(lengths, 512, None, np.random.default_rng(0))
    counts = np.bincount(np.searchsorted([32, 64, 128, 256], lengths[picked], side="right"), minlength=5)
    # The scarcest bin at its share (100 of 0.337 → 296 samples), every other at its own share.
    assert counts.tolist() == [int(100 / 0.337 * s) for s in _corpus.SEED_SHARES]
    paths = _corpus.source_files(40)
    assert paths == sorted(paths) and not any("test" in p.parts for p in paths)
    kinds = {kind for kind, _ in _corpus.documents(paths[0])}
    assert "module" in kinds


@pytest.mark.slow  # trains 12 small models
def test_a_quick_smoke_run_trains_every_planned_sample_of_every_strategy(tmp_path):
    args = convergence.parse(
        ["--quick", "--steps", "3", "--seeds", "1", "--evals", "1", "--files", "120", "--out", str(tmp_path / "out"),
         "--cache", str(tmp_path / "cache")]
    )  # fmt: skip
    runs, _, text = convergence.run_all(args)
    assert {(r.view, r.strategy) for r in runs} == {(v, s) for v in ("tokens", "steps") for s in convergence.STRATEGIES}
    for run in runs:
        planned = [indices for step in run.steps for indices, _ in step]
        assert len(run.steps) == 3 and len(run.trained) == len(planned)
        assert all(np.array_equal(a, b) for a, b in zip(run.trained, planned, strict=True))
        lengths = _corpus.load(next((tmp_path / "cache").glob("stdlib-*"))).lengths
        assert run.curve[-1]["tokens"] == sum(int(lengths[i].sum()) for i in planned)
        assert [p["step"] for p in run.curve] == [0, 3] and all(np.isfinite(p["all"]) for p in run.curve)
        if run.view == "steps":
            assert all(len(step) == convergence.ACCUMULATION for step in run.steps)
    record = json.loads((tmp_path / "out" / "convergence.json").read_text())
    assert set(record["summary"]) == {"tokens", "steps"}
    assert all(set(rows) == set(convergence.STRATEGIES) for rows in record["summary"].values())
    table = (tmp_path / "out" / "convergence.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| strategy")]
    assert len(rows) == 2 * len(convergence.STRATEGIES) and text.strip() == table.strip()
    assert (tmp_path / "out" / "convergence.png").stat().st_size > 10_000


def test_cuda_without_a_device_and_unknown_strategies_exit_2(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert convergence.main(["--device", "cuda", "--out", str(tmp_path)]) == 2
    assert convergence.main(["--strategies", "sorted,bogus", "--out", str(tmp_path)]) == 2


@pytest.mark.slow  # trains 4 small models
def test_several_seeds_give_each_strategy_a_tost_verdict_against_a_shuffle(tmp_path):
    args = convergence.parse(
        ["--quick", "--steps", "2", "--seeds", "2", "--evals", "1", "--files", "120", "--views", "tokens",
         "--strategies", "shuffle,dflash_padded", "--margin", "0.5", "--out", str(tmp_path / "out"),
         "--cache", str(tmp_path / "cache")]
    )  # fmt: skip
    runs, summary, text = convergence.run_all(args)
    padded = summary["summary"]["tokens"]["dflash_padded"]
    assert len(padded["versus_shuffle"]) == 2 and padded["equivalence"]["margin"] == 0.5
    assert "equivalence" not in summary["summary"]["tokens"]["shuffle"]
    final = {(r.strategy, r.seed): r.curve[-1]["all"] for r in runs}
    assert padded["versus_shuffle"] == [final[("dflash_padded", s)] - final[("shuffle", s)] for s in (0, 1)]
    assert "Equivalence to a full shuffle" in text and padded["equivalence"]["verdict"] in text


@pytest.mark.slow  # trains 3 small models
def test_reused_runs_are_what_training_again_gives_and_another_setup_is_refused(tmp_path):
    common = ["--quick", "--evals", "1", "--files", "120", "--views", "tokens", "--strategies", "shuffle",
              "--cache", str(tmp_path / "cache")]  # fmt: skip
    first, _, _ = convergence.run_all(
        convergence.parse([*common, "--steps", "2", "--seeds", "1", "--out", str(tmp_path / "a")])
    )
    record = tmp_path / "a" / "convergence.json"
    again, _, _ = convergence.run_all(
        convergence.parse(
            [*common, "--steps", "2", "--seeds", "2", "--reuse", str(record), "--out", str(tmp_path / "b")]
        )
    )
    assert [r.seed for r in again] == [0, 1]
    assert again[0].curve == json.loads(record.read_text())["runs"][0]["curve"] and not again[0].trained  # reused
    assert again[1].trained  # trained here
    fresh, _, _ = convergence.run_all(
        convergence.parse([*common, "--steps", "2", "--seeds", "1", "--out", str(tmp_path / "c")])
    )
    assert fresh[0].curve == first[0].curve, "training is deterministic for a seed, so reusing a run is exact"
    # A run recorded with another plan (the library's planner changed since) is trained again, not reused,
    # and so is a run recorded without a digest.
    changed = json.loads(record.read_text())
    changed["runs"][0]["plan"] = "another plan"
    (tmp_path / "changed.json").write_text(json.dumps(changed))
    del changed["runs"][0]["plan"]
    (tmp_path / "undigested.json").write_text(json.dumps(changed))
    for name in ("changed.json", "undigested.json"):
        retrained, _, _ = convergence.run_all(
            convergence.parse([*common, "--steps", "2", "--seeds", "1", "--reuse", str(tmp_path / name),
                               "--out", str(tmp_path / f"e-{name}")])
        )  # fmt: skip
        assert retrained[0].trained and retrained[0].plan == first[0].plan
        assert retrained[0].curve == first[0].curve
    with pytest.raises(SystemExit, match="recorded for another setup"):
        convergence.run_all(
            convergence.parse(
                [*common, "--steps", "3", "--seeds", "1", "--reuse", str(record), "--out", str(tmp_path / "d")]
            )
        )


def test_a_dflash_strategy_at_a_target_plans_at_it_and_is_recorded_without_a_dot(tmp_path):
    import _at_target
    import _convergence_report
    import dflash_batch as db

    lengths = np.array([5, 9, 30, 31, 33, 60, 64, 64, 120, 7] * 30)
    got = convergence.micro_batches("dflash_padded@0.9", lengths, 256, 128, 3, 1)
    sampler = db.BucketSampler(lengths, max_tokens=256, seed=3, accumulation=4, target_efficiency=0.9)
    assert [b.tolist() for b, packed in got] == [b.tolist() for b in sampler.plan(1)]
    assert _at_target.key("dflash_padded@0.9") == "dflash_padded_at_09"
    assert _convergence_report.name_of("dflash_padded_at_09") == "dflash_batch padded, target_efficiency=0.9"
    for bad in ("shuffle@0.9", "dflash_padded@2", "dflash_padded@x"):
        assert convergence.main(["--quick", "--strategies", bad, "--out", str(tmp_path)]) == 2

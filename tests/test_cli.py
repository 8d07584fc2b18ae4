"""The dflash-batch command line."""

from __future__ import annotations

import numpy as np
from dflash_batch.cli import main


def test_demo_prints_plan_and_baselines(capsys):
    assert main(["demo", "--samples", "20000", "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert "padding efficiency" in out and "seed's 6 buckets" in out and "random shuffle" in out


def test_analyze_npy(tmp_path, capsys):
    path = tmp_path / "lengths.npy"
    np.save(path, np.array([100, 200, 300, 400] * 50))
    assert main(["analyze", str(path), "--batch-size", "4", "--boundaries", "0,250,400"]) == 0
    out = capsys.readouterr().out
    assert "200 samples; edges [0, 250, 400]" in out and "efficiency" in out


def test_analyze_reports_bad_input_without_traceback(tmp_path, capsys):
    assert main(["analyze", str(tmp_path / "missing.npy")]) == 2
    assert "cannot read lengths" in capsys.readouterr().err
    path = tmp_path / "lengths.npy"
    np.save(path, np.array([100, 9000]))
    assert main(["analyze", str(path), "--max-tokens", "4096"]) == 2
    assert "exceeds max_tokens 4096" in capsys.readouterr().err

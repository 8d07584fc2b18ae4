"""The dflash-batch command line."""

from __future__ import annotations

import numpy as np
from dflash_batch.cli import main


def test_demo_prints_plan_and_baselines(capsys):
    assert main(["demo", "--samples", "20000", "--epochs", "2", "--loader-rows", "2000"]) == 0
    out = capsys.readouterr().out
    assert "padding efficiency" in out and "seed's 6 buckets" in out and "random shuffle" in out
    assert "window_tv" in out and "over windows of 32 batches" in out
    assert "Loader (CPU, int64 tensors) over a 2,000-row Arrow file" in out


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


def test_analyze_an_arrow_dataset(tmp_path, capsys):
    from _arrow import token_rows, token_table, write_ipc

    path = write_ipc(tmp_path / "data.arrow", token_table(token_rows(300)))
    assert main(["analyze", str(path), "--batch-size", "8", "--column", "input_ids"]) == 0
    assert "300 samples" in capsys.readouterr().out
    assert main(["analyze", str(path), "--column", "nope"]) == 2
    assert 'no column "nope"' in capsys.readouterr().err

"""The dflash-batch command line."""

from __future__ import annotations

import numpy as np
from dflash_batch.tools.cli import main


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
    assert "200 samples" in out and "edges: [0, 250, 400]" in out and "efficiency" in out


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


def test_analyze_demo_prints_the_strategies_table(capsys):
    assert main(["analyze", "--demo", "--samples", "30000"]) == 0
    out = capsys.readouterr().out
    for name in ("sorted static", "full shuffle", "seed's 6 buckets", "HF mega-batch sorting", "dflash_batch"):
        assert name in out
    assert "dflash_batch + trim" in out
    assert "predicted padding efficiency" in out and "window_tv" in out and "planned in" in out


def test_analyze_names_the_target_the_buckets_aimed_at_for_the_step_shape(capsys):
    """The padded default follows the step shape (0.93 in steps of 2 to 7 micro-batches): analyze says which
    target its edges aimed at, and says nothing of a target for a bucket count."""
    base = ["analyze", "--demo", "--samples", "20000", "--no-peers"]
    assert main([*base, "--accumulation", "4", "--world-size", "1"]) == 0
    assert "aimed at target_efficiency 0.93," in capsys.readouterr().out
    assert main([*base, "--accumulation", "4", "--world-size", "2"]) == 0
    assert "aimed at target_efficiency 0.97," in capsys.readouterr().out
    assert main([*base, "--boundaries", "5"]) == 0
    out = capsys.readouterr().out
    assert "buckets: 5, predicted" in out and "aimed at" not in out


def test_analyze_shows_what_trimming_gains_without_accumulation(capsys):
    import json

    assert main(["analyze", "--demo", "--samples", "30000", "--accumulation", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["strategies"]
    plain, trimmed = rows["dflash_batch"], rows["dflash_batch + trim"]
    assert trimmed["sync_efficiency"] > plain["sync_efficiency"] + 0.005
    assert trimmed["steps"] > plain["steps"] and trimmed["efficiency"] >= 0.97


def test_analyze_json_and_plot(tmp_path, capsys):
    import json

    png = tmp_path / "report.png"
    assert main(["analyze", "--demo", "--samples", "20000", "--json", "--plot", str(png), "--batch-size", "8"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["samples"] == 20000 and result["rule"] == {"batch_size": 8}
    assert "dflash_batch + trim" not in result["strategies"]  # trimming needs a token budget
    assert set(result["strategies"]["dflash_batch"]) == {
        "efficiency",
        "window_tv",
        "window_tv_tail",
        "length_gap",
        "length_gap_tail",
        "churn",
        "rank_imbalance_p99",
        "sync_efficiency",
        "sync_efficiency_step",
        "end_to_end_efficiency",
        "end_to_end_efficiency_step",
        "steps",
    }
    assert result["strategies"]["sorted static"]["churn"] == 1.0
    for row in result["strategies"].values():  # end to end = balance × the useful share, so never above either
        assert 0 < row["end_to_end_efficiency"] <= min(row["sync_efficiency"], row["efficiency"]) + 1e-9
    sync = {name: row["sync_efficiency"] for name, row in result["strategies"].items()}
    assert sync["sorted static"] > 0.99 and all(0 < v <= 1 for v in sync.values())
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_analyze_needs_exactly_one_source(tmp_path, capsys):
    assert main(["analyze"]) == 2
    assert "pass a SOURCE or --demo" in capsys.readouterr().err
    path = tmp_path / "l.npy"
    np.save(path, np.array([5, 6] * 100))
    assert main(["analyze", str(path), "--demo"]) == 2


def test_analyze_bad_arguments_exit_with_usage(capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", "--demo", "--max-tokens", "lots"])
    assert exit_info.value.code == 2
    assert "argument --max-tokens: 'lots' is not an integer; pass an integer ≥ 1" in capsys.readouterr().err
    assert main(["analyze", "--demo", "--samples", "1000", "--target-efficiency", "1.5"]) == 2
    assert "target_efficiency=1.5 is invalid" in capsys.readouterr().err
    for argv in (["demo", "--samples", "-1"], ["demo", "--epochs", "0"], ["analyze", "--demo", "--samples", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert f"argument {argv[-2]}: {argv[-1]} is invalid; pass an integer ≥ 1" in capsys.readouterr().err


def test_cli_refuses_bad_arguments_before_doing_the_work(tmp_path, capsys):
    """Regressions: an unwritable --plot, a state.json that is a list and a huge demo printed tracebacks
    after the work; --batch-size 0 fell back to max_tokens; --loader-rows -1 was accepted; a .npy of
    floats was truncated silently."""
    import pytest

    lengths = tmp_path / "lengths.npy"
    np.save(lengths, np.array([100, 200, 300] * 20))
    assert main(["analyze", str(lengths), "--plot", str(tmp_path / "missing-dir" / "p.png")]) == 2
    assert "--plot" in capsys.readouterr().err
    for argv in (
        ["analyze", str(lengths), "--batch-size", "0"],
        ["demo", "--loader-rows", "-1"],
        ["demo", "--samples", str(10**12)],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert "is invalid" in capsys.readouterr().err
    floats = tmp_path / "floats.npy"
    np.save(floats, np.array([100.5, 200.2]))
    assert main(["analyze", str(floats)]) == 2
    assert "float64 values; lengths are integers" in capsys.readouterr().err
    directory = tmp_path / "ds"
    directory.mkdir()
    (directory / "state.json").write_text("[1, 2]")
    assert main(["analyze", str(directory), "--column", "input_ids"]) == 2
    assert "holds a list, not the object save_to_disk writes" in capsys.readouterr().err


def test_state_json_problems_name_the_file(tmp_path):
    import dflash_batch as db
    import pytest

    directory = tmp_path / "ds"
    directory.mkdir()
    for text, message in (
        ("not json", "is not JSON"),
        ('{"_data_files": [{"name": "x"}]}', "shard entry 0 .* has no filename"),
        ('{"_data_files": 3}', "_data_files is a int"),
    ):
        (directory / "state.json").write_text(text)
        with pytest.raises(db.DataError, match=message) as info:
            db.read_lengths(str(directory))
        assert "state.json" in str(info.value)


def test_analyze_prints_packed_rows_beside_their_lower_bound(tmp_path, capsys):
    """Under a token budget: the rows an epoch packs and the fewest any packing could use, ⌈Σ L / max_tokens⌉
    (twelve samples of 3 tokens in rows of 8: 36 tokens, at least 5 rows)."""
    import json

    path = tmp_path / "lengths.npy"
    np.save(path, np.array([3] * 12))
    assert main(["analyze", str(path), "--max-tokens", "8", "--world-size", "1", "--no-peers"]) == 0
    out = capsys.readouterr().out
    assert "packed (mode='packed') into rows of 8 tokens: 6 rows an epoch" in out
    assert "the fewest any packing could use: 5" in out
    assert main(["analyze", str(path), "--max-tokens", "8", "--world-size", "1", "--no-peers", "--json"]) == 0
    packed = json.loads(capsys.readouterr().out)["packing"]
    assert packed == {"capacity": 8, "rows": 6, "lower_bound": 5, "fill": 36 / 48}
    assert main(["analyze", str(path), "--batch-size", "4", "--no-peers", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["packing"] is None


def _save_to_disk(path, rows: int = 300) -> None:
    import datasets

    rng = np.random.default_rng(0)
    datasets.Dataset.from_dict({"input_ids": [list(range(int(n))) for n in rng.integers(10, 3000, rows)]}).save_to_disk(
        str(path)
    )


def test_analyze_reads_a_save_to_disk_folder_by_one_default_column_rule(tmp_path, capsys):
    """Regression (issue 59): `dflash-batch analyze DIR` on a save_to_disk folder failed (analyze,
    read_lengths and BucketSampler(path) defaulted to seq_len, TokenStore to input_ids). Now every reader
    of lengths takes seq_len when the data has it, else input_ids."""
    import dflash_batch as db

    _save_to_disk(tmp_path / "d")
    assert main(["analyze", str(tmp_path / "d"), "--no-peers", "--max-tokens", "4096"]) == 0
    assert "300 samples" in capsys.readouterr().out
    lengths = db.read_lengths(tmp_path / "d")
    assert np.array_equal(lengths, db.TokenStore(tmp_path / "d").lengths())
    assert len(db.BucketSampler(tmp_path / "d", max_tokens=4096).plan(0).indices) == 300


def test_errors_name_the_command_lines_own_flags(tmp_path, capsys):
    _save_to_disk(tmp_path / "d")
    assert main(["analyze", str(tmp_path / "d"), "--column", "nope"]) == 2
    err = capsys.readouterr().err
    assert "pass --column input_ids" in err and 'column="' not in err


def test_oversize_skip_reports_the_samples_and_tokens_it_leaves_out(tmp_path, capsys):
    """Regression (issue 59): --oversize skip reported only the sample count of what it dropped."""
    import json

    path = tmp_path / "lengths.npy"
    lengths = np.array([100, 200, 3000, 5000] * 50)
    np.save(path, lengths)
    args = ["analyze", str(path), "--max-tokens", "2048", "--oversize", "skip", "--no-peers"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "left out 100 samples" in out and "400,000 tokens, 96.4% of the dataset's" in out
    assert main([*args, "--json"]) == 0
    skipped = json.loads(capsys.readouterr().out)["skipped"]
    assert skipped == {"samples": 100, "tokens": 400_000, "token_share": 400_000 / int(lengths.sum())}


def test_a_closed_pipe_ends_quietly():
    """Regression (issue 59): `--json | head -c 100` ended in a BrokenPipeError traceback."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "dflash_batch.tools.cli", "analyze", "--demo", "--samples", "20000", "--json"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # the reader is gone before a byte is written
    err = child.stderr.read().decode()
    assert child.wait(timeout=300) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err

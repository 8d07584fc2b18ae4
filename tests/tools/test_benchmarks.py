"""The benchmark scripts run end to end at a tiny size, so they never rot (their figures come from full
runs: see the README)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run(script: str, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow  # runs a benchmark script
def test_plan_benchmark():
    out = run("plan.py", "--no-big", "--repeats", "3", "--lhotse-samples", "2000")
    assert "dflash_batch, boundaries='auto'" in out and "plan ≤ 10 ms per epoch" in out
    assert "lhotse DynamicBucketingSampler, 6 buckets, on the first 2,000 samples" in out
    assert "plan time per rank vs world_size" in out and "       512" in out


@pytest.mark.slow  # runs a benchmark script
def test_mixing_benchmark():
    out = run("mixing.py", "--samples", "20000", "--repeats", "2")
    assert "window_tv ≤ 0.075" in out and "frontier: balance_tolerance" in out and "0.05" in out
    assert "per optimizer step ≥ 0.970" in out and "sorted static batches (the reference)" in out
    assert "  + trim_steps=True" in out and "; trimmed " in out
    assert "packed rows, fill ≥ 0.999" in out and "the same with target_efficiency=0.98" in out


@pytest.mark.slow  # runs a benchmark script
def test_schedules_benchmark():
    out = run("schedules.py", "--samples", "20000", "--repeats", "1")
    assert "padded, linear schedule" in out and "packed, constant schedule" in out
    assert "rows repeated within a cycle 0;" in out and "target: per-step source TV ≤ 0.03" in out


def test_packing_benchmark():
    out = run("packing.py", "--samples", "5000", "--repeats", "2", "--grain-samples", "400")
    assert "Python first-fit (random order)" in out and "window_tv no worse:" in out
    assert "best fit (bucketed, 1 bucket)" in out and "× best fit's" in out
    assert "grain BestFitPackIterDataset, 512 bins" in out and "plan + collate every row" in out
    assert "lower bound: ⌈Σ L / 16384⌉" in out and "dflash_batch packed, cost=(a, b)" in out
    assert "fill ≥ 0.999:" in out and "end to end ≥ 0.99:" in out
    assert "context parallelism: rows of 32768 tokens" in out and "zigzag spread ≤ 1%:" in out
    assert "fill ≥ 0.99 (padding as waste):" in out and "plan ≤ 2× packed:" in out


def test_mask_benchmark():
    pytest.importorskip("pyarrow")
    out = run("mask.py", "--rows", "2000", "--batches", "20", "--rounds", "2")
    assert "target ≤ 1.3×" in out and out.count("×   M") == 2 and "padded" in out and "packed" in out


@pytest.mark.slow  # runs a benchmark script
def test_read_benchmark(tmp_path):
    pytest.importorskip("datasets")
    out = run("read.py", "--rows", "3000", "--cache-dir", str(tmp_path), "--repeats", "2", "--batches", "5")
    assert "dflash_batch read_lengths(seq_len)" in out and "gather ≥ 20× ds[list]" in out
    assert "megatron lengths (902,087) ≤ 20 ms" in out and "dflash_batch TokenStore.gather (megatron)" in out


@pytest.mark.slow  # runs a benchmark script
def test_loader_benchmark(tmp_path):
    pytest.importorskip("datasets")
    pytest.importorskip("torch")
    out = run("loader.py", "--rows", "3000", "--cache-dir", str(tmp_path), "--batches", "20")
    assert "(b) db.Loader → torch int64, fresh mapping" in out and "prefetch ring" in out
    assert "(b) db.Loader → torch int64, mapped pages" in out and "Loader ≥ 50× (c)" in out
    assert "(e) collation with a loss mask" in out and "mask ≤ 1.3× the time without" in out


def test_cuda_check_dry_run_on_the_cpu():
    """The GPU script's checks that need no GPU (device batches equal the host collation for int64, int32
    with pad_to_multiple_of, packed rows; shutdown) run on the CPU, so the script works when a GPU comes."""
    pytest.importorskip("torch")
    pytest.importorskip("pyarrow")
    out = run("cuda_check.py", "--device", "cpu", "--rows", "2000", "--steps", "30")
    for line in ("2. 30 device batches equal", "5. ", "6. ", "7. breaking out", "all checks passed"):
        assert line in out, out


def test_cuda_check_without_cuda_exits_2():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    result = subprocess.run([sys.executable, str(BENCHMARKS / "cuda_check.py")], capture_output=True, text=True)
    assert result.returncode == 2 and "CUDA is not available" in result.stdout


@pytest.mark.gpu
def test_cuda_check_passes_on_a_gpu():
    """The CUDA pipeline's checks (copies on a side stream, pinned slots, events) pass on a real GPU."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "cuda_check.py"), "--rows", "20000", "--steps", "100"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0 and "all checks passed" in result.stdout, result.stdout + result.stderr


@pytest.mark.slow  # runs a benchmark script
def test_train_gpu_dry_run_on_the_cpu():
    """The GPU training table's script runs end to end on a tiny model, so it works when a GPU comes."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("pyarrow")
    out = run("train_gpu.py", "--device", "cpu", "--tiny", "--samples", "6000")
    for line in ("sorted static", "full shuffle", "seed's 6 buckets", "dflash_batch padded", "dflash_batch packed"):
        assert line in out, out
    assert "Ktok/s a rank, 8 in sync" in out and "packed ≥ 1.0 of sorted static" in out


@pytest.mark.slow  # trains a small transformer for 4 epochs on the CPU
def test_calibrate_benchmark():
    pytest.importorskip("torch")
    out = run("calibrate.py", "--samples", "300")
    for key in ('"true_price"', '"fitted_price"', '"tokens"', '"refit"', '"true"', '"measured"', '"predicted"'):
        assert key in out, key

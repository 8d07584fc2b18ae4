"""The examples run as documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.multiprocess  # torchrun
def test_ddp_example_runs_under_torchrun():
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not built in")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    result = subprocess.run(
        [*command, str(EXAMPLES / "train_ddp.py"), "--steps", "5", "--samples", "500"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained 5 steps on 2 ranks" in result.stdout

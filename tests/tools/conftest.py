"""The benchmark scripts are modules the tests here import (``import online_step``): their folder joins the
import path once, here, for every test of this folder."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

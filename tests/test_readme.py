"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    exec(compile(blocks[0], str(README), "exec"), {"__name__": "readme"})
    efficiency = float(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.9 < efficiency <= 1.0


def test_readme_reading_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2, "README lost its dataset-reading example"
    exec(compile(blocks[1], str(README), "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out.strip().splitlines()[-1] == "[1 2 3] 300"


def test_readme_loader_example_runs(capsys):
    pytest.importorskip("torch")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 3, "README lost its Loader example"
    exec(compile(blocks[2], str(README), "exec"), {"__name__": "readme"})
    dtype, ring = capsys.readouterr().out.strip().splitlines()[-1].split()
    assert dtype == "torch.int64" and int(ring) > 0


def test_readme_packing_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 4, "README lost its packing example"
    exec(compile(blocks[3], str(README), "exec"), {"__name__": "readme"})
    utilization = float(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.97 < utilization <= 1.0


def test_readme_keeps_the_two_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text

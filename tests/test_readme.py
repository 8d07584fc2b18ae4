"""Every Python block of the README runs as written, and prints what it promises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)

# The last line each block prints, checked by a predicate; every block must be listed here.
EXPECTED = {
    "first screen": lambda out: "steps an epoch;" in out and float(out.split()[-1]) > 0.5,
    "Trainer": lambda out: out.split() == [out.split()[0], "True"] and int(out.split()[0]) > 0,
    "TRL": lambda out: out == "labels True",
    "packed HF": lambda out: out.startswith("torch.Size([1, 32])"),
    "accelerate": lambda out: out.split()[1] == "1",
    "accelerate resume": lambda out: out == "True",
    "torch DataLoader": lambda out: out == "True",
    "Lightning": lambda out: int(out) > 0,
    "reading": lambda out: out == "[1 2 3] 300",
    "megatron": lambda out: out == "[3 1 2] [5 6 7] [0 2 3]",
    "Loader": lambda out: out == "torch.int64 True",
    "packing": lambda out: 0.97 < float(out) <= 1.0,
    "cost": lambda out: 0.5 < float(out) <= 1.0,
}


def test_every_block_is_checked():
    assert len(BLOCKS) == len(EXPECTED), f"README has {len(BLOCKS)} python blocks, the test knows {len(EXPECTED)}"


@pytest.mark.parametrize(("index", "name"), list(enumerate(EXPECTED)))
def test_readme_block_runs(index, name, capsys, tmp_path, monkeypatch):
    if name != "reading" and name != "packing":
        pytest.importorskip("torch")
    if name in ("Trainer", "TRL", "packed HF", "cost"):
        pytest.importorskip("transformers")
    if name == "TRL":
        pytest.importorskip("trl")
    if name.startswith("accelerate"):
        pytest.importorskip("accelerate")
    if name == "Lightning":
        pytest.importorskip("lightning")
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"{README}:{name}", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert EXPECTED[name](out), f"{name}: {out!r}"


def test_readme_keeps_the_two_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text

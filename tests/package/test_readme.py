"""Every Python block of the README and the docs pages runs as written, and prints what it promises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: The pages with runnable blocks, in the order of EXPECTED below.
PAGES = [
    README,
    *(
        ROOT / "docs" / f"{name}.md"
        for name in (
            "concepts",
            "usage",
            "trainers",
            "reading",
            "raw_data",
            "packing",
            "ranks",
            "mixtures",
            "calibration",
            "billion",
            "context_parallel",
            "resume",
        )
    ),
]
SOURCES = [(page, block) for page in PAGES for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S)]
BLOCKS = [block for _, block in SOURCES]

# The last line each block prints, checked by a predicate; every block must be listed here.
EXPECTED = {
    "first screen": lambda out: "steps an epoch;" in out and float(out.split()[-1]) > 0.5,
    "concepts": lambda out: out == "True True",
    "settings groups": lambda out: out == "packed 2",
    "Trainer": lambda out: out.split() == [out.split()[0], "True"] and int(out.split()[0]) > 0,
    # TRL ≥ 1.1 turns its masks into labels; 1.0 keeps the mask column (the store applies either).
    "TRL": lambda out: out.split()[-1] == "True" and out.split()[0] in ("labels", "assistant_masks", "completion_mask"),
    "Trainer collator": lambda out: int(out) > 0,
    "packed HF": lambda out: out.startswith("torch.Size([1, 32])"),
    "accelerate": lambda out: out.split()[1] == "1",
    "accelerate resume": lambda out: out == "True",
    "torch DataLoader": lambda out: out == "True",
    "Lightning": lambda out: int(out) > 0,
    "reading": lambda out: out == "[1 2 3] 300",
    "megatron": lambda out: out == "[3 1 2] [5 6 7] [0 2 3]",
    "Loader": lambda out: out == "torch.int64 True",
    "raw chat": lambda out: out == "True 2000",
    "parquet windows": lambda out: out == "True 20000",
    "streamed windows": lambda out: out == "True",
    "stream Trainer": lambda out: out == "30 True",
    "packing": lambda out: 0.97 < float(out) <= 1.0,
    "cost": lambda out: 0.5 < float(out) <= 1.0,
    "RL step": lambda out: out.split()[0] == "True" and int(out.split()[1]) > 0 and out.split()[2] == "True",
    "mixture Loader": lambda out: out == "['chat', 'code']",
    "mixture schedule": lambda out: out.startswith("[0.3, ") and out.endswith(", 0.5, 0.5]"),
    "mixture Trainer": lambda out: out == "['loss/chat', 'loss/code']",
    "mixture TRL": lambda out: out == "completion_mask True",
    "StepTimer": lambda out: out == "True 2",
    "plan_dir": lambda out: out == "True",
    "lengths mapped": lambda out: out == "True",
    "lengths cached": lambda out: out == "uint16 True",
    "context parallel": lambda out: out == "torch.Size([1, 256]) True",
    "resume elsewhere": lambda out: out == "True",
}


def test_every_block_is_checked():
    assert len(BLOCKS) == len(EXPECTED), f"the pages have {len(BLOCKS)} python blocks, the test knows {len(EXPECTED)}"
    others = sorted(set((ROOT / "docs").glob("*.md")) - set(PAGES))
    assert not [p for p in others if "```python" in p.read_text()], "a page with python blocks is not in PAGES"


@pytest.mark.parametrize(("index", "name"), list(enumerate(EXPECTED)))
def test_readme_block_runs(index, name, capsys, tmp_path, monkeypatch):
    if name not in ("reading", "packing"):
        pytest.importorskip("torch")
    if name in (
        "Trainer",
        "TRL",
        "Trainer collator",
        "packed HF",
        "cost",
        "mixture Trainer",
        "mixture TRL",
        "raw chat",
    ):
        pytest.importorskip("transformers")
    if name in ("TRL", "mixture TRL"):
        pytest.importorskip("trl")
    if name.startswith("accelerate"):
        pytest.importorskip("accelerate")
    if name == "Lightning":
        pytest.importorskip("lightning")
    if name in ("streamed windows", "stream Trainer"):
        pytest.importorskip("datasets")
    monkeypatch.chdir(tmp_path)
    page, block = SOURCES[index]
    exec(compile(block, f"{page}:{name}", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert EXPECTED[name](out), f"{name}: {out!r}"


def test_readme_keeps_the_two_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text


def test_readme_is_short_and_every_link_resolves():
    """The README is read in five minutes and sends the rest to docs/: every docs page is linked from it,
    and every relative link of the README and the pages (anchors included) lands on something."""
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    docs = sorted((ROOT / "docs").glob("*.md"))
    assert docs and all(f"docs/{page.name}" in text for page in docs), "a docs page the README does not link"
    for page in [README, *docs]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            landing = (page.parent / path).resolve() if path else page
            assert landing.exists(), f"{page.name}: link {target} lands nowhere"
            if anchor and landing.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", landing.read_text(), flags=re.M)
                slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
                assert anchor in slugs, f"{page.name}: link {target} names no heading of {landing.name}"

"""The figures the docs quote: each benchmark's ``--json FILE`` writes its results under its own section of
one JSON file (``docs/figures.json``), and every figure in ``README.md`` and ``docs/*.md`` is a marker

    <!--fig mixing.default.efficiency .3f-->0.980<!--/fig-->

whose text is that key's value in that format (rendered, only the value shows). ``python
benchmarks/_figures.py`` rewrites every marker's text from the JSON; ``--check`` lists the ones that
differ (``tests/package/test_docs_figures.py`` runs it, and recomputes the figures that are not timings). So no
figure in the docs is typed by hand. The settings table of ``docs/usage.md`` is rewritten here too, from
the settings' one declaration (:mod:`dflash_batch.planning.settings`)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from dflash_batch.tools import docs

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures.json"
MARKER = re.compile(r"<!--fig ([\w.\-+]+) ([^>]*?)-->(.*?)<!--/fig-->", re.S)


def write(path: str | Path | None, section: str, figures: dict[str, Any], command: str) -> None:
    """Stores ``figures`` as ``section`` of the JSON file at ``path`` (other sections kept), with the
    command that measured them."""
    if path is None:
        return
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[section] = {"command": command, **plain(figures)}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def command_of(script: str, given: list[str]) -> str:
    """The command that measured a benchmark's figures: its arguments without where files go
    (``--cache``, ``--json`` and their values), which are not part of what was measured."""
    dropped = ("--cache", "--json")
    kept = [a for i, a in enumerate(given) if a not in dropped and (i == 0 or given[i - 1] not in dropped)]
    return " ".join([f"python benchmarks/{script}", *kept])


def plain(value: Any) -> Any:
    """JSON-ready: numpy scalars as Python numbers, tuples as lists, keys as strings."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "item"):
        return value.item()
    return value


def lookup(figures: dict[str, Any], key: str) -> Any:
    value: Any = figures
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(f"{key}: no {part!r} in docs/figures.json (run the benchmark with --json)")
        value = value[part]
    return value


def formatted(value: Any, spec: str) -> str:
    """A figure as the docs show it: a format spec (``.3f``, ``,d``, ``.1%``), optionally ending in a unit:
    ``ms``/``us`` for seconds shown in milli/microseconds, ``M``/``G`` for rates in millions/billions, ``x``
    for a ratio shown with a ×."""
    if spec.endswith("ms"):  # seconds, shown in milliseconds
        return format(value * 1e3, spec[:-2] or ".1f")
    if spec.endswith("us"):  # seconds, shown in microseconds
        return format(value * 1e6, spec[:-2] or ".1f")
    if spec.endswith("M"):  # a rate per second, shown in millions
        return format(value / 1e6, spec[:-1] or ".0f")
    if spec.endswith("G"):  # a rate per second, shown in billions
        return format(value / 1e9, spec[:-1] or ".2f")
    if spec.endswith("x"):
        return format(value, spec[:-1] or ".0f") + "×"
    return format(value, spec)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def markers(text: str) -> list[tuple[str, str, str]]:
    """``(key, spec, shown)`` of every marker in ``text``."""
    return [(m.group(1), m.group(2).strip(), m.group(3)) for m in MARKER.finditer(text)]


def render(text: str, figures: dict[str, Any]) -> str:
    return MARKER.sub(
        lambda m: (
            f"<!--fig {m.group(1)} {m.group(2).strip()}-->"
            f"{formatted(lookup(figures, m.group(1)), m.group(2).strip())}<!--/fig-->"
        ),
        text,
    )


def stale(figures: dict[str, Any] | None = None) -> list[str]:
    """Every marker whose text is not its figure, as ``page: key shows X, the JSON says Y``."""
    figures = json.loads(FIGURES.read_text()) if figures is None else figures
    problems = []
    for page in pages():
        for key, spec, shown in markers(page.read_text()):
            want = formatted(lookup(figures, key), spec)
            if shown != want:
                problems.append(f"{page.relative_to(ROOT)}: {key} shows {shown!r}, the JSON says {want!r}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description="Rewrite (or --check) the docs' figures from docs/figures.json")
    parser.add_argument("--check", action="store_true", help="list stale figures, exit 1 if any")
    args = parser.parse_args()
    if args.check:
        problems = stale()
        print("\n".join(problems) or "every figure matches docs/figures.json")
        sys.exit(1 if problems else 0)
    figures = json.loads(FIGURES.read_text())
    for page in pages():
        text = page.read_text()
        new = render(text, figures)
        if docs.START in new:  # the settings table, from the one declaration
            new = docs.written(new)
        if text != new:
            page.write_text(new)
            print(f"updated {page.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

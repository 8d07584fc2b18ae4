"""The docs' tables written from the code's own declarations: the settings table of ``docs/usage.md``
from :data:`dflash_batch.planning.settings.SETTINGS`. ``python benchmarks/_figures.py`` (``make figures``)
rewrites it between its markers; ``tests/planning/test_settings.py`` fails when the page drifts."""

from __future__ import annotations

from ..planning.settings import SETTINGS

START, END = "<!--settings-->", "<!--/settings-->"


def table() -> str:
    """The settings as the markdown table of ``docs/usage.md``."""
    rows = ["| setting | default | accepts | what it does |", "|---|---|---|---|"]
    for s in SETTINGS:
        doc = s["doc"].replace("|", "\\|")
        rows.append(f"| `{s['name']}` | `{s['default']}` | {s['range']} | {doc} |")
    return "\n".join(rows)


def written(page: str) -> str:
    """``page`` with the table between its markers replaced by :func:`table`."""
    if START not in page or END not in page:
        raise ValueError(f"the page has no {START} ... {END} markers for the settings table")
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"

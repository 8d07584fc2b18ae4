"""The planning settings of :class:`~dflash_batch.BucketSampler`, as the core's binding declares them once
(``dflash_batch._core.SETTINGS``: name, type, default, range, doc). The sampler's docstring and the settings
table of ``docs/usage.md`` are written from it; ``tests/test_settings.py`` checks the sampler's signature,
``Config``'s and the stubs against it. ``python benchmarks/_figures.py`` (``make figures``) rewrites the
table between its markers.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import dflash_batch._core as _core

#: The declaration: one dict per setting, in the order of the signature and of checkpoints.
SETTINGS: tuple[dict[str, str], ...] = tuple(_core.SETTINGS)

START, END = "<!--settings-->", "<!--/settings-->"


def names() -> tuple[str, ...]:
    return tuple(s["name"] for s in SETTINGS)


def default(name: str) -> Any:
    """The declared default of ``name`` as a value."""
    return _literal(next(s["default"] for s in SETTINGS if s["name"] == name))


def _literal(text: str) -> Any:
    import ast

    return ast.literal_eval(text)


def _plain(doc: str) -> str:
    """Markdown's backquotes as reStructuredText's double ones, for a docstring."""
    return re.sub(r"`([^`]+)`", r"``\1``", doc)


def docstring(indent: int = 8) -> str:
    """The ``Args`` entries of every setting, as a Google-style docstring block."""
    lines: list[str] = []
    for s in SETTINGS:
        entry = f"{s['name']}: {_plain(s['doc'])} Default ``{s['default']}``; accepts {s['range']}."
        wrapped = textwrap.wrap(entry, width=112, subsequent_indent=" " * 4)
        lines.extend(" " * indent + line for line in wrapped)
    return "\n".join(lines)


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

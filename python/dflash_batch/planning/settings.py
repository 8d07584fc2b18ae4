"""The planning settings of :class:`~dflash_batch.BucketSampler`, as the core's binding declares them once
(``dflash_batch._core.SETTINGS``: name, type, default, range, doc). The sampler's docstring and the settings
table of ``docs/usage.md`` (:mod:`dflash_batch.tools.docs`) are written from it; ``tests/planning/test_settings.py``
checks the sampler's signature, ``Config``'s and the stubs against it.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import dflash_batch._core as _core

#: The declaration: one dict per setting, in the order of the signature and of checkpoints.
SETTINGS: tuple[dict[str, str], ...] = tuple(_core.SETTINGS)


def names() -> tuple[str, ...]:
    return tuple(s["name"] for s in SETTINGS)


def default(name: str) -> Any:
    """The declared default of ``name`` as a value."""
    return _literal(next(s["default"] for s in SETTINGS if s["name"] == name))


def recorded(how: str) -> dict[str, Any]:
    """The settings checkpoints record ``how`` (``"unless default"``, ``"when set"``, ...), with their
    defaults."""
    return {s["name"]: default(s["name"]) for s in SETTINGS if s["recorded"] == how}


def _literal(text: str) -> Any:
    import ast

    return ast.literal_eval(text)


def plain(doc: str) -> str:
    """Markdown's backquotes as reStructuredText's double ones, for a docstring."""
    return re.sub(r"`([^`]+)`", r"``\1``", doc)


def docstring(indent: int = 8) -> str:
    """The ``Args`` entries of every setting, as a Google-style docstring block."""
    lines: list[str] = []
    for s in SETTINGS:
        entry = f"{s['name']}: {plain(s['doc'])} Default ``{s['default']}``; accepts {s['range']}."
        wrapped = textwrap.wrap(entry, width=112, subsequent_indent=" " * 4)
        lines.extend(" " * indent + line for line in wrapped)
    return "\n".join(lines)

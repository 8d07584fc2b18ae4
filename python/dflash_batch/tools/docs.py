"""What is written from the code's own declarations instead of by hand: from the settings' one
declaration (:data:`dflash_batch.planning.settings.SETTINGS`, the binding's ``_core.SETTINGS``) the
settings table of ``docs/usage.md``, the planning keywords of ``BucketSampler.__init__``, the stub of
``_core.Config.__init__`` and ``Config``'s text signature in ``rust/python/src/config.rs``, each between
its markers. So a new planning setting is written by hand in three files — its field and rule in the
core's ``Config``, its word in the core's fingerprint, its entry (with how it is read) in
``rust/python/src/settings.rs`` — then ``make build``, ``python -m dflash_batch.tools.docs`` writes the
rest, and ``make build`` again compiles ``Config``'s new text signature in. Shown on a scratch branch that
added a bool setting: those three files by hand (+21 lines), four blocks written (docs/usage.md,
sampler.py, _core.pyi, config.rs), the settings and stub tests green, checkpoints without the setting
still resumable. ``tests/planning/test_settings.py`` fails when any block drifts from the declaration.
"""

from __future__ import annotations

import argparse
import ast
import textwrap
from pathlib import Path

from ..planning.settings import SETTINGS, plain

START, END = "<!--settings-->", "<!--/settings-->"
#: The markers of a written block in source files: the lines between them are the block.
OPEN, CLOSE = "<settings>", "</settings>"
NOTE = "written from _core.SETTINGS: python -m dflash_batch.tools.docs"


def table() -> str:
    """The settings as the markdown table of ``docs/usage.md``."""
    rows = ["| setting | default | accepts | what it does | in a group |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        doc = s["doc"].replace("|", "\\|")
        rows.append(f"| `{s['name']}` | `{s['default']}` | {s['range']} | {doc} | {_held_by(s)} |")
    return "\n".join(rows)


def _held_by(setting: dict[str, str]) -> str:
    """Where the typed groups hold ``setting``, for the table."""
    group, field = setting["group"], setting["field"]
    held = {"batching": ["Padded", "Packed"], "padded": ["Padded"], "packed": ["Packed"]}.get(group)
    if held is not None:
        return ", ".join(f"`{name}({field}=)`" for name in held)
    if group == "mode":
        return "the type: `Padded` or `Packed`"
    return "—" if group == "own" else f"`{group.title()}({field}=)`"


def written(page: str) -> str:
    """``page`` with the table between its markers replaced by :func:`table`."""
    if START not in page or END not in page:
        raise ValueError(f"the page has no {START} ... {END} markers for the settings table")
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def _python(default: str) -> str:
    """A declared default as ruff formats it (strings in double quotes)."""
    value = ast.literal_eval(default)
    return f'"{value}"' if isinstance(value, str) else repr(value)


def keywords(indent: int = 8) -> list[str]:
    """The planning keywords of a Python signature, one a line: ``name: type = default,``."""
    return [f"{' ' * indent}{s['name']}: {s['type']} = {_python(s['default'])}," for s in SETTINGS]


def text_signature(indent: int = 4, width: int = 100) -> list[str]:
    """``Config``'s ``#[pyo3(...)]`` attribute with the declared keywords as its text signature,
    wrapped with Rust's string continuations."""
    text = "(*, " + ", ".join(f"{s['name']}={s['default']}" for s in SETTINGS) + ")"
    head = f'{" " * indent}#[pyo3(signature = (**kwargs), text_signature = "'
    lines = textwrap.wrap(
        text, width=width - 2, initial_indent=head, subsequent_indent=" " * (indent + 4), break_on_hyphens=False
    )
    return [line + " \\" for line in lines[:-1]] + [lines[-1] + '")]']


#: What each typed group is, above its fields' entries (the fields are the declaration's).
GROUPS = {
    "Padded": (
        "padded",
        'Rows padded to their batch\'s longest (``mode="padded"``): ``batch_size`` rows, or as many rows as '
        "``max_tokens`` holds.",
    ),
    "Packed": (
        "packed",
        'Samples packed end to end into rows of ``max_tokens`` tokens (``mode="packed"``), a batch being one '
        "row, for varlen attention.",
    ),
    "Balance": ("balance", "How an optimizer step's batches are matched across ranks."),
    "World": ("world", "The ranks a plan is split over."),
}


def _fields(group: str) -> list[dict[str, str]]:
    """The settings ``group`` holds, in declaration order (``Packed``'s required ``max_tokens`` first)."""
    held = {"padded": ("batching", "padded"), "packed": ("batching", "packed")}.get(group, (group,))
    chosen = [s for s in SETTINGS if s["group"] in held]
    return sorted(chosen, key=lambda s: not (group == "packed" and s["name"] == "max_tokens"))


def groups() -> list[str]:
    """The typed setting groups of ``planning/groups.py``: one frozen dataclass each, its fields the
    declared settings of the group, with their types, defaults and docs."""
    lines: list[str] = []
    for name, (group, what) in GROUPS.items():
        head = textwrap.wrap(f'"""{what}', width=108)
        lines += ["", "", "@dataclass(frozen=True)", f"class {name}:", *("    " + row for row in head), "", "    Args:"]
        body = []
        for s in _fields(group):
            entry = f"{s['field']}: {plain(s['doc'])} Default ``{s['default']}``; accepts {s['range']}."
            if group == "packed" and s["name"] == "max_tokens":
                entry = f"{s['field']}: the row capacity in tokens (required); accepts {s['range']}."
                body += [f"    {s['field']}: int", "    _: KW_ONLY"]
            else:
                kind = "int" if group == "packed" and s["name"] == "max_tokens" else s["type"]
                body.append(f"    {s['field']}: {kind} = {_python(s['default'])}")
            lines += ["        " + row for row in textwrap.wrap(entry, width=104, subsequent_indent="    ")]
        if group != "packed":
            body.insert(0, "    _: KW_ONLY")
        lines += ['    """', "", *body]
    return [*lines[2:], "", ""]  # the blank lines ruff keeps around classes


#: Each written block: the file, and its lines.
BLOCKS = {
    "python/dflash_batch/planning/groups.py": groups,
    "python/dflash_batch/planning/sampler.py": keywords,
    "python/dflash_batch/_core.pyi": keywords,
    "rust/python/src/config.rs": text_signature,
}


def rewritten(text: str, lines: list[str], where: str) -> str:
    """``text`` with the lines between its marker lines replaced by ``lines``."""
    rows = text.split("\n")
    opens = [k for k, row in enumerate(rows) if row.strip().endswith(f"{OPEN} {NOTE}")]
    closes = [k for k, row in enumerate(rows) if row.strip().endswith(CLOSE)]
    if len(opens) != 1 or len(closes) != 1 or closes[0] < opens[0]:
        raise ValueError(f"{where} must hold one '{OPEN} {NOTE}' line and one '{CLOSE}' line after it")
    return "\n".join(rows[: opens[0] + 1] + lines + rows[closes[0] :])


def write(root: Path) -> list[str]:
    """Writes every block and the docs table under ``root`` (a checkout); returns the files changed."""
    changed = []
    for name, lines in BLOCKS.items():
        path = root / name
        text = path.read_text()
        new = rewritten(text, lines(), name)
        if new != text:
            path.write_text(new)
            changed.append(name)
    page = root / "docs/usage.md"
    text = page.read_text()
    if written(text) != text:
        page.write_text(written(text))
        changed.append("docs/usage.md")
    return changed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: here)")
    changed = write(parser.parse_args(argv).root)
    print("written:", ", ".join(changed) if changed else "nothing changed")


if __name__ == "__main__":
    main()

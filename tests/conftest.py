"""Shared pytest setup. `make test` sets DFLASH_REQUIRE_TORCH=1 so a missing torch install fails loudly
instead of silently skipping the torch tests.

The tests sit in the package's wings (``tests/<wing>/``); the shared helpers (``tests/_*.py``) stay here,
importable from every wing because this directory is on ``sys.path`` (pytest puts a root conftest's
directory there). Lanes are chosen by markers (``pyproject.toml``): every test of ``tests/adapters/``
is marked ``clients`` here, the lane ``make test-clients-lowest`` runs on the lowest client releases."""

import os
from pathlib import Path

import pytest

ADAPTERS = Path(__file__).resolve().parent / "adapters"


def pytest_itemcollected(item: pytest.Item) -> None:
    if ADAPTERS in Path(item.fspath).resolve().parents:
        item.add_marker(pytest.mark.clients)


if os.environ.get("DFLASH_REQUIRE_TORCH") == "1":
    import torch  # noqa: F401

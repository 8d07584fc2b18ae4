"""Shared pytest setup. `make test` sets DFLASH_REQUIRE_TORCH=1 so a missing torch install fails loudly
instead of silently skipping the torch tests."""

import os

if os.environ.get("DFLASH_REQUIRE_TORCH") == "1":
    import torch  # noqa: F401

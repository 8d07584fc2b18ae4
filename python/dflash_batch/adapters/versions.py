"""The client releases each adapter supports, checked when the adapter is imported: a release outside the
range fails there, naming the range and the extra that installs it, instead of at the first training step
(transformers 4.57 built a ``BucketTrainer`` and then raised ``AttributeError: ... get_cp_size``).

The ranges are pyproject's extras (``tests/clients-lowest.txt`` tests the lowest of each); a client's own
``__version__`` is what it publishes about itself.
"""

from __future__ import annotations

import re
from typing import Any

#: ``name: (lowest, below, extra)``: releases ``lowest ≤ v < below`` are supported, installed by ``extra``.
SUPPORTED: dict[str, tuple[str, str, str]] = {
    "transformers": ("5.18", "6", "hf"),
    "accelerate": ("1.14", "2", "accelerate"),
    "trl": ("1.0", "2", "trl"),
    "lightning": ("2.5", "3", "lightning"),
    "torchdata": ("0.8", "0.12", "torch"),
}


def release(text: str) -> tuple[int, ...]:
    """The numeric release of a version string: ``"5.18.0.dev0"`` is ``(5, 18, 0)``."""
    parts = []
    for part in text.split("+")[0].split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.group() != part:
            break
    return tuple(parts)


def require(module: Any) -> None:
    """Raises ``ImportError`` naming the supported range and the extra when ``module`` (a client imported by
    an adapter) is a release outside :data:`SUPPORTED`."""
    name = module.__name__.split(".")[0]
    lowest, below, extra = SUPPORTED[name]
    found = str(getattr(module, "__version__", "0"))
    if release(lowest) <= release(found) < release(below):
        return
    raise ImportError(
        f"dflash_batch's {name} adapter supports {name}>={lowest},<{below}, but {name} {found} is installed; "
        f"install the supported releases with pip install 'dflash_batch[{extra}]' (or pip install "
        f"'{name}>={lowest},<{below}')"
    )

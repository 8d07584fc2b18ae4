"""Type stubs of the Rust extension module."""

from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

__version__: str

class PlanError(ValueError):
    """Invalid lengths or configuration for planning. The message names the value and the fix."""

class Plan:
    """One epoch's batches for all ranks in training order (CSR, read-only numpy arrays)."""

    @property
    def offsets(self) -> npt.NDArray[np.uint64]: ...
    @property
    def indices(self) -> npt.NDArray[np.uint32]: ...
    @property
    def world_size(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def steps(self) -> int: ...
    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> npt.NDArray[np.uint32]: ...
    def __iter__(self) -> Iterator[npt.NDArray[np.uint32]]: ...
    def stats(self) -> dict[str, int | float]: ...

class Planner:
    def __init__(
        self,
        chunks: Sequence[npt.NDArray[np.integer]],
        *,
        batch_size: int | None,
        max_tokens: int | None,
        boundaries: int | Sequence[int] | None,
        seed: int,
        shuffle: bool,
        world_size: int,
        drop_last: bool,
        skip_oversize: bool,
        pad_to_multiple_of: int,
        threads: int | None,
    ) -> None: ...
    def plan(self, epoch: int) -> Plan: ...
    @property
    def edges(self) -> list[int]: ...
    @property
    def fingerprint(self) -> str: ...
    def lengths(self) -> npt.NDArray[np.uint32]: ...
    def __len__(self) -> int: ...

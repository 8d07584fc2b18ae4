"""Type stubs of the Rust extension module."""

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

__version__: str

class PlanError(ValueError):
    """Invalid lengths or configuration for planning. The message names the value and the fix."""

class DataError(ValueError):
    """A dataset file that cannot be read as asked. The message names the file and the fix."""

def read_lengths(
    paths: Sequence[str], column: str, progress: Callable[[int], object] | None = None
) -> npt.NDArray[np.uint32]: ...

class TokenStore:
    """A token column kept memory-mapped; rows are read-only views into the files."""

    def __init__(
        self,
        paths: Sequence[str],
        column: str,
        rows: npt.NDArray[np.uint64] | None = None,
        progress: Callable[[int], object] | None = None,
    ) -> None: ...
    @property
    def dtype(self) -> str: ...
    def __len__(self) -> int: ...
    def lengths(self) -> npt.NDArray[np.uint32]: ...
    def __getitem__(self, index: int) -> npt.NDArray[np.integer]: ...
    def gather(self, indices: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.integer], npt.NDArray[np.int64]]: ...

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
    def stats(self) -> dict[str, int | float | None]: ...
    def churn(self, other: Plan) -> float | None: ...

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
        accumulation: int = 1,
        target_efficiency: float = 0.98,
        order: str = "stratified",
        cost: str | tuple[float, float] | None = None,
        balance_tolerance: float | None = None,
    ) -> None: ...
    def plan(self, epoch: int) -> Plan: ...
    def plan_resumed(self, epoch: int, old_world: int, step: int) -> tuple[Plan, npt.NDArray[np.uint32]]:
        """The rest of ``epoch`` after ``step`` steps on ``old_world`` ranks, planned on these ranks, and
        the rows carried into the next epoch (ascending; empty unless the rest cannot fill whole steps, in
        which case the plan has no batches). Raises PlanError for a step past that epoch's end."""
    def plan_carrying(self, epoch: int, carried: npt.NDArray[np.uint32]) -> Plan:
        """``epoch`` planned over every row plus ``carried`` (from ``plan_resumed`` of the epoch before).
        Raises IndexError for a row past the dataset."""
    @property
    def predicted_efficiency(self) -> float: ...
    @property
    def steps(self) -> int:
        """Steps per rank of every epoch: the same for all epochs of this configuration and data."""
    @property
    def edges(self) -> list[int]: ...
    @property
    def fingerprint(self) -> str: ...
    def lengths(self) -> npt.NDArray[np.uint32]: ...
    def __len__(self) -> int: ...

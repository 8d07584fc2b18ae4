"""Host blocks for CPU batches that stay valid as long as the trainer holds them, recycled only after.

Every CPU batch the :class:`~dflash_batch.Loader` hands out is a set of views of one block that nothing
else writes while any of those views lives. A fresh allocation per batch gave that, but cost half the
Loader's speed (0.52× the recycled ring on the seed workload, measured): a block of a 16K-token batch
is 512 KiB, which glibc serves with fresh pages, and touching them faulted ~128 pages a batch.

So blocks are pooled, and a block is reused only once no tensor refers to it. Each batch's tensors
are made with ``torch.from_numpy`` on the pooled numpy array, and torch's storage holds a reference
to that array for as long as any view of it lives (slices, ``unbind``, ``.numpy()`` of a view all
keep the storage). CPython frees a storage the moment its last tensor goes, so the array's reference
count says exactly whether a batch is still held: the pool's own reference plus the caller's means
free. Nothing is reused while the trainer, a queue or a closure still holds a batch.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

# References of a free block seen from `_is_free`: the pool's list and getrefcount's argument.
_FREE = 2


class BlockPool:
    """Blocks of ``elements`` numbers of one dtype, handed out when free; grows while batches are held.

    Args:
        dtype: the numpy dtype of the blocks.
        keep: free blocks kept for later batches; more are released.
    """

    def __init__(self, dtype: Any, keep: int) -> None:
        self.dtype, self.keep = np.dtype(dtype), keep
        self._blocks: list[np.ndarray] = []

    def take(self, elements: int) -> np.ndarray:
        """A block of at least ``elements`` numbers that no tensor refers to (a new one if none is)."""
        blocks = self._blocks
        # The most recently used free block first: its pages are the likeliest to be in cache. No
        # name may hold a block during a check (it would count as a reference).
        for i in range(len(blocks) - 1, -1, -1):
            if _is_free(blocks, i) and blocks[i].size >= elements:
                blocks.append(blocks.pop(i))
                return blocks[-1]
        self._release_spare(elements)
        self._blocks.append(np.empty(max(elements, 1), dtype=self.dtype))
        return self._blocks[-1]

    def _release_spare(self, elements: int) -> None:
        """Drops free blocks too small for ``elements`` and free blocks beyond ``keep``."""
        free = [i for i in range(len(self._blocks)) if _is_free(self._blocks, i)]
        small = {i for i in free if self._blocks[i].size < elements}
        drop = small | set([i for i in free if i not in small][self.keep :])
        self._blocks[:] = [block for i, block in enumerate(self._blocks) if i not in drop]

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def nbytes(self) -> int:
        """Bytes of every block, free or held."""
        return sum(block.nbytes for block in self._blocks)


def _is_free(blocks: list[np.ndarray], i: int) -> bool:
    # `blocks[i]` as an argument adds one reference while getrefcount runs.
    return sys.getrefcount(blocks[i]) <= _FREE

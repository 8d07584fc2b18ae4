"""Host blocks for CPU batches that stay valid as long as the trainer holds them, recycled only after.

Every CPU batch the :class:`~dflash_batch.Loader` hands out is a set of views of one block that nothing
else writes while any of those views lives. A fresh allocation per batch gave that, but cost half the
Loader's speed (0.52× the recycled ring on the seed workload, measured): a block of a 16K-token batch
is 512 KiB, which glibc serves with fresh pages, and touching them faulted ~128 pages a batch.

So blocks are pooled, and a block is reused only once nothing refers to it. A block is a numpy array
(collation writes it) and one torch tensor over the same memory, made once; a batch is views of that
tensor. Three counts say whether a block is held, each compared with its value when the block was new:

- the uses of the tensor's storage: every torch view of it (slices, ``unbind``, ``.numpy()`` of a
  view, a DLPack capsule) adds one while it lives;
- the references of that storage's Python object: code holding ``t.untyped_storage()`` of a view;
- the references of the numpy array: a batch the Loader is still collating or queueing.

CPython frees a view the moment its last reference goes, so the counts are exact, not a guess. Making
a new tensor per batch (``torch.from_numpy``) instead cost 0.79× the ring (measured): a block is reused
once it is free, the oldest first, and in a loop that drops each batch the oldest is free at the first
look. A block whose storage was moved (``share_memory_()`` swaps a storage's memory in place) is
dropped, never reused. Should a torch build not count uses as checked at import, every batch gets a
tensor of its own over the block instead, whose storage holds the numpy array: its reference count
alone is then exact.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

_refs = sys.getrefcount


def _storage_uses() -> Any:
    """``torch._C._storage_Use_Count`` where it counts views as this module relies on, else None."""
    uses = getattr(torch._C, "_storage_Use_Count", None)
    if uses is None:
        return None
    try:
        tensor = torch.from_numpy(np.zeros(8, dtype=np.int64))
        storage = tensor.untyped_storage()
        pointer, base = storage._cdata, uses(storage._cdata)
        view = tensor.as_strided((2, 2), (4, 1)).unbind(0)[1][1:]
        array = view.numpy()
        held = uses(pointer)
        del view
        still = uses(pointer)
        del array
        ok = held > base and still > base and uses(pointer) == base
    except Exception:  # an API that changed shape: fall back to a tensor per batch
        return None
    return uses if ok else None


_USES = _storage_uses()


class _Block:
    """One block: its numpy array, its tensor (None without use counts) and their counts when free."""

    __slots__ = ("address", "array", "array_refs", "counted", "pointer", "storage", "storage_refs", "tensor", "uses")

    def __init__(self, elements: int, dtype: np.dtype, counted: bool) -> None:
        self.array = np.empty(max(elements, 1), dtype=dtype)
        self.counted, self.tensor, self.storage = counted, None, None
        if counted:
            self.tensor = torch.from_numpy(self.array)
            self.storage = self.tensor.untyped_storage()
            self.pointer, self.address = self.storage._cdata, self.tensor.data_ptr()
            self.uses, self.storage_refs = _USES(self.pointer), _refs(self.storage)
        self.array_refs = _refs(self.array)

    def free(self) -> bool:
        if _refs(self.array) > self.array_refs:
            return False
        return not self.counted or (_USES(self.pointer) <= self.uses and _refs(self.storage) <= self.storage_refs)

    def handout(self) -> tuple[torch.Tensor, np.ndarray]:
        """The block's tensor (without use counts, a new one over it) and its array."""
        tensor = self.tensor if self.tensor is not None else torch.from_numpy(self.array)
        return tensor, self.array

    def moved(self) -> bool:
        return self.tensor is not None and self.tensor.data_ptr() != self.address


class BlockPool:
    """Blocks of one dtype, handed out when free; grows while batches are held.

    Args:
        dtype: the numpy dtype of the blocks.
        keep: free blocks kept for later batches; more are released.
        counted: reuse one tensor per block (needs torch's storage use counts); False gives every batch
            a tensor of its own over the block.
    """

    def __init__(self, dtype: Any, keep: int, counted: bool | None = None) -> None:
        self.dtype, self.keep = np.dtype(dtype), keep
        self.counted = _USES is not None if counted is None else counted and _USES is not None
        self._blocks: list[_Block] = []

    def take(self, elements: int) -> tuple[torch.Tensor, np.ndarray]:
        """``(tensor, array)`` over one free block of at least ``elements`` numbers (a new one if none is)."""
        blocks = self._blocks
        for i, block in enumerate(blocks):  # the oldest first: in steady state it is free
            if block.array.size >= elements and block.free():
                del blocks[i]
                if block.moved():  # its storage now lives elsewhere (shared memory): no longer ours
                    break
                blocks.append(block)
                return block.handout()
        self._release_spare(elements)
        block = _Block(elements, self.dtype, self.counted)
        blocks.append(block)
        return block.handout()

    def _release_spare(self, elements: int) -> None:
        """Drops free blocks too small for ``elements``, moved ones and free blocks beyond ``keep``."""
        free = [b for b in self._blocks if b.free()]
        small = [b for b in free if b.array.size < elements or b.moved()]
        drop = {id(b) for b in small} | {id(b) for b in [b for b in free if b not in small][self.keep :]}
        self._blocks[:] = [b for b in self._blocks if id(b) not in drop]

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def nbytes(self) -> int:
        """Bytes of every block, free or held."""
        return sum(block.array.nbytes for block in self._blocks)

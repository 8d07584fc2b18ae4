"""Datasets importable by spawned DataLoader workers (they must live in a module, not a test)."""

from __future__ import annotations

import torch


class IndexDataset(torch.utils.data.Dataset):
    """Returns each sample's index as a tensor; optionally carries a sampler so that spawn pickles it."""

    def __init__(self, n: int, sampler=None) -> None:
        self.n = n
        self.sampler = sampler

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return torch.tensor(int(i))

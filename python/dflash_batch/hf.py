"""Hugging Face ``transformers.Trainer`` with batches from a :class:`BucketSampler`.

    from dflash_batch.hf import BucketTrainer
    trainer = BucketTrainer(model=model, args=args, train_dataset=dataset, sampler=sampler, store=store)
    trainer.train()

The Trainer's own sampler and padding collator are bypassed: training batches are the sampler's plan,
collated in Rust by a :class:`Loader` (padded, or packed rows for a ``mode="packed"`` sampler). The
Trainer calls ``set_epoch`` on it every epoch and ``len()`` for its step count; the Trainer moves each batch
to its device. Importing this module imports ``transformers``; ``dflash_batch`` itself never does.
"""

from __future__ import annotations

from typing import Any

from transformers import Trainer

from .loader import Loader
from .reading import TokenStore
from .sampler import BucketSampler


class BucketTrainer(Trainer):
    """A ``transformers.Trainer`` whose training batches come from ``sampler`` over ``store``.

    Args:
        sampler: the :class:`BucketSampler` (built with this process's rank, e.g. under ``torchrun``).
        store: the :class:`TokenStore` holding the token column of ``train_dataset``.
        loader_kwargs: passed to :class:`Loader` (``pad_id``, ``prefetch``, ``dtype``, ...).
        *args, **kwargs: as for ``Trainer``.
    """

    def __init__(
        self,
        *args: Any,
        sampler: BucketSampler,
        store: TokenStore,
        loader_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(sampler, BucketSampler):
            raise TypeError(f"sampler must be a dflash_batch.BucketSampler, got {type(sampler).__name__}")
        if not isinstance(store, TokenStore):
            raise TypeError(f"store must be a dflash_batch.TokenStore, got {type(store).__name__}")
        super().__init__(*args, **kwargs)
        self.bucket_sampler, self.token_store = sampler, store
        self._loader_kwargs = dict(loader_kwargs or {})

    def get_train_dataloader(self) -> Loader:
        """The :class:`Loader` over the sampler's plan (the Trainer sets its epoch and moves batches)."""
        return Loader(self.token_store, self.bucket_sampler, **self._loader_kwargs)

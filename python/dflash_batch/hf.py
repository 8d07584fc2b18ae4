"""The Hugging Face Trainer and TRL adapter at its documented import path: see :mod:`dflash_batch.adapters.hf`.

    from dflash_batch.hf import BucketTrainer, packed_inputs

Importing this module imports ``transformers``; ``dflash_batch`` itself never does.
"""

from __future__ import annotations

from .adapters.hf import BucketTrainer, packed_inputs
from .adapters.hf_checkpoints import LEGACY_STATE_FILE, STATE_FILE, saved_state

__all__ = ["LEGACY_STATE_FILE", "STATE_FILE", "BucketTrainer", "packed_inputs", "saved_state"]

"""dflash_batch: length-bucketed batch planning for LLM training.

Near-sorted padding efficiency with shuffle-grade mixing of lengths; every epoch planned in Rust in
milliseconds, reproducible from ``(seed, epoch)``, with equal step counts on every rank.

    >>> import dflash_batch as db
    >>> sampler = db.BucketSampler(db.seed_workload(10_000), max_tokens=16384, seed=0)
    >>> plan = sampler.plan(0)
    >>> plan.stats()["efficiency"] > 0.9
    True
"""

from ._core import DataError, Error, Plan, PlanError, __version__
from .adapters import clients as _clients  # noqa: F401  (registers what clients publish: base/clients.py)
from .data.measured import measure_lengths
from .data.mixture import Mixture
from .data.reading import TokenStore, read_documents, read_lengths
from .data.workload import SEED_SAMPLES, seed_mixture, seed_workload
from .loading.checked import checked
from .loading.collate import Collator, collate, collate_packed
from .loading.context_parallel import context_parallel_shard, shard_index
from .loading.loader import Loader
from .planning.groups import Balance, Packed, Padded, World
from .planning.sampler import BucketSampler
from .planning.step_split import StepSplit, split_step
from .planning.windows import Windows
from .pricing.calibration import Calibration, StepTimer
from .pricing.cost import CostFit, measure_cost
from .pricing.per_source import SourceLosses

__all__ = [
    "SEED_SAMPLES",
    "Balance",
    "BucketSampler",
    "Calibration",
    "Collator",
    "CostFit",
    "DataError",
    "Error",
    "Loader",
    "Mixture",
    "Packed",
    "Padded",
    "Plan",
    "PlanError",
    "SourceLosses",
    "StepSplit",
    "StepTimer",
    "TokenStore",
    "Windows",
    "World",
    "__version__",
    "checked",
    "collate",
    "collate_packed",
    "context_parallel_shard",
    "measure_cost",
    "measure_lengths",
    "read_documents",
    "read_lengths",
    "seed_mixture",
    "seed_workload",
    "shard_index",
    "split_step",
]

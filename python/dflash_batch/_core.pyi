"""Type stubs of the Rust extension module: every native function and class, with what it returns and
raises (``tests/package/test_stubs.py`` checks them against the module). The public API wraps these; call them
directly only to build something the wrappers do not."""

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__version__: str
#: The revision of the planning rules (checkpoints record it; see rust/core/src/plan/revision.rs).
PLAN_REVISION: int

class Error(ValueError):
    """The base of dflash_batch's own errors: ``kind`` names what went wrong (snake case, stable; every
    bad setting is ``invalid_setting``), ``reason`` the finer kind (``invalid_cost``, ``too_few_edges``,
    ...; else the kind), and ``row``, ``setting`` and ``path`` are set where the error knows them (else
    None). ``ERROR_KINDS`` lists every kind."""

    kind: str
    reason: str
    row: int | None
    setting: str | None
    path: str | None

class PlanError(Error):
    """Invalid lengths or configuration for planning. The message names the value and the fix."""

class DataError(Error):
    """A dataset file that cannot be read as asked. The message names the file and the fix."""

def read_lengths(
    paths: Sequence[str],
    column: str,
    rows: npt.NDArray[np.uint64] | None = None,
    progress: Callable[[int], object] | None = None,
) -> npt.NDArray[np.uint32]:
    """The length of every row of ``paths`` (Arrow IPC files, in order) from ``column``: an integer
    column, or a list column whose offsets give the lengths; a read-only array owned by Rust. With
    ``rows`` (a ``datasets`` indices mapping), the lengths of those rows in that order. ``progress`` is
    called with the files read so far. Raises DataError for a file or column that cannot be read so,
    OSError for a file that cannot be opened, IndexError for a mapped row past the files' rows,
    MemoryError when the lengths do not fit."""

def read_documents(paths: Sequence[str]) -> npt.NDArray[np.uint64]:
    """The document boundaries of the Megatron pairs ``paths`` (each named by its ``.idx`` or ``.bin``),
    in one row space: sequence numbers rising from 0 to the sequence count. Raises OSError subclasses
    and DataError as ``read_lengths``; DataError for a file that is not a Megatron pair."""

def read_table_lengths(
    table: object, column: str, rows: npt.NDArray[np.uint64] | None = None
) -> npt.NDArray[np.uint32]:
    """``read_lengths`` for a table in memory: any object with ``__arrow_c_stream__`` (a pyarrow
    ``Table``), read without a copy through the Arrow C stream interface. Raises TypeError for an
    object without that interface, DataError and IndexError as ``read_lengths``."""

class TokenStore:
    """A token column kept memory-mapped (or shared with a table in memory); rows are read-only views."""

    def __init__(
        self,
        paths: Sequence[str],
        column: str,
        rows: npt.NDArray[np.uint64] | None = None,
        progress: Callable[[int], object] | None = None,
        mask: bool = False,
    ) -> None:
        """Maps ``column`` (a list of token ids of any integer width, or whole floats) of ``paths`` (Arrow
        files or Megatron pairs by their ``.idx``); with ``rows`` (a ``datasets``
        indices mapping), row ``i`` of the store is file row ``rows[i]``. ``mask=True``: a loss-mask
        column (integers, or bools read as 0/1 bytes; floats refused). Raises DataError, OSError
        and IndexError as ``read_lengths``."""
    @staticmethod
    def from_table(
        table: object, column: str, rows: npt.NDArray[np.uint64] | None = None, mask: bool = False
    ) -> TokenStore:
        """The store over ``column`` of a table in memory (as ``read_table_lengths`` takes it), sharing
        its buffers; the column is validated first (``mask``: as for the constructor). Raises TypeError,
        DataError, IndexError as ``read_table_lengths``."""
    @staticmethod
    def from_rows(tokens: npt.NDArray[np.integer], offsets: npt.NDArray[np.int64]) -> TokenStore:
        """The store over rows given flat: ``tokens`` (any token dtype, copied) and the ``rows + 1``
        ``offsets`` delimiting them. Raises TypeError for another dtype, DataError for offsets that do
        not rise from 0 to ``len(tokens)`` or for no rows."""
    @property
    def dtype(self) -> str:
        """The numpy dtype name of the tokens: an integer width (``int8`` … ``int64``, ``uint8`` …
        ``uint32``), or Megatron's ``float32``/``float64``."""
    def __len__(self) -> int: ...
    @staticmethod
    def concat(names: Sequence[str], parts: Sequence[TokenStore]) -> TokenStore:
        """The stores ``parts`` as one (rows of the first, then the second, ...), sharing their mapped
        files; each named in ``names`` for messages. Raises DataError of kind ``sources_differ`` naming the
        first part whose token type or loss mask differs from the first's."""
    def with_mask(self, mask: TokenStore, kind: str) -> TokenStore:
        """This store with ``mask`` (same rows) as its loss mask: ``kind`` is ``"labels"`` or ``"binary"``."""
    def label_counts(
        self,
        indices: npt.NDArray[np.uint64],
        starts: npt.NDArray[np.uint32] | None = None,
        lengths: npt.NDArray[np.uint32] | None = None,
    ) -> npt.NDArray[np.uint32]:
        """Label tokens of each entry (its window), less its first token; only masked-in ones with a mask."""
    def lengths(self) -> npt.NDArray[np.uint32]:
        """Tokens per row, as a new read-only array."""
    def __getitem__(self, key: int) -> npt.NDArray[np.integer]:
        """Row ``key``'s tokens, a read-only view into the mapped file (negative counts from the end).
        Raises IndexError past the rows, TypeError for a non-integer."""
    def gather(self, indices: npt.NDArray[np.integer]) -> tuple[npt.NDArray[np.integer], npt.NDArray[np.int64]]:
        """The tokens of ``indices`` concatenated, and the ``len(indices) + 1`` offsets delimiting each
        row; both new arrays owned by the caller. Raises IndexError for a row past the store, TypeError
        for an array that is not integers."""

class Plan:
    """One epoch's batches for all ranks in training order (CSR, read-only numpy arrays). Batch ``i`` is
    ``indices[offsets[i]:offsets[i+1]]``; step ``s`` on rank ``r`` is batch ``s * world_size + r``."""

    @property
    def offsets(self) -> npt.NDArray[np.uint32]: ...
    @property
    def indices(self) -> npt.NDArray[np.uint32]: ...
    @property
    def world_size(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def steps(self) -> int:
        """Steps per rank: ``len(self) // world_size``."""
    def __len__(self) -> int:
        """Batches, all ranks together."""
    def __getitem__(self, key: int) -> npt.NDArray[np.uint32]:
        """Batch ``key`` (negative counts from the end), a read-only view. Raises IndexError past the
        batches, TypeError for a non-integer."""
    def stats(self) -> dict[str, int | float | None]:
        """Figures of the plan: batches, steps, samples, real and padded tokens, efficiency, skipped,
        dropped and split batches, buckets, rows per batch, its mixing (window_tv) and rank balance
        (rank_imbalance_p50/p99/max, and sync_efficiency / sync_efficiency_step: the share of GPU time
        that does work when ranks wait for the slowest every micro-batch / every optimizer step), and
        end_to_end_efficiency / end_to_end_efficiency_step: the share that trains real tokens (useful
        work over what the ranks spend, padding and waiting included), predicted under rank_price: the
        (a, b) the ranks were balanced by. Packed rows whose samples are padded to a multiple add
        piece_padding_tokens; with context_parallel also context_parallel, cp_spread_zigzag and
        cp_spread_contiguous (docs/context_parallel.md)."""
    def largest_padded(self, start: int, rank: int, pad_to_multiple_of: int) -> int:
        """Elements of the largest padded batch ``rank`` runs from step ``start`` on: rows × longest
        length rounded up to ``pad_to_multiple_of``; 1 when it runs none. Raises ValueError for a rank
        past ``world_size``."""
    def churn(self, other: Plan) -> float | None:
        """Share of sample pairs batched together here that are batched together again in ``other``;
        None when no batch holds two samples. Raises ValueError for plans of different datasets."""

#: Every planning setting, declared once (``rust/python/src/settings.rs``): dicts of ``name``, ``type``,
#: ``default`` (Python source), ``range`` and ``doc``, in the order of the signature and of checkpoints.
SETTINGS: tuple[dict[str, str], ...]
#: Every error kind, declared once (``rust/core/src/error/fields.rs``): dicts of ``name``, ``exception``
#: (the class raised) and ``invalid_setting`` (whether it is raised as a bad setting).
ERROR_KINDS: tuple[dict[str, object], ...]

class Config:
    """A sampler's planning settings, each checked once (types here, ranges and the rules between
    settings when a ``Planner`` is built from it). Frozen; pickles as its keyword arguments. Bad
    settings raise PlanError (kind ``invalid_setting``, ``setting`` naming it) or TypeError."""

    def __init__(
        self,
        *,
        # <settings> written from _core.SETTINGS: python -m dflash_batch.tools.docs
        batch_size: int | None = None,
        max_tokens: int | None = None,
        boundaries: str | int | Sequence[int] = "auto",
        seed: int = 0,
        shuffle: bool = True,
        world_size: int | None = None,
        drop_last: bool = False,
        oversize: str = "error",
        pad_to_multiple_of: int = 1,
        threads: int | None = None,
        accumulation: int | None = None,
        target_efficiency: float | None = None,
        order: str = "stratified",
        cost: str | tuple[float, float] = "tokens",
        balance_tolerance: float | None = None,
        mode: str = "padded",
        bucketed: bool = False,
        trim_steps: bool = False,
        context_parallel: int = 1,
        rank_cost: tuple[float, float] | None = None,
        whole_steps: bool = False,
        max_docs_per_row: int | None = None,
        # </settings>
    ) -> None:
        """Checks each setting's type (and the ranges a Python value can exceed). Raises TypeError for a
        wrong type or an unknown keyword, PlanError (kind ``invalid_setting``) for a value out of range."""
    def settings(self) -> dict[str, Any]:
        """The settings that shape a plan as plain values (what checkpoints record): every keyword
        argument but ``threads``, ``oversize`` as ``skip_oversize`` and ``truncate``."""
    def replace(self, **changes: Any) -> Config:
        """This configuration with some keyword arguments changed (checked again)."""
    def get(self, name: str) -> Any:
        """Keyword argument ``name`` as checked. Raises PlanError for a name that is not a setting."""
    @property
    def world_size(self) -> int: ...
    @property
    def accumulation(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def max_tokens(self) -> int | None:
        """The token budget per batch, or None with ``batch_size``."""
    @property
    def mode(self) -> str:
        """``"padded"`` or ``"packed"``."""
    @property
    def context_parallel(self) -> int:
        """Ranks each packed row is split over (1: none)."""
    @property
    def piece_multiple(self) -> int:
        """What every sample of a packed row is padded to a multiple of (1: none, and for padded batches)."""
    @property
    def oversize(self) -> str:
        """``"error"``, ``"skip"`` or ``"truncate"``."""
    @property
    def price(self) -> tuple[float, float]:
        """``(a, b)``: a row of padded length L costs a·L + b·L² (``(1, 0)``: tokens)."""
    @property
    def balance_price(self) -> tuple[float, float]:
        """The price ranks are balanced by: ``rank_cost`` when set, else ``price``."""

class Mixture:
    """A mixture's sources (names, rows, weights) and settings, checked by the core."""

    def __init__(
        self,
        names: Sequence[str],
        rows: Sequence[int],
        weights: Sequence[float],
        unit: str = "tokens",
        max_repeat: float = 4.0,
        epoch_size: int | None = None,
        schedule: Sequence[tuple[int, Sequence[float]]] | None = None,
        interpolation: str = "constant",
    ) -> None:
        """One entry of ``names``, ``rows`` and ``weights`` per source, in order; ``schedule``: ``(epoch,
        weights)`` points from which the weights change (``interpolation`` ``"constant"`` or ``"linear"``).
        Raises PlanError of kind ``invalid_setting`` for weights that do not sum to 1 or are negative or not
        finite, no sources, a repeated name, ``max_repeat`` < 1, ``epoch_size`` 0, an unknown ``unit`` or
        ``interpolation``, or a bad schedule point (setting ``schedule``); of kind ``empty_source`` for a
        source without rows; ValueError for lists of different lengths."""
    @property
    def names(self) -> list[str]:
        """The sources' names."""
    @property
    def rows(self) -> list[int]:
        """Rows of each source."""
    @property
    def weights(self) -> list[float]:
        """Each source's weight."""
    @property
    def unit(self) -> str:
        """``"tokens"`` or ``"samples"``."""
    @property
    def max_repeat(self) -> float:
        """The most times a source's rows are trained per epoch."""
    @property
    def epoch_size(self) -> int | None:
        """Samples or tokens of every epoch (``None``: the sources' total)."""
    @property
    def schedule(self) -> list[tuple[int, list[float]]] | None:
        """The schedule's ``(epoch, weights)`` points, or ``None`` for fixed weights."""
    @property
    def interpolation(self) -> str:
        """``"constant"`` or ``"linear"``."""
    def weights_at(self, epoch: int) -> list[float]:
        """Every source's weight in ``epoch``."""
    def settings(self) -> dict[str, object]:
        """``weights`` (by name), ``rows``, ``unit``, ``max_repeat``, ``epoch_size`` as plain values, and
        ``schedule`` (``interpolation`` and ``points`` as ``[epoch, {name: weight}]``) when given."""

class Planner:
    """Validated lengths and configuration, from which any epoch's plan is computed."""

    def __init__(
        self, chunks: Sequence[npt.NDArray[np.integer]], config: Config, mixture: Mixture | None = None
    ) -> None:
        """Copies the lengths (``chunks`` of any integer dtype, concatenated; with
        ``oversize="truncate"``, cut into pieces) and prepares the buckets; with ``mixture``, the lengths
        are its sources' concatenated, each epoch selecting their shares. Raises PlanError for invalid
        lengths or settings (kind ``source_too_small`` for a source its weight asks too much of),
        TypeError for a wrong type, MemoryError when the lengths do not fit."""
    def plan(self, epoch: int) -> Plan:
        """Plans ``epoch`` (GIL released). Raises PlanError when the samples cannot give every rank a
        batch, MemoryError when planning cannot reserve its working memory."""
    def plan_shared(self, dir: str | os.PathLike[str], epoch: int) -> Plan:
        """Plans ``epoch`` once per machine through files in ``dir``: the first process to ask plans and
        publishes it, the others map it read-only after checking it (GIL released). Raises DataError
        (kind ``shared_plan``) for a file there that is not this plan, OSError when ``dir`` cannot be
        used."""
    def plan_resumed(self, epoch: int, old_world: int, step: int) -> tuple[Plan, npt.NDArray[np.uint32]]:
        """The rest of ``epoch`` after ``step`` steps on ``old_world`` ranks, planned on these ranks, and
        the rows carried into the next epoch (ascending; empty unless the rest cannot fill whole steps, in
        which case the plan has no batches). Raises PlanError for a step past that epoch's end."""
    def plan_carrying(self, epoch: int, carried: npt.NDArray[np.uint32]) -> Plan:
        """``epoch`` planned over every row plus ``carried`` (from ``plan_resumed`` of the epoch before).
        Raises IndexError for a row past the dataset."""
    @property
    def predicted_efficiency(self) -> float:
        """The padding efficiency plans are predicted to measure with the chosen edges."""
    @property
    def steps(self) -> int:
        """Steps per rank of every epoch: the same for all epochs of this configuration and data."""
    @property
    def edges(self) -> list[int]:
        """The bucket edges in use."""
    @property
    def fingerprint(self) -> str:
        """16 hex digits identifying the lengths and configuration."""
    @property
    def fingerprint_any_ranks(self) -> str:
        """As ``fingerprint``, but equal for any ``world_size`` (for resuming on another number of
        ranks)."""
    def fingerprint_on(self, world_size: int) -> str:
        """The fingerprint these lengths and settings have on ``world_size`` ranks: what a checkpoint
        taken there recorded."""
    def check_lengths(self) -> None:
        """Raises ``DataError`` naming the file of borrowed lengths truncated or rewritten since."""
    @property
    def lengths_borrowed(self) -> bool:
        """Whether the lengths are the caller's read-only ``numpy.memmap``, borrowed, not a copy."""
    def lengths(self) -> npt.NDArray[np.uint32]:
        """The planned entries' lengths, as a new array (with pieces: every row's first, then the later)."""
    def dataset_lengths(self) -> npt.NDArray[np.uint32]:
        """The dataset rows' lengths, as a new array: what the planner was built from."""
    def plans_changed_since(self, revision: int, world_size: int) -> bool:
        """Whether this configuration's plans on ``world_size`` ranks differ between planning rules
        ``revision`` and ``PLAN_REVISION`` (a checkpoint written under ``revision`` cannot resume). Raises
        OverflowError for a negative or too large number."""
    @property
    def num_samples(self) -> int:
        """Rows of the dataset (entries less the later pieces of split samples)."""
    @property
    def truncated(self) -> int:
        """Samples split into pieces (``oversize="truncate"``; else 0)."""
    def locate(
        self, entries: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
        """The token windows ``(rows, starts, lengths)`` of plan ``entries``. Raises PlanError for an entry
        that is not one of the plans'."""
    def __len__(self) -> int:
        """Planned entries (samples, plus the later pieces of split ones)."""

def physical_memory() -> int | None:
    """Bytes of physical memory (Linux ``MemTotal``), None where the system does not say. Raises nothing."""

def collate_into(
    store: TokenStore,
    indices: npt.NDArray[np.integer],
    input_ids: npt.NDArray[np.integer],
    attention_mask: npt.NDArray[np.integer],
    labels: npt.NDArray[np.integer],
    position_ids: npt.NDArray[np.integer],
    pad_id: int,
    label_pad_id: int,
    pad_to_multiple_of: int,
) -> tuple[int, int]:
    """Writes the padded batch ``indices`` into the four buffers (contiguous, writeable, one dtype,
    int64 or int32, each at least rows × L elements); returns ``(rows, L)``. Raises ValueError for a
    buffer too small or of another dtype, IndexError for a row past the store."""

def collate_slot(
    store: TokenStore,
    indices: npt.NDArray[np.integer],
    slot: npt.NDArray[np.integer],
    pad_id: int,
    label_pad_id: int,
    pad_to_multiple_of: int,
) -> tuple[int, int]:
    """``collate_into`` into one C-contiguous 1-D array: for ``n = rows × L``, elements ``[0, n)``,
    ``[n, 2n)``, ``[2n, 3n)``, ``[3n, 4n)`` are input_ids, attention_mask, labels, position_ids.
    Raises as ``collate_into``."""

def collate_new(
    store: TokenStore,
    indices: npt.NDArray[np.integer],
    pad_id: int,
    label_pad_id: int,
    pad_to_multiple_of: int,
    dtype: str,
) -> tuple[
    npt.NDArray[np.integer], npt.NDArray[np.integer], npt.NDArray[np.integer], npt.NDArray[np.integer], tuple[int, int]
]:
    """The padded batch ``indices`` in four new 1-D arrays of ``dtype`` ("int64" or "int32") owned by
    Rust, and ``rows``, ``L``: reshape each to ``[rows, L]``. Raises ValueError for another dtype,
    IndexError for a row past the store."""

def collate_packed_slot(
    store: TokenStore,
    indices: npt.NDArray[np.integer],
    slot: npt.NDArray[np.integer],
    cu_seqlens: npt.NDArray[np.int32],
    pad_id: int,
    label_pad_id: int,
    starts: npt.NDArray[np.uint32] | None = None,
    lengths: npt.NDArray[np.uint32] | None = None,
    piece_multiple: int = 1,
) -> tuple[int, int, int]:
    """Writes the packed batch ``indices`` into ``slot`` (C-contiguous ``[4, capacity]``, int64 or int32:
    input_ids, labels, position_ids, seq_idx) and its ``cu_seqlens``; returns ``(samples, real tokens,
    max_seqlen)``. ``starts``/``lengths`` make entry ``s`` the window ``starts[s] .. starts[s] +
    lengths[s]`` of its sample. ``piece_multiple`` > 1 pads every entry to a multiple of it (context
    parallelism; ``cu_seqlens`` then sums the real lengths). Raises ValueError for a row longer than the slot or a
    buffer too small, IndexError for a row past the store."""

def window_tv(
    offsets: npt.NDArray[np.uint32], indices: npt.NDArray[np.uint32], lengths: npt.NDArray[np.uint32], window: int
) -> float | None:
    """Mean total-variation distance of windows of ``window`` consecutive batches from the whole's token
    deciles; None without a complete window. Raises ValueError for inconsistent arrays."""

def mixing(
    offsets: npt.NDArray[np.uint32], indices: npt.NDArray[np.uint32], lengths: npt.NDArray[np.uint32], window: int
) -> dict[str, float] | None:
    """``window_tv``, ``window_tv_tail``, ``length_gap`` and ``length_gap_tail`` of windows of ``window``
    batches, as ``Plan.stats()`` computes them; None without a complete window. Raises ValueError for
    inconsistent arrays."""

def rank_imbalance(
    offsets: npt.NDArray[np.uint32],
    indices: npt.NDArray[np.uint32],
    lengths: npt.NDArray[np.uint32],
    world_size: int,
    pad_to_multiple_of: int,
) -> tuple[float, float, float] | None:
    """``(p50, p99, max)`` over steps of max/min padded tokens among each step's ``world_size`` batches;
    None without a step. Raises ValueError for inconsistent arrays."""

def churn(
    a_offsets: npt.NDArray[np.uint32],
    a_indices: npt.NDArray[np.uint32],
    b_offsets: npt.NDArray[np.uint32],
    b_indices: npt.NDArray[np.uint32],
    samples: int,
) -> float | None:
    """Share of sample pairs batched together in ``a`` that are batched together again in ``b``; None
    when no batch of ``a`` holds two samples. Raises ValueError for inconsistent arrays."""

SEED_SOURCES: list[str]

def seed_sources(n: int, seed: int) -> tuple[npt.NDArray[np.uint32], tuple[int, int, int, int]]:
    """``n`` seed-workload lengths split into the four sources of ``SEED_SOURCES`` (different length
    profiles, 40/30/20/10 of the samples): the lengths grouped by source, and each source's count. Raises
    OverflowError for a negative ``n`` or ``seed`` (``dflash_batch.seed_mixture`` checks them first),
    MemoryError when they cannot be allocated."""

def split_step(
    lengths: Any,
    *,
    world_size: int,
    max_tokens: int,
    mode: str = "padded",
    cost: str | tuple[float, float] | None = None,
    seed: int | None = None,
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32], int, list[float]]:
    """One step's sequences split into every rank's micro-batches (``dflash_batch.split_step``):
    ``(offsets, indices, micro_batches, loads)``, micro-step ``j`` of rank ``r`` being batch
    ``j * world_size + r``. Raises PlanError for bad lengths or settings, TypeError for a wrong type."""

def window_seed(seed: int, window: int) -> int:
    """The seed window ``window`` of a stream is planned with, for a run seeded ``seed``
    (``dflash_batch.Windows``). Raises OverflowError for a negative or too large argument."""

def seed_lengths(n: int, seed: int) -> npt.NDArray[np.uint32]:
    """``n`` lengths of the seed workload (bins and shares of shared/CONTEXT.md), reproducible from
    ``seed``: the same generator as the Rust benches. Raises OverflowError for a negative ``n`` or
    ``seed`` (``dflash_batch.seed_workload`` checks them first)."""

def efficiency(
    offsets: npt.NDArray[np.uint32],
    indices: npt.NDArray[np.uint32],
    lengths: npt.NDArray[np.uint32],
    pad_to_multiple_of: int = 1,
) -> float | None:
    """Real over padded tokens of any CSR batching (each batch's rows × its longest length rounded up to
    ``pad_to_multiple_of``); None without tokens. Raises PlanError for offsets that are not a CSR over
    ``indices``, an index past ``lengths``, or ``pad_to_multiple_of`` 0."""

def end_to_end(
    offsets: npt.NDArray[np.uint32],
    indices: npt.NDArray[np.uint32],
    lengths: npt.NDArray[np.uint32],
    world_size: int,
    accumulation: int = 1,
    pad_to_multiple_of: int = 1,
    cost: tuple[float, float] = (1.0, 0.0),
    capacity: int | None = None,
) -> tuple[float, float] | None:
    """``(per micro-batch, per optimizer step)`` end-to-end efficiency of any CSR batching: every
    sample's ``a·l + b·l²`` over ``world_size ×`` the time the ranks take waiting for the slowest,
    padding included (padded batches take ``rows × (a·L + b·L²)``; with ``capacity``, packed rows take
    ``a·capacity + b·Σl²``). None without a step. Raises PlanError for a batching that is not a CSR over
    ``lengths``, a packed row over ``capacity``, a zero count, or an invalid cost."""

def sync_efficiency(
    offsets: npt.NDArray[np.uint32],
    indices: npt.NDArray[np.uint32],
    lengths: npt.NDArray[np.uint32],
    world_size: int,
    accumulation: int = 1,
    pad_to_multiple_of: int = 1,
    cost: tuple[float, float] = (1.0, 0.0),
) -> tuple[float, float] | None:
    """``(per micro-batch, per optimizer step)`` synchronous efficiency of any CSR batching: its cost
    over ``world_size ×`` the time when ranks wait for the slowest every step, or every ``accumulation``
    steps. A row of padded length ``L`` costs ``a·L + b·L²``. None without a step. Raises PlanError for
    a batching that is not a CSR over ``lengths``, a zero count, or an invalid cost."""

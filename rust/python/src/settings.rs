//! Every planning setting of a `BucketSampler`, declared once: its name, Python type, default, range and
//! what it does. `Config` takes exactly these keyword arguments in this order (`config.rs`); Python builds
//! the sampler's docstring and the settings table of `docs/usage.md` from `_core.SETTINGS`, and the tests
//! check `BucketSampler`'s signature, `Config`'s text signature and the stubs against it — so a setting
//! added here and forgotten elsewhere fails a test, and its documentation cannot drift.
//!
//! The types are checked where each value is extracted (`extract.rs`, `choices.rs`), the ranges and the
//! rules between settings in the core (`Config::validate`); `range` says in words what those accept.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// One setting: what a user reads about it, in one place.
pub(crate) struct Setting {
    pub(crate) name: &'static str,
    /// The Python annotation of the keyword argument.
    pub(crate) kind: &'static str,
    /// The default, as Python source.
    pub(crate) default: &'static str,
    /// The values accepted, in words.
    pub(crate) range: &'static str,
    pub(crate) doc: &'static str,
}

/// The settings in the order `settings()`, checkpoints and the signature list them.
pub(crate) const SETTINGS: [Setting; 20] = [
    Setting {
        name: "batch_size",
        kind: "int | None",
        default: "None",
        range: "1 to 2**32 - 1",
        doc: "fixed rows per batch. Exactly one of `batch_size` and `max_tokens`.",
    },
    Setting {
        name: "max_tokens",
        kind: "int | None",
        default: "None",
        range: "≥ 1 (≤ 2**32 - 1 packed)",
        doc: "padded-token budget per batch: `rows × round_up(longest row) ≤ max_tokens`; with a `cost` \
              model, a budget in its units; the row capacity with `mode=\"packed\"`.",
    },
    Setting {
        name: "boundaries",
        kind: "str | int | Sequence[int]",
        default: "'auto'",
        range: "'auto', 1 to 65535 buckets, or rising edges covering every length",
        doc: "`\"auto\"`: the fewest buckets whose predicted padding efficiency reaches \
              `target_efficiency`, placed by an exact dynamic program over the length histogram; a \
              bucket count K; or explicit edges `e_0 < … < e_K`, bucket `i` holding lengths in \
              `(e_i, e_{i+1}]`.",
    },
    Setting {
        name: "seed",
        kind: "int",
        default: "0",
        range: "0 to 2**64 - 1",
        doc: "seed of every random stream.",
    },
    Setting {
        name: "shuffle",
        kind: "bool",
        default: "True",
        range: "a bool",
        doc: "reshuffle every epoch (training); `False` gives a deterministic length-sorted plan.",
    },
    Setting {
        name: "world_size",
        kind: "int | None",
        default: "None",
        range: "≥ 1",
        doc: "ranks the plan is split over (default: `torch.distributed`'s when it is initialized, else \
              torchrun's `WORLD_SIZE`, else 1).",
    },
    Setting {
        name: "drop_last",
        kind: "bool",
        default: "False",
        range: "a bool",
        doc: "drop the last `batches mod world_size` batches (counted in `plan.stats()[\"dropped\"]`) \
              instead of splitting batches so that every rank gets the same number of steps.",
    },
    Setting {
        name: "oversize",
        kind: "str",
        default: "'error'",
        range: "'error', 'skip' or 'truncate' (packed)",
        doc: "samples longer than `max_tokens`: `\"error\"` raises naming the row, `\"skip\"` leaves them \
              out (counted in `plan.stats()[\"skipped\"]`), `\"truncate\"` (`mode=\"packed\"`) splits each \
              into `max_tokens`-token pieces packed as separate sequences (`sampler.pieces`).",
    },
    Setting {
        name: "pad_to_multiple_of",
        kind: "int",
        default: "1",
        range: "1 to 2**32 - 1 (packed: dividing max_tokens)",
        doc: "padded lengths are rounded up to a multiple of this; the budget counts it, and the Loader \
              pads with it. With `mode=\"packed\"` every sample in a row is padded to a multiple of it \
              (FP8 and sequence-parallel kernels: `docs/context_parallel.md`).",
    },
    Setting {
        name: "threads",
        kind: "int | None",
        default: "None",
        range: "≥ 1, capped to this machine's cores (default: up to 8)",
        doc: "planner threads. The plan is identical for any value.",
    },
    Setting {
        name: "accumulation",
        kind: "int | None",
        default: "None",
        range: "≥ 1 (None: 1, or a trainer's gradient accumulation)",
        doc: "micro-batches per optimizer step: windows of `accumulation × world_size` batches are what \
              one optimizer step sees; mixing is measured and rank balance matched over them. Pass your \
              real value (`BucketTrainer` binds its `gradient_accumulation_steps`).",
    },
    Setting {
        name: "target_efficiency",
        kind: "float | None",
        default: "None",
        range: "(0, 1], or None",
        doc: "the padding efficiency `boundaries=\"auto\"` aims for. `None`: 0.982 for padded batches \
              under a token budget priced with an attention term (`cost=(a, b)`, b > 0: there padding \
              caps the end-to-end figure per step), else 0.98.",
    },
    Setting {
        name: "order",
        kind: "str",
        default: "'stratified'",
        range: "'stratified' or 'random'",
        doc: "`\"stratified\"`: consecutive batches draw from the length buckets in proportion to the data \
              (a low-discrepancy interleaving, randomized every epoch), so every accumulation window sees \
              the dataset's length mix; `\"random\"`: a seeded shuffle within each of the epoch's groups.",
    },
    Setting {
        name: "cost",
        kind: "str | tuple[float, float]",
        default: "'tokens'",
        range: "'tokens', or (a, b) each 0 or in [1e-12, 1e12], a + b > 0",
        doc: "`\"tokens\"`: a batch costs its padded tokens; `(a, b)`: a row of padded length `L` costs \
              `a·L + b·L²` (attention). The budget and rank balance use it, so long-sequence batches take \
              fewer tokens and ranks are matched on compute. Example: `cost=(1, 1/4096)`.",
    },
    Setting {
        name: "balance_tolerance",
        kind: "float | None",
        default: "None",
        range: "None, or > 0",
        doc: "`None` keeps mixing first (steps matched by cost inside each optimizer window); a number `t` \
              forms every step, where the data allows, from batches whose costs are within `1 + t`: lower \
              rank imbalance, less mixing.",
    },
    Setting {
        name: "mode",
        kind: "str",
        default: "'padded'",
        range: "'padded' or 'packed'",
        doc: "`\"padded\"`: rows padded to the batch's longest; `\"packed\"`: samples concatenated into rows \
              of `max_tokens` tokens for varlen attention (FlashAttention `cu_seqlens`, SDPA document \
              masks), a batch being one row.",
    },
    Setting {
        name: "bucketed",
        kind: "bool",
        default: "False",
        range: "a bool (packed only)",
        doc: "with `mode=\"packed\"`, pack only samples of one length bucket together (`boundaries`; \
              `\"auto\"`: 2 buckets), which bounds each row's longest sample at some cost in fill.",
    },
    Setting {
        name: "trim_steps",
        kind: "bool",
        default: "False",
        range: "a bool (max_tokens, padded, balance_tolerance=None)",
        doc: "trim each step's batches to a common cost and re-form the rows trimmed into extra steps spread \
              through the epoch: ranks wait less for a few percent more steps and some mixing.",
    },
    Setting {
        name: "context_parallel",
        kind: "int",
        default: "1",
        range: "1 to 2**32 - 1 (packed; max_tokens a multiple of 2·context_parallel)",
        doc: "with `mode=\"packed\"`, the ranks each row is split over (ring or Ulysses attention): every \
              sample is padded to a multiple of `2·context_parallel` (and of `pad_to_multiple_of`), the \
              padding counted as waste, so it splits into equal zigzag chunks; `plan.stats()` reports the \
              attention spread per layout and `db.context_parallel_shard` cuts a batch for one rank \
              (`docs/context_parallel.md`).",
    },
    Setting {
        name: "rank_cost",
        kind: "tuple[float, float] | None",
        default: "None",
        range: "None, or (a, b) as for cost (not with trim_steps)",
        doc: "the price ranks are balanced by, when it differs from `cost`: the budget, and so every batch \
              and the step count, stay as `cost` forms them. What `db.StepTimer` sets from measured step \
              times (`docs/calibration.md`).",
    },
];

/// Whether `name` is a setting.
pub(crate) fn is_setting(name: &str) -> bool {
    SETTINGS.iter().any(|s| s.name == name)
}

/// The names, comma separated (for messages).
pub(crate) fn names() -> String {
    SETTINGS
        .iter()
        .map(|s| s.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `_core.SETTINGS`: the declaration as a tuple of dicts (`name`, `type`, `default`, `range`, `doc`).
pub(crate) fn declared(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    let rows = SETTINGS
        .iter()
        .map(|s| {
            let row = PyDict::new(py);
            row.set_item("name", s.name)?;
            row.set_item("type", s.kind)?;
            row.set_item("default", s.default)?;
            row.set_item("range", s.range)?;
            row.set_item("doc", s.doc)?;
            Ok(row)
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, rows)
}

//! The declaration itself: every planning setting, in the order `settings()`, checkpoints and the
//! signature list them (see the module's doc for what is written from it).

use dflash_batch_core::Config as CoreConfig;
use pyo3::prelude::*;

use super::{Group, Recorded, Setting};
use crate::choices::{cost_of, order_of, oversize_of, rank_cost_of};
use crate::errors::to_py;
use crate::extract::{boundaries_of, count, flag, number, optional_count, seed_of, threads_of};

/// The settings in the order `settings()`, checkpoints and the signature list them.
pub(crate) const SETTINGS: [Setting; 22] = [
    Setting {
        name: "batch_size",
        kind: "int | None",
        default: "None",
        range: "1 to 2**32 - 1",
        doc: "fixed rows per batch. Exactly one of `batch_size` and `max_tokens`.",
        group: Group::Padded,
        recorded: Recorded::Always,
        apply: |d, given, v| {
            d.batch_size = optional_count(given, "batch_size", v)?;
            Ok(())
        },
    },
    Setting {
        name: "max_tokens",
        kind: "int | None",
        default: "None",
        range: "≥ 1 (≤ 2**32 - 1 packed)",
        doc: "padded-token budget per batch: `rows × round_up(longest row) ≤ max_tokens`; with a `cost` \
              model, a budget in its units; the row capacity with `mode=\"packed\"`.",
        group: Group::Batching,
        recorded: Recorded::Always,
        apply: |d, given, v| {
            d.max_tokens = optional_count(given, "max_tokens", v)?;
            Ok(())
        },
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
        group: Group::Own,
        recorded: Recorded::Always,
        apply: |d, given, v| {
            d.core.boundaries = boundaries_of(given, v)?;
            Ok(())
        },
    },
    Setting {
        name: "seed",
        kind: "int",
        default: "0",
        range: "0 to 2**64 - 1",
        doc: "seed of every random stream.",
        group: Group::Own,
        recorded: Recorded::Always,
        apply: |d, given, v| {
            d.core.seed = seed_of(given, v)?;
            Ok(())
        },
    },
    Setting {
        name: "shuffle",
        kind: "bool",
        default: "True",
        range: "a bool",
        doc: "reshuffle every epoch (training); `False` gives a deterministic length-sorted plan.",
        group: Group::Own,
        recorded: Recorded::Always,
        apply: |d, given, v| {
            d.core.shuffle = flag(given, "shuffle", v, true)?;
            Ok(())
        },
    },
    Setting {
        name: "world_size",
        kind: "int | None",
        default: "None",
        range: "≥ 1",
        doc: "ranks the plan is split over (default: `torch.distributed`'s when it is initialized, else \
              torchrun's `WORLD_SIZE`, else 1).",
        group: Group::World("size"),
        recorded: Recorded::Always,
        apply: |d, given, v| {
            // `None`: one rank (the sampler resolves torch.distributed's ranks before building a Config).
            d.core.world_size = count(given, "world_size", v, Some(1))?;
            Ok(())
        },
    },
    Setting {
        name: "drop_last",
        kind: "bool",
        default: "False",
        range: "a bool",
        doc: "drop the last `batches mod world_size` batches (counted in `plan.stats()[\"dropped\"]`) \
              instead of splitting batches so that every rank gets the same number of steps.",
        group: Group::World("drop_last"),
        recorded: Recorded::Always,
        apply: |d, given, v| {
            d.core.drop_last = flag(given, "drop_last", v, false)?;
            Ok(())
        },
    },
    Setting {
        name: "oversize",
        kind: "str",
        default: "'error'",
        range: "'error', 'skip' or 'truncate' (packed)",
        doc: "samples longer than `max_tokens`: `\"error\"` raises naming the row, `\"skip\"` leaves them \
              out (counted in `plan.stats()[\"skipped\"]`), `\"truncate\"` (`mode=\"packed\"`) splits each \
              into `max_tokens`-token pieces packed as separate sequences (`sampler.pieces`).",
        group: Group::Batching,
        recorded: Recorded::Always,
        apply: |d, given, v| {
            d.core.oversize = oversize_of(given, v)?;
            Ok(())
        },
    },
    Setting {
        name: "pad_to_multiple_of",
        kind: "int",
        default: "1",
        range: "1 to 2**32 - 1 (packed: dividing max_tokens)",
        doc: "padded lengths are rounded up to a multiple of this; the budget counts it, and the Loader \
              pads with it. With `mode=\"packed\"` every sample in a row is padded to a multiple of it \
              (FP8 and sequence-parallel kernels: `docs/context_parallel.md`).",
        group: Group::Batching,
        recorded: Recorded::Always,
        apply: |d, given, v| {
            d.core.pad_to_multiple_of = count(given, "pad_to_multiple_of", v, None)?;
            Ok(())
        },
    },
    Setting {
        name: "threads",
        kind: "int | None",
        default: "None",
        range: "≥ 1, capped to this machine's cores (default: up to 8)",
        doc: "planner threads. The plan is identical for any value.",
        group: Group::Own,
        recorded: Recorded::Never,
        apply: |d, given, v| {
            d.threads = threads_of(given, v)?;
            Ok(())
        },
    },
    Setting {
        name: "accumulation",
        kind: "int | None",
        default: "None",
        range: "≥ 1 (None: 1, or a trainer's gradient accumulation)",
        doc: "micro-batches per optimizer step: windows of `accumulation × world_size` batches are what \
              one optimizer step sees; mixing is measured and rank balance matched over them. Pass your \
              real value (`BucketTrainer` binds its `gradient_accumulation_steps`).",
        group: Group::Balance("accumulation"),
        recorded: Recorded::Always,
        apply: |d, given, v| {
            // `None`: one micro-batch per step (the sampler tells a trainer's own value apart).
            d.core.accumulation = count(given, "accumulation", v, Some(1))?;
            Ok(())
        },
    },
    Setting {
        name: "target_efficiency",
        kind: "float | None",
        default: "None",
        range: "(0, 1], or None",
        doc: "the padding efficiency `boundaries=\"auto\"` aims for. `None`: 0.982 for padded batches \
              under a token budget priced with an attention term (`cost=(a, b)`, b > 0: there padding \
              caps the end-to-end figure per step); for other padded batches 0.93 where an optimizer \
              step holds 2 to 7 micro-batches (`world_size × accumulation`) and 0.97 otherwise \
              (narrower buckets make a step of few batches noisier than a shuffle's: \
              `docs/convergence.md`); 0.98 for packed rows.",
        group: Group::Own,
        recorded: Recorded::Always,
        apply: |d, given, v| {
            // Left out or `None`: the core's default for the mode, the price and the step shape
            // (`config.rs`), resolved wherever the plan is made.
            d.target_efficiency = match v.filter(|t| !t.is_none()) {
                Some(t) => Some(number(given, "target_efficiency", Some(t), 0.0)?),
                None => {
                    given.set_item("target_efficiency", given.py().None())?;
                    None
                }
            };
            Ok(())
        },
    },
    Setting {
        name: "order",
        kind: "str",
        default: "'stratified'",
        range: "'stratified' or 'random'",
        doc: "`\"stratified\"`: consecutive batches draw from the length buckets in proportion to the data \
              (a low-discrepancy interleaving, randomized every epoch), so every accumulation window sees \
              the dataset's length mix; `\"random\"`: a seeded shuffle within each of the epoch's groups.",
        group: Group::Own,
        recorded: Recorded::Always,
        apply: |d, given, v| {
            d.core.order = order_of(given, v)?;
            Ok(())
        },
    },
    Setting {
        name: "cost",
        kind: "str | tuple[float, float]",
        default: "'tokens'",
        range: "'tokens', or (a, b) each 0 or in [1e-12, 1e12], a + b > 0",
        doc: "`\"tokens\"`: a batch costs its padded tokens; `(a, b)`: a row of padded length `L` costs \
              `a·L + b·L²` (attention). The budget and rank balance use it, so long-sequence batches take \
              fewer tokens and ranks are matched on compute. Example: `cost=(1, 1/4096)`.",
        group: Group::Own,
        recorded: Recorded::Always,
        apply: |d, given, v| {
            d.core.cost = cost_of(given, v)?;
            Ok(())
        },
    },
    Setting {
        name: "balance_tolerance",
        kind: "float | None",
        default: "None",
        range: "None, or > 0",
        doc: "`None` keeps mixing first (steps matched by cost inside each optimizer window); a number `t` \
              forms every step, where the data allows, from batches whose costs are within `1 + t`: lower \
              rank imbalance, less mixing.",
        group: Group::Balance("tolerance"),
        recorded: Recorded::Always,
        apply: |d, given, v| {
            let tolerance = match v.filter(|t| !t.is_none()) {
                Some(t) => Some(number(given, "balance_tolerance", Some(t), 0.0)?),
                None => {
                    given.set_item("balance_tolerance", given.py().None())?;
                    None
                }
            };
            d.core.balance_tolerance_ppm = CoreConfig::balance_tolerance_ppm(tolerance).map_err(to_py)?;
            Ok(())
        },
    },
    Setting {
        name: "mode",
        kind: "str",
        default: "'padded'",
        range: "'padded' or 'packed'",
        doc: "`\"padded\"`: rows padded to the batch's longest; `\"packed\"`: samples concatenated into rows \
              of `max_tokens` tokens for varlen attention (FlashAttention `cu_seqlens`, SDPA document \
              masks), a batch being one row.",
        group: Group::Mode,
        recorded: Recorded::Always,
        apply: |d, _, v| {
            d.mode = v.cloned(); // read with `bucketed` (`config.rs`)
            Ok(())
        },
    },
    Setting {
        name: "bucketed",
        kind: "bool",
        default: "False",
        range: "a bool (packed only)",
        doc: "with `mode=\"packed\"`, pack only samples of one length bucket together (`boundaries`; \
              `\"auto\"`: 2 buckets), which bounds each row's longest sample at some cost in fill.",
        group: Group::Packed,
        recorded: Recorded::Always,
        apply: |d, _, v| {
            d.bucketed = v.cloned();
            Ok(())
        },
    },
    Setting {
        name: "trim_steps",
        kind: "bool",
        default: "False",
        range: "a bool (max_tokens, padded, balance_tolerance=None)",
        doc: "trim each step's batches to a common cost and re-form the rows trimmed into extra steps spread \
              through the epoch: ranks wait less for a few percent more steps and some mixing.",
        group: Group::Padded,
        recorded: Recorded::Always,
        apply: |d, given, v| {
            d.core.trim_steps = flag(given, "trim_steps", v, false)?;
            Ok(())
        },
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
        group: Group::Packed,
        recorded: Recorded::UnlessDefault,
        apply: |d, given, v| {
            d.core.context_parallel = count(given, "context_parallel", v, None)?;
            Ok(())
        },
    },
    Setting {
        name: "rank_cost",
        kind: "tuple[float, float] | None",
        default: "None",
        range: "None, or (a, b) as for cost (not with trim_steps)",
        doc: "the price ranks are balanced by, when it differs from `cost`: the budget, and so every batch \
              and the step count, stay as `cost` forms them. What `db.StepTimer` sets from measured step \
              times (`docs/calibration.md`).",
        group: Group::Balance("rank_cost"),
        recorded: Recorded::WhenSet,
        apply: |d, given, v| {
            d.core.rank_cost = rank_cost_of(given, v)?;
            Ok(())
        },
    },
    Setting {
        name: "whole_steps",
        kind: "bool",
        default: "False",
        range: "a bool",
        doc: "round the steps of a plan up to whole optimizer steps (a multiple of `accumulation` on every \
              rank) by splitting batches, as for ranks, so a plan never ends inside an optimizer step. \
              `db.Windows` sets it: each window of a stream then starts a step of its own.",
        group: Group::World("whole_steps"),
        recorded: Recorded::UnlessDefault,
        apply: |d, given, v| {
            d.core.whole_steps = flag(given, "whole_steps", v, false)?;
            Ok(())
        },
    },
    Setting {
        name: "max_docs_per_row",
        kind: "int | None",
        default: "None",
        range: "None, or 1 to 2**32 - 1 (packed only)",
        doc: "with `mode=\"packed\"`, the most samples (pieces, under `oversize=\"truncate\"`) a row holds: \
              attention kernels and per-document bookkeeping (`cu_seqlens` buffers, position resets) cost \
              per document. A row closes at the cap whatever its room, so fill falls where samples are \
              short (`docs/packing.md`). `None`: no cap.",
        group: Group::Packed,
        recorded: Recorded::UnlessDefault,
        apply: |d, given, v| {
            d.core.max_docs_per_row = match v.filter(|o| !o.is_none()) {
                Some(_) => Some(count(given, "max_docs_per_row", v, None)?),
                None => {
                    given.set_item("max_docs_per_row", given.py().None())?;
                    None
                }
            };
            Ok(())
        },
    },
];

//! Seeded, reproducible length-bucketed batch planning for LLM training.
//!
//! Given the token length of every sample, a [`Planner`] produces, for any `(seed, epoch)`, the
//! [`Plan`] of that epoch: every batch of every rank in training order, in CSR form. Batches group
//! samples of similar length (so little compute is spent on padding) while their membership and
//! order are reshuffled every epoch (so the optimizer sees well-mixed data).
//!
//! The lengths usually come from the dataset itself: [`read_lengths`] reads an integer column, or a
//! list column's offsets, from memory-mapped Arrow IPC files (file or stream format, such as the
//! shards of a Hugging Face `datasets` directory), and a [`TokenStore`] keeps the token column mapped
//! for random access to any sample's tokens.
//!
//! # Guarantees
//!
//! * **Deterministic**: the same lengths, configuration, seed and epoch give a bit-identical plan on
//!   any machine and for any thread count (golden vectors in the tests pin it).
//! * **Complete**: every sample appears exactly once per epoch, except those counted as skipped
//!   (`oversize = Skip`) or dropped (`drop_last`).
//! * **Fair**: every rank gets the same number of steps; nothing is repeated to get there.
//! * **Within budget**: every batch has at most `batch_size` rows, or
//!   `rows × cost(round_up(longest, pad_to_multiple_of)) ≤ max_tokens` (cost: tokens, or
//!   [`CostModel`]'s `a·L + b·L²`), and holds one bucket's lengths.
//! * **Balanced**: each step's batches are the most similar in cost that mixing allows
//!   (`balance.rs`; `balance_tolerance_ppm` trades mixing for more, and `trim_steps` trims each
//!   step's batches to a common cost, the rows trimmed forming extra steps: `form/trim.rs`).
//! * **Lean**: a `u32` per sample of working memory per epoch, two while batches are reordered
//!   (epochs up to 16.7M samples); no panics on bad input — every failure is an [`Error`] whose
//!   message names the value and the fix.
//!
//! # Layout
//!
//! * [`read`] — Arrow IPC files memory-mapped, length columns, token stores.
//! * [`plan`] — configuration, bucket edges, and the epoch pipeline (`plan/planner.rs` lists its
//!   stages: admit → shuffle and form → order and balance → split for ranks → the [`Plan`]).
//! * [`collate`] — padded and packed batches written into caller-provided buffers.
//! * [`metrics`] — how well a plan mixes lengths and balances ranks.
//! * [`shared`] — one plan per machine: an epoch planned once into a checked file the other
//!   processes map.
//! * [`error`], [`lengths`], [`memory`], [`pool`], [`rng`], [`workload`] — what the rest shares.
//!
//! # Example
//!
//! ```
//! use dflash_batch_core::{Batching, Config, Planner};
//!
//! let lengths: Vec<u32> = vec![120, 800, 95, 3000, 640, 2200, 150, 900];
//! let config = Config { world_size: 2, seed: 7, ..Config::new(Batching::Tokens(4096)) };
//! let planner = Planner::new(lengths, config)?;
//! let plan = planner.plan(0)?;
//! assert_eq!(plan.indices().len(), 8); // every sample once
//! assert_eq!(plan.len() % 2, 0); // equal steps on both ranks
//! let first_step_rank_1 = plan.step(0, 1)?;
//! assert!(!first_step_rank_1.is_empty());
//! assert_eq!(planner.plan(0)?, plan); // reproducible
//! # Ok::<(), dflash_batch_core::Error>(())
//! ```
// One `unsafe` block in the crate: memory-mapping a file (see `arrow.rs`).
#![deny(unsafe_code)]

pub mod collate;
pub mod error;
pub mod lengths;
pub mod memory;
pub mod metrics;
pub mod online;
pub mod plan;
pub mod pool;
pub mod read;
pub mod rng;
pub mod shared;
pub(crate) mod tasks;
pub mod workload;

pub use error::read::ReadProblem;
pub use error::{Error, ErrorKind, Result, SharedProblem};
pub use online::{split_step, StepSpec, StepSplit};
pub use plan::buckets::Buckets;
pub use plan::config::{Batching, Boundaries, Config, CostModel, Mode, Order, Oversize};
pub use plan::mixture::{Interpolation, Mixture, Point, Schedule, Source, Unit};
pub use plan::output::{largest_padded, Plan, Stats};
pub use plan::planner::Planner;
pub use plan::resume::Resumed;
pub use plan::revision::PLAN_REVISION;
pub use plan::window::window_seed;
pub use read::dataset::{read_documents, read_lengths};
pub use read::table::table_lengths;
pub use read::tokens::{Gathered, Mask, MaskKind, TokenStore, Tokens};
pub use shared::{Layout, SharedPlan};

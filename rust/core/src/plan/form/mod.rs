//! The form stage: an epoch's admitted samples, in their shuffled (or sorted) order, cut into
//! batches by the batching rule, then put in training order and rank-balanced group by group while
//! the group's rows are in cache.
//!
//! * `rule.rs` — the rule (when a padded batch closes) and the pass over a stream of samples,
//!   written once; `open.rs` and `tight.rs` keep a stream's open batches, `cut.rs` a shuffled
//!   bucket's, `pack.rs` (with `window.rs`) is the packed rule; `compose.rs` composes a group's
//!   packed rows by attention cost instead, under a cost model that prices it (`classes.rs` keeps
//!   the open rows of both by class).
//! * `trim.rs` — steps trimmed to a common cost after ordering (`Config::trim_steps`).
//! * `by_bucket.rs` — shuffled padded epochs up to [`ARRANGE_MAX_SAMPLES`] samples: each bucket
//!   shuffled and cut front to back, with a third of the stream's work (6.4 against 16.5 ms an
//!   epoch on the seed workload, 2 threads, measured), at 16 more bytes a sample.
//! * `stream.rs` — larger shuffled epochs, packed ones and sorted ones, streamed.
//! * `batches.rs` — what forming records: a stream's batches and the whole epoch's.
//! * `order.rs` — a group's batches put in training order (`arrange.rs`), chosen for a mixture's
//!   sources (`choose.rs`: which rows are of which source, [`Labels`]) and matched for rank balance.

mod batches;
mod by_bucket;
pub(crate) mod choose;
mod classes;
mod compose;
mod cut;
mod open;
mod order;
mod pack;
mod rule;
mod stream;
#[cfg(test)]
mod testing;
mod tight;
mod trim;
mod window;

pub(crate) use batches::Epoch;
pub(crate) use by_bucket::ByBucket;
pub(crate) use choose::Labels;
pub(crate) use cut::{length_of, row_of};
pub(crate) use stream::Former;
pub(crate) use window::WINDOW;

/// Samples from which the scatter carries lengths along for the stream: below, the lengths array
/// (2 or 4 bytes a sample) stays in cache and random lookups are cheaper than a second buffer.
pub(crate) const COMPANION_MIN_SAMPLES: usize = 1 << 23;

/// Epochs up to this size are formed bucket by bucket (padded: `by_bucket.rs`) and have their batches
/// ordered by `arrange.rs` and balanced by `balance.rs`; larger ones stream and keep formation
/// order. Ordering moves every row once more, through a group-sized buffer, in a random batch order,
/// and keeps a cost and a mean length per batch: at 1M samples that costs ~2.5 ms, but at 100M it
/// doubled the epoch's time (1.9 → 3.9 s) and pushed peak memory past 1 GB (measured), where
/// formation order already mixes fairly (window_tv ≈ 0.15).
pub(crate) const ARRANGE_MAX_SAMPLES: usize = 1 << 24;

/// Most parallel forming groups: enough for 16 threads; each closes its partial batches at its end.
pub(crate) const MAX_GROUPS: usize = 16;

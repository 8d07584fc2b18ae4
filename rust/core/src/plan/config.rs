//! What determines a plan besides the lengths, the seed and the epoch: batch sizing, bucket edges,
//! ranks, and the policies for leftovers and oversize samples.

use crate::error::{ErrorKind, Result};

mod cost;
mod packed;
mod pieces;
mod target;
pub use cost::CostModel;
pub(crate) use pieces::padded_piece;
pub use target::SMALL_STEP_TARGET_EFFICIENCY_PPM;

/// How batches are sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batching {
    /// A fixed number of rows per batch.
    Rows(u32),
    /// A padded-token budget: `rows × round_up(longest row) ≤ budget`.
    Tokens(u64),
}

impl Batching {
    /// Builds the batching rule from the two optional settings, exactly one of which must be given.
    pub fn from_options(batch_size: Option<i64>, max_tokens: Option<i64>) -> Result<Self> {
        match (batch_size, max_tokens) {
            (Some(_), Some(_)) => Err(ErrorKind::BatchSpec { both: true }.into()),
            (None, None) => Err(ErrorKind::BatchSpec { both: false }.into()),
            (Some(n), None) => match u32::try_from(n) {
                Ok(n) if n > 0 => Ok(Batching::Rows(n)),
                _ => Err(setting("batch_size", n, "between 1 and 4294967295")),
            },
            (None, Some(t)) => match u64::try_from(t) {
                Ok(t) if t > 0 => Ok(Batching::Tokens(t)),
                _ => Err(setting("max_tokens", t, "≥ 1")),
            },
        }
    }
}

/// Where bucket edges come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Boundaries {
    /// The fewest optimized buckets whose predicted efficiency reaches `target_efficiency_ppm`
    /// (see `optimize.rs`).
    Auto,
    /// This many buckets, placed to minimize padding (see `optimize.rs`).
    Count(usize),
    /// Explicit edges; bucket `i` holds lengths in `(edges[i], edges[i + 1]]`.
    Edges(Vec<u32>),
}

impl Boundaries {
    /// The most buckets: a sample's bucket is kept in a `u16`.
    pub const MAX_COUNT: usize = u16::MAX as usize;

    /// `k` optimized buckets, `k` from 1 to [`Boundaries::MAX_COUNT`] (any integer a user typed is
    /// taken, so the message quotes it).
    pub fn count(k: i128) -> Result<Self> {
        match usize::try_from(k) {
            Ok(k) if (1..=Self::MAX_COUNT).contains(&k) => Ok(Self::Count(k)),
            _ => Err(ErrorKind::InvalidSetting {
                name: "boundaries",
                value: k,
                expected: "a bucket count between 1 and 65535, 'auto' or a list of edges",
            }
            .into()),
        }
    }
}

/// How the batches of a shuffled epoch are ordered (see `arrange.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Every stretch of consecutive batches draws from the buckets in proportion to the data: a
    /// low-discrepancy interleaving with a random phase per bucket, epoch and group.
    Stratified,
    /// A seeded shuffle of the batches within each of the epoch's (at most 16) groups.
    Random,
}

/// What a batch is: rows padded to their longest, or samples packed end to end into one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `rows × round_up(longest) ≤ max_tokens` (or `batch_size` rows), every row padded to the longest.
    Padded,
    /// Samples concatenated into a row of `max_tokens` tokens (for varlen attention: `pack.rs`);
    /// `bucketed`: only samples of one length bucket share a row.
    Packed {
        /// Pack within length buckets, so each row's longest sample is predictable.
        bucketed: bool,
    },
}

/// What to do with samples that fit no batch under `max_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Oversize {
    /// Fail, naming the first such sample.
    Error,
    /// Leave them out of every plan and count them in [`crate::plan::output::Stats::skipped`].
    Skip,
    /// Packed rows only: plan each as `⌈L / max_tokens⌉` pieces, each packed like a sample of its
    /// own (`truncate.rs`).
    Truncate,
}

/// Everything that, with the lengths, `seed` and `epoch`, determines a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Batch sizing rule.
    pub batching: Batching,
    /// Bucket edges.
    pub boundaries: Boundaries,
    /// Seed of every random stream.
    pub seed: u64,
    /// Shuffle (training) or length-sorted order (evaluation).
    pub shuffle: bool,
    /// Number of ranks sharing the epoch.
    pub world_size: u32,
    /// Drop the last `batches mod world_size` batches instead of splitting batches.
    pub drop_last: bool,
    /// Policy for samples over `max_tokens`.
    pub oversize: Oversize,
    /// Padded lengths are rounded up to a multiple of this; in packed rows, every piece (a sample,
    /// or a piece of one under `Oversize::Truncate`) is (see [`Config::piece_multiple`]).
    pub pad_to_multiple_of: u32,
    /// Context-parallel degree of packed rows: each row is split over this many ranks, so every
    /// piece is padded to a multiple of `2 · context_parallel` (1: no context parallelism).
    pub context_parallel: u32,
    /// The efficiency `Boundaries::Auto` aims for, in parts per million (1 to 1,000,000); `None`:
    /// the default for the mode, the price and the step shape ([`Config::target_efficiency`]).
    pub target_efficiency_ppm: Option<u32>,
    /// Batch order of shuffled epochs.
    pub order: Order,
    /// Micro-batches per optimizer step: the mixing window is `accumulation × world_size` batches,
    /// and steps are matched for rank balance inside it (see `balance.rs`).
    pub accumulation: u32,
    /// Cost of a row, for the token budget and for rank balance.
    pub cost: CostModel,
    /// Cost of a row for rank balance (and the plan's predicted balance) only, when it differs from
    /// `cost`: what a cost refitted from measured step times sets, leaving the budget, and so every
    /// batch, as `cost` forms them. `None`: `cost`.
    pub rank_cost: Option<CostModel>,
    /// Padded or packed batches.
    pub mode: Mode,
    /// Rank-balance tolerance in parts per million: `None` matches steps only inside each mixing
    /// window (mixing first); `Some(t)` forms every step from batches whose costs are within a factor
    /// `1 + t/10⁶` where the data allows, at a cost to mixing (see `balance.rs`).
    pub balance_tolerance_ppm: Option<u32>,
    /// Trim every step's batches to a common cost and re-form the rows trimmed into extra steps
    /// spread through the epoch (`form/trim.rs`): ranks wait less, at more steps and some mixing.
    pub trim_steps: bool,
    /// Round the batch count up to a multiple of `world_size × accumulation` (splitting batches, as for
    /// ranks), so a plan ends on a whole optimizer step: what a stream's windows need, whose plans are
    /// trained one after another (`window.rs`).
    pub whole_steps: bool,
    /// Packed rows only: the most samples (pieces, under `Oversize::Truncate`) a row may hold —
    /// attention kernels and per-document bookkeeping cost per document. `None`: no cap.
    pub max_docs_per_row: Option<u32>,
}

impl Config {
    /// A training configuration with the library defaults around `batching`.
    pub fn new(batching: Batching) -> Self {
        Self {
            batching,
            boundaries: Boundaries::Auto,
            seed: 0,
            shuffle: true,
            world_size: 1,
            drop_last: false,
            oversize: Oversize::Error,
            pad_to_multiple_of: 1,
            context_parallel: 1,
            target_efficiency_ppm: None,
            order: Order::Stratified,
            accumulation: 1,
            cost: CostModel::TOKENS,
            rank_cost: None,
            balance_tolerance_ppm: None,
            trim_steps: false,
            whole_steps: false,
            max_docs_per_row: None,
            mode: Mode::Padded,
        }
    }

    /// The cost ranks are balanced by: `rank_cost` when set, else `cost`.
    #[inline]
    pub fn balance_cost(&self) -> CostModel {
        self.rank_cost.unwrap_or(self.cost)
    }

    /// The balance cost ([`Config::balance_cost`]) of a batch of `rows` rows whose longest row has
    /// `longest` tokens (before padding).
    #[inline]
    pub fn batch_cost(&self, rows: u64, longest: u32) -> f64 {
        // Row counts stay far below 2^53.
        #[allow(clippy::cast_precision_loss)]
        let rows = rows as f64;
        rows * self.balance_cost().row(self.padded(longest))
    }

    /// Batches per mixing window: `accumulation × world_size` (saturating: both may be near 2^32,
    /// and a window that long only means one window for the epoch).
    pub fn window(&self) -> usize {
        (self.accumulation as usize).saturating_mul(self.world_size as usize)
    }

    /// `balance_tolerance` (`None`, or a cost ratio tolerance in [0.001, 1000]) in parts per million.
    pub fn balance_tolerance_ppm(tolerance: Option<f64>) -> Result<Option<u32>> {
        match tolerance {
            None => Ok(None),
            // In [1e3, 1e9]: fits u32.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Some(t) if (0.001..=1000.0).contains(&t) => Ok(Some((t * 1e6).round() as u32)),
            Some(t) => Err(ErrorKind::InvalidRatio {
                name: "balance_tolerance",
                value: t.to_string(),
                expected: "None (balance inside mixing windows only, the default) or a cost ratio \
                           tolerance between 0.001 and 1000, e.g. 0.1 for steps whose batches cost \
                           within 10% of each other",
            }
            .into()),
        }
    }

    /// The cost models: each two finite, non-negative numbers with a positive sum.
    pub(crate) fn validate_cost(&self) -> Result<()> {
        self.cost.check("cost")?;
        self.rank_cost
            .map_or(Ok(()), |model| model.check("rank_cost"))
    }

    /// `trim_steps` needs what trimming changes: rows per batch under a token budget, inside the
    /// default rank balance.
    fn validate_trim(&self) -> Result<()> {
        if !self.trim_steps {
            return Ok(());
        }
        let problem = if self.rank_cost.is_some() {
            "trims each step to a common cost, which would then change with rank_cost (and the steps \
             with it); use one of them (rank_cost=None)"
        } else if matches!(self.batching, Batching::Rows(_)) {
            "needs max_tokens: it changes how many rows a batch holds, which batch_size fixes"
        } else if matches!(self.mode, Mode::Packed { .. }) {
            "trims padded batches; packed rows are filled to max_tokens, so leave it False with \
             mode='packed'"
        } else if self.balance_tolerance_ppm.is_some() {
            "and balance_tolerance both regroup steps; use one of them (balance_tolerance=None)"
        } else {
            return Ok(());
        };
        Err(ErrorKind::TrimSetting { problem }.into())
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.world_size == 0 {
            return Err(setting("world_size", 0, "≥ 1"));
        }
        if self.pad_to_multiple_of == 0 {
            return Err(setting("pad_to_multiple_of", 0, "≥ 1"));
        }
        if self.context_parallel == 0 {
            return Err(setting(
                "context_parallel",
                0,
                "≥ 1 (ranks a packed row is split over; 1: none)",
            ));
        }
        if let Some(ppm) = self.target_efficiency_ppm {
            Self::target_efficiency_ppm(f64::from(ppm) / 1e6)?;
        }
        if self.accumulation == 0 {
            return Err(setting(
                "accumulation",
                0,
                "≥ 1 (micro-batches per optimizer step)",
            ));
        }
        Self::balance_tolerance_ppm(self.balance_tolerance_ppm.map(|t| f64::from(t) / 1e6))?;
        self.validate_cost()?;
        self.validate_trim()?;
        if self.oversize == Oversize::Truncate && self.mode == Mode::Padded {
            return Err(ErrorKind::TruncateSetting {
                problem: "splits long samples into max_tokens pieces for packed rows; pass \
                          mode='packed', or oversize='skip' to leave long samples out",
            }
            .into());
        }
        self.validate_packed()?;
        match self.batching {
            Batching::Rows(0) => Err(setting("batch_size", 0, "≥ 1")),
            Batching::Tokens(0) => Err(setting("max_tokens", 0, "≥ 1")),
            _ => Ok(()),
        }
    }

    /// `length` rounded up to `pad_to_multiple_of`. Runs twice per sample in the hot loop, so powers
    /// of two (the usual 1, 8, 64, 128) avoid the division.
    #[inline]
    pub fn padded(&self, length: u32) -> u64 {
        let (l, pad) = (u64::from(length), u64::from(self.pad_to_multiple_of));
        if pad.is_power_of_two() {
            (l + pad - 1) & !(pad - 1)
        } else {
            l.div_ceil(pad) * pad
        }
    }
}

fn setting(name: &'static str, value: i64, expected: &'static str) -> crate::error::Error {
    ErrorKind::InvalidSetting {
        name,
        value: i128::from(value),
        expected,
    }
    .into()
}

#[cfg(test)]
mod tests;

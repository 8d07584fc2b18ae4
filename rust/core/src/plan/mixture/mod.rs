//! Mixtures: several sources with weights, planned as one epoch.
//!
//! A [`Mixture`] names its sources in order; the planner's lengths are theirs concatenated (source
//! `s` holds rows `bounds[s]..bounds[s + 1]`). Three steps of the epoch pipeline know about
//! sources, and nothing between them does:
//!
//! 1. **Select** (`select.rs`, before forming): each source's quota of the epoch — its weight of the
//!    epoch's size, in samples or in tokens ([`Unit`]), rounded by largest remainder so the quotas
//!    add up exactly — as whole copies of its rows plus a slice of its *cycle*, an order of its rows
//!    in which every bucket is spread evenly. Successive epochs take successive slices of one
//!    cycle, so a down-sampled source walks through its rows before repeating any, and no row
//!    appears twice in an epoch beyond its whole copies. Weights may change from epoch to epoch
//!    (`schedule.rs`): each epoch's quotas are its weights', and its slices follow the epoch
//!    before's through the cycle (`slices.rs`). The selection is keyed by the epoch: an
//!    epoch formed again to keep the shared step count (`steps.rs`) draws other forming draws over
//!    the same selection, and only the last resort, the reference draws, selects as epoch 0 did.
//! 2. **Spread** (`select.rs`, filling each bucket): a bucket's rows are shuffled source by source
//!    and merged by time, so every stretch of the bucket, and every batch cut from it, holds the
//!    sources in proportion.
//! 3. **Choose** (`form/choose.rs`, after each forming group is arranged, before ranks are balanced):
//!    batches of nearly the same mean length trade places so that every stretch of training order
//!    carries each source near its share. Batches keep their rows: efficiency, fill and balance are
//!    those of the same batches without sources.
//!
//! Measured on the seed workload split into four sources of different length profiles (weights
//! 0.3/0.3/0.25/0.15 in tokens, 8 ranks × 4, 16K tokens; `time_plan` with `TIME_PLAN_TV=1`):
//! per-window source TV 0.056 with none of this, 0.037 spread alone, 0.019 chosen alone, 0.015
//! both; the best any assignment of these lengths allows is about 0.010. Rejected: swapping
//! samples of equal length between slots of the finished plan, a sequential decision per sample
//! (0.015 as well, at 23 of a 41 ms epoch and 2.1 of a 4.8 s one at 100M samples, against ~3 ms
//! and ~0.7 s here); single-source batches (a window of 32 batches holds shares only in steps of
//! 1/32); and sampling sources by deficit before forming, as Megatron's blending does (the forming
//! shuffle then undoes it).

mod groups;
mod planning;
mod quotas;
mod schedule;
mod select;
mod slices;
mod spread;
#[cfg(test)]
mod testing;

pub(crate) use crate::plan::form::Labels;
pub(crate) use groups::{Groups, Selection};
pub(crate) use planning::{form_selection, prepare_mixture};
pub(crate) use quotas::{Mix, Own};
pub use schedule::{Interpolation, Point, Schedule, MAX_SCHEDULE_EPOCH, MAX_SCHEDULE_POINTS};

use crate::error::{ErrorKind, Result};

/// The most sources a mixture holds.
pub const MAX_SOURCES: usize = 255;

/// How far the weights may sum from 1 (float rounding of proportions such as 0.1 + 0.2 + 0.7).
pub const WEIGHT_TOLERANCE: f64 = 1e-6;

/// The default cap on repetition: a source is trained at most this many times per epoch.
pub const DEFAULT_MAX_REPEAT: f64 = 4.0;

/// What a mixture's weights and epoch size count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Samples (rows): each source's count per epoch is exact.
    Samples,
    /// Tokens: each source's tokens per epoch are within one sample of its share. What the loss (a
    /// token mean) and the compute see, hence the default of the bindings.
    Tokens,
}

/// One source of a mixture: its name (for messages and figures), its row count and its weight.
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    /// The name, unique in the mixture.
    pub name: String,
    /// Rows of the source (its lengths, in order, in the planner's lengths).
    pub rows: u32,
    /// Its share of every epoch (of epoch 0 and until the schedule's first point, with a
    /// schedule), in [`Mixture::unit`]; the weights sum to 1.
    pub weight: f64,
}

/// Sources with weights (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Mixture {
    /// The sources, in the order their lengths are concatenated.
    pub sources: Vec<Source>,
    /// What the weights and the epoch size count.
    pub unit: Unit,
    /// The most times a source's rows may be trained per epoch (≥ 1): a source whose weight asks for
    /// more is refused, naming it.
    pub max_repeat: f64,
    /// Samples or tokens (in `unit`) of every epoch; `None`: the sources' total, so an epoch is as long
    /// as the data and each source is up- or down-sampled to its weight.
    pub epoch_size: Option<u64>,
    /// Weights that change from epoch to epoch (`schedule.rs`); `None`: the sources' weights hold
    /// for every epoch.
    pub schedule: Option<Schedule>,
}

impl Mixture {
    /// A mixture of `(name, rows, weight)` in samples or tokens, with the default cap and epoch size.
    pub fn new(sources: impl IntoIterator<Item = (String, u32, f64)>, unit: Unit) -> Self {
        Self {
            sources: sources
                .into_iter()
                .map(|(name, rows, weight)| Source { name, rows, weight })
                .collect(),
            unit,
            max_repeat: DEFAULT_MAX_REPEAT,
            epoch_size: None,
            schedule: None,
        }
    }

    /// Every source's weight in epoch `epoch` (the sources' own weights without a schedule).
    pub fn weights_at(&self, epoch: u64) -> Vec<f64> {
        let first: Vec<f64> = self.sources.iter().map(|s| s.weight).collect();
        match &self.schedule {
            Some(schedule) => schedule.weights_at(&first, epoch),
            None => first,
        }
    }

    /// Checks the settings and that the sources hold the `rows` lengths given.
    pub fn validate(&self, rows: usize) -> Result<()> {
        let bad = |setting: &'static str, problem: String| {
            Err(ErrorKind::MixtureSetting { setting, problem }.into())
        };
        if self.sources.is_empty() || self.sources.len() > MAX_SOURCES {
            let count = self.sources.len();
            return bad(
                "sources",
                format!("a mixture has {count} source(s); give 1 to {MAX_SOURCES}"),
            );
        }
        for (i, source) in self.sources.iter().enumerate() {
            if self.sources[..i].iter().any(|s| s.name == source.name) {
                let problem = format!("two sources are named '{}'; name each once", source.name);
                return bad("sources", problem);
            }
            if source.rows == 0 {
                let name = source.name.clone();
                return Err(ErrorKind::EmptySource { source: name }.into());
            }
            if !source.weight.is_finite() || source.weight < 0.0 {
                let (source, weight) = (source.name.clone(), format!("{:?}", source.weight));
                return Err(ErrorKind::MixtureWeight { source, weight }.into());
            }
        }
        let sum: f64 = self.sources.iter().map(|s| s.weight).sum();
        if (sum - 1.0).abs() > WEIGHT_TOLERANCE {
            let weights = self.sources.iter().map(|s| format!("{:?}", s.weight));
            let weights = weights.collect::<Vec<_>>().join(" + ");
            return Err(ErrorKind::MixtureWeights {
                sum: format!("{weights} = {sum:?}"),
            }
            .into());
        }
        if !(self.max_repeat.is_finite() && self.max_repeat >= 1.0) {
            let problem = format!(
                "max_repeat={:?} is invalid; pass a number ≥ 1 (the most times a source is trained per \
                 epoch)",
                self.max_repeat
            );
            return bad("max_repeat", problem);
        }
        if self.epoch_size == Some(0) {
            return bad(
                "epoch_size",
                "epoch_size=0 is invalid; pass a positive size, or None for the sources' total"
                    .into(),
            );
        }
        if let Some(schedule) = &self.schedule {
            let names: Vec<&str> = self.sources.iter().map(|s| s.name.as_str()).collect();
            schedule.validate(&names, WEIGHT_TOLERANCE)?;
        }
        let given: u64 = self.sources.iter().map(|s| u64::from(s.rows)).sum();
        if given != rows as u64 {
            let problem = format!(
                "the sources hold {given} rows but {rows} lengths were given; pass the sources' lengths \
                 concatenated in their order"
            );
            return bad("sources", problem);
        }
        Ok(())
    }

    /// Row bounds of the sources: source `s` holds rows `bounds[s]..bounds[s + 1]`.
    pub(crate) fn bounds(&self) -> Vec<u32> {
        let mut bounds = vec![0u32];
        for s in &self.sources {
            // `validate` checked the rows sum to the lengths' count, a u32.
            bounds.push(bounds[bounds.len() - 1] + s.rows);
        }
        bounds
    }
}

#[cfg(test)]
mod tests;

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
//!    appears twice in an epoch beyond its whole copies. The selection is keyed by the epoch: an
//!    epoch formed again to keep the shared step count (`steps.rs`) draws other forming draws over
//!    the same selection, and only the last resort, the reference draws, selects as epoch 0 did.
//! 2. **Spread** (`select.rs`, filling each bucket): a bucket's rows are shuffled source by source
//!    and merged by time, so every stretch of the bucket, and every batch cut from it, holds the
//!    sources in proportion.
//! 3. **Choose** (`choose.rs`, after each forming group is arranged, before ranks are balanced):
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

mod choose;
mod groups;
mod planning;
mod select;
mod spread;

pub(crate) use choose::Labels;
pub(crate) use groups::{Groups, Selection};

use crate::error::{ErrorKind, Result};
use crate::lengths::Length;

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
    /// Its share of every epoch, in [`Mixture::unit`]; the weights sum to 1.
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

/// A source's admitted rows: all of its range, or a list when the rules leave some out.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Own<'a> {
    Range(u32, u32),
    List(&'a [u32]),
}

impl Own<'_> {
    pub(crate) fn len(self) -> usize {
        match self {
            Own::Range(lo, hi) => (hi - lo) as usize,
            Own::List(rows) => rows.len(),
        }
    }

    /// Their tokens.
    fn tokens<L: Length>(self, lengths: &[L]) -> u64 {
        let sum = |ls: &[L]| ls.iter().map(|&l| u64::from(l.into())).sum::<u64>();
        match self {
            Own::Range(lo, hi) => sum(&lengths[lo as usize..hi as usize]),
            Own::List(rows) => rows
                .iter()
                .map(|&r| u64::from(lengths[r as usize].into()))
                .sum(),
        }
    }
}

/// One source's quota of every epoch: whole copies of its admitted rows plus `rest` (samples or
/// tokens) from its cycle (`select.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Quota {
    pub(crate) copies: u64,
    pub(crate) rest: u64,
}

/// What the planner derives from a mixture once: each source's admitted rows and quota.
#[derive(Debug)]
pub(crate) struct Mix {
    pub(crate) spec: Mixture,
    /// Source `s` holds rows `bounds[s]..bounds[s + 1]`.
    pub(crate) bounds: Vec<u32>,
    /// Each source's admitted rows when the rules leave some out (`oversize="skip"`):
    /// `admitted[admitted_starts[s]..admitted_starts[s + 1]]`; else every row is admitted.
    admitted: Option<(Vec<u32>, Vec<usize>)>,
    /// Each source's admitted total in the unit (samples, or tokens), and its admitted tokens.
    totals: Vec<u64>,
    tokens: Vec<u64>,
    pub(crate) quotas: Vec<Quota>,
    /// Rows no source admits (`oversize="skip"`).
    pub(crate) skipped: u64,
    /// The admitted rows in groups, what every epoch selects from (`select.rs`).
    pub(crate) groups: Groups,
    seed: u64,
}

impl Mix {
    /// Checks `mixture` against `lengths` (admitting a length where `admits` says) and sets every
    /// source's quota; a source too small for its weight under the cap is refused, naming it.
    /// Its rows are grouped per source, in orders seeded by `seed` ([`Mix::regroup`] groups them by
    /// bucket too).
    pub(crate) fn new<L: Length>(
        mixture: Mixture,
        lengths: &[L],
        admits: impl Fn(u32) -> bool,
        seed: u64,
        pool: Option<&rayon::ThreadPool>,
    ) -> Result<Self> {
        mixture.validate(lengths.len())?;
        let bounds = mixture.bounds();
        let sources = mixture.sources.len();
        let every = lengths.iter().all(|&l| admits(l.into()));
        let admitted = (!every).then(|| {
            let mut rows = Vec::new();
            let mut starts = vec![0usize];
            for s in 0..sources {
                let range = bounds[s]..bounds[s + 1];
                rows.extend(range.filter(|&r| admits(lengths[r as usize].into())));
                starts.push(rows.len());
            }
            (rows, starts)
        });
        let mut mix = Self {
            spec: mixture,
            bounds,
            admitted,
            totals: Vec::with_capacity(sources),
            tokens: Vec::with_capacity(sources),
            quotas: Vec::new(),
            skipped: 0,
            groups: Groups::empty(),
            seed,
        };
        if let Some((rows, _)) = &mix.admitted {
            mix.skipped = (lengths.len() - rows.len()) as u64;
        }
        for s in 0..sources {
            let own = mix.rows_of(s);
            let (tokens, samples) = (own.tokens(lengths), own.len() as u64);
            mix.tokens.push(tokens);
            mix.totals.push(match mix.spec.unit {
                Unit::Samples => samples,
                Unit::Tokens => tokens,
            });
        }
        mix.quotas = mix.apportion()?;
        let groups = Groups::new(sources, |s| mix.rows_of(s), lengths, seed, pool);
        mix.groups = groups;
        Ok(mix)
    }

    /// Source `s`'s admitted rows: its whole range, or the listed ones when some are left out.
    pub(crate) fn rows_of(&self, s: usize) -> Own<'_> {
        match &self.admitted {
            Some((rows, starts)) => Own::List(&rows[starts[s]..starts[s + 1]]),
            None => Own::Range(self.bounds[s], self.bounds[s + 1]),
        }
    }

    /// Groups the rows by bucket (`bucket_of(length)`, below `buckets`) inside each source.
    pub(crate) fn regroup(&mut self, buckets: usize, bucket_of: impl Fn(u32) -> usize) {
        let groups = std::mem::replace(&mut self.groups, Groups::empty());
        self.groups = groups.by_bucket(buckets, bucket_of);
    }

    /// The selection of forming key `key` (`select.rs`).
    pub(crate) fn select(&self, key: u64) -> Selection {
        self.groups.select(self, self.seed, key)
    }

    /// The rows of forming key `key`'s selection (repeated where a source is up-sampled).
    pub(crate) fn population(&self, key: u64) -> Vec<u32> {
        self.groups.rows(&self.select(key))
    }

    /// Which source each row is of, for forming to choose batches by (`choose.rs`).
    pub(crate) fn labels(&self) -> Labels {
        let tokens = self.spec.unit == Unit::Tokens;
        Labels {
            bounds: self.bounds.clone(),
            tokens,
        }
    }

    /// Sources in the mixture.
    pub(crate) fn len(&self) -> usize {
        self.bounds.len() - 1
    }

    /// Every source's share of an epoch by largest remainder (the shares add up to the epoch's size
    /// exactly; ties go to the earlier source), checked against the cap.
    fn apportion(&self) -> Result<Vec<Quota>> {
        let size = self
            .spec
            .epoch_size
            .unwrap_or_else(|| self.totals.iter().sum());
        let weights: Vec<f64> = self.spec.sources.iter().map(|s| s.weight).collect();
        let shares = largest_remainder(size, &weights);
        let mut quotas = Vec::with_capacity(shares.len());
        for (s, &share) in shares.iter().enumerate() {
            let total = self.totals[s];
            // Repeat counts stay far below 2^53; the ratio only decides the refusal and the message.
            #[allow(clippy::cast_precision_loss)]
            let repeats = if total == 0 {
                f64::INFINITY
            } else {
                share as f64 / total as f64
            };
            if share > 0 && repeats > self.spec.max_repeat {
                let source = &self.spec.sources[s];
                return Err(ErrorKind::SourceTooSmall {
                    source: source.name.clone(),
                    weight: format!("{:?}", source.weight),
                    total,
                    share,
                    tokens: self.spec.unit == Unit::Tokens,
                    max_repeat: format!("{:?}", self.spec.max_repeat),
                }
                .into());
            }
            quotas.push(match share.checked_div(total) {
                Some(copies) => Quota {
                    copies,
                    rest: share % total,
                },
                None => Quota { copies: 0, rest: 0 },
            });
        }
        Ok(quotas)
    }
}

/// `size` split by `weights` (summing to about 1) into integers that add up to `size` exactly: each
/// gets the floor of its exact share, and what is left goes one apiece to the largest remainders
/// (ties to the earlier weight).
pub(crate) fn largest_remainder(size: u64, weights: &[f64]) -> Vec<u64> {
    let sum: f64 = weights.iter().sum();
    // Sizes stay far below 2^53 in practice; above, the shares are still integers adding up to `size`.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let (mut shares, remainders): (Vec<u64>, Vec<f64>) = weights
        .iter()
        .map(|&w| {
            let exact = size as f64 * (w / sum);
            let floor = (exact.floor() as u64).min(size);
            (floor, exact - floor as f64)
        })
        .unzip();
    let given: u64 = shares.iter().sum();
    let mut left = size.saturating_sub(given);
    let mut ranked: Vec<usize> = (0..weights.len()).filter(|&i| weights[i] > 0.0).collect();
    ranked.sort_by(|&a, &b| remainders[b].total_cmp(&remainders[a]).then(a.cmp(&b)));
    for &i in ranked.iter().cycle().take(ranked.len().max(1) * 2) {
        if left == 0 {
            break;
        }
        shares[i] += 1;
        left -= 1;
    }
    shares
}

#[cfg(test)]
mod tests;

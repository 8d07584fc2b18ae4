//! What the planner derives from a mixture once: each source's admitted rows, and its quota of every
//! epoch (whole copies plus a slice of its cycle) by largest remainder, checked against the cap.

use crate::error::{ErrorKind, Result};
use crate::lengths::Length;
use crate::plan::mixture::slices::{fixed_slices, Quota, Slice, Walk};
use crate::plan::mixture::{Groups, Labels, Mixture, Selection, Unit};

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
    pub(super) totals: Vec<u64>,
    pub(super) tokens: Vec<u64>,
    /// Epoch 0's quotas (every epoch's without a schedule).
    pub(crate) quotas: Vec<Quota>,
    /// Where each epoch's slices start in its sources' cycles, with a schedule (`slices.rs`).
    walk: Option<Walk>,
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
            walk: None,
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
        let first = mix.spec.weights_at(0);
        mix.quotas = mix.apportion_checked(&first, None)?;
        if let Some(schedule) = &mix.spec.schedule {
            // Each epoch's weights checked once: a constant stretch reuses the quotas before it.
            let mut last = (first, mix.quotas.clone());
            let walk = Walk::new(schedule.span(), &mix.totals, |epoch| {
                let weights = mix.spec.weights_at(epoch);
                if weights != last.0 {
                    let quotas = mix.apportion_checked(&weights, Some(epoch))?;
                    last = (weights, quotas);
                }
                Ok(last.1.clone())
            })?;
            mix.walk = Some(walk);
        }
        let groups = Groups::new(sources, |s| mix.rows_of(s), lengths, seed, pool);
        mix.groups = groups;
        Ok(mix)
    }

    /// Every source's slice of the epoch keyed `key` (`slices.rs`).
    pub(crate) fn slices(&self, key: u64) -> Vec<Slice> {
        match &self.walk {
            None => fixed_slices(&self.quotas, &self.totals, key),
            Some(walk) => walk.slices(key, &self.totals, |epoch| {
                self.apportion(&self.spec.weights_at(epoch))
            }),
        }
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

    /// Every source's share of an epoch of `weights` by largest remainder (the shares add up to the
    /// epoch's size exactly; ties go to the earlier source).
    fn shares(&self, weights: &[f64]) -> Vec<u64> {
        let size = self
            .spec
            .epoch_size
            .unwrap_or_else(|| self.totals.iter().sum());
        largest_remainder(size, weights)
    }

    /// Every source's quota of an epoch of `weights`: its share as whole copies and a rest.
    pub(super) fn apportion(&self, weights: &[f64]) -> Vec<Quota> {
        self.quotas_of(&self.shares(weights))
    }

    fn quotas_of(&self, shares: &[u64]) -> Vec<Quota> {
        let shares = shares.iter().zip(&self.totals);
        shares
            .map(|(&share, &total)| match share.checked_div(total) {
                Some(copies) => Quota {
                    copies,
                    rest: share % total,
                },
                None => Quota { copies: 0, rest: 0 },
            })
            .collect()
    }

    /// [`Mix::apportion`], refused where a source's share asks for more than the cap (naming it, its
    /// weight and, with a schedule, the `epoch`).
    fn apportion_checked(&self, weights: &[f64], epoch: Option<u64>) -> Result<Vec<Quota>> {
        let shares = self.shares(weights);
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
                let weight = match epoch {
                    Some(epoch) => format!("{:?} at epoch {epoch}", weights[s]),
                    None => format!("{:?}", weights[s]),
                };
                return Err(ErrorKind::SourceTooSmall {
                    source: self.spec.sources[s].name.clone(),
                    weight,
                    total,
                    share,
                    tokens: self.spec.unit == Unit::Tokens,
                    max_repeat: format!("{:?}", self.spec.max_repeat),
                }
                .into());
            }
        }
        Ok(self.quotas_of(&shares))
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

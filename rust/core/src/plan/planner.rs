//! Lengths + configuration → the [`Plan`] of one epoch: the pipeline, called in order from
//! [`Planner::new`] (once) and [`Planner::plan`] (per epoch). Each stage is a module that takes plain
//! data and hands the next one a typed value; none calls back up.
//!
//! Once per planner:
//!
//! 0. **Admit** (`prepare.rs` → `Prepared`; a mixture's sources: `mixture/planning.rs`): lengths and
//!    configuration checked, oversize samples admitted, cut into pieces (`truncate.rs`) or refused,
//!    bucket edges chosen (`optimize.rs`), per-length rules derived (`rules.rs`).
//!
//! Per epoch, for `(seed, epoch)`:
//!
//! 1. **Select** (`draws.rs` → `Population`): every admitted row, or a mixture's selection for the
//!    epoch (`mixture/select.rs`), keyed by the epoch (`keys.rs`).
//! 2. **Form and order** (`form/` → `Epoch`): shuffled padded epochs of up to 16.7M samples shuffle
//!    every bucket with its own stream and cut it front to back (`form/by_bucket.rs`); larger epochs
//!    and packed ones draw a uniformly random permutation of all rows (`permute.rs`) and stream it
//!    through the open batches of every bucket (`form/stream.rs`); unshuffled plans sort rows by
//!    length (evaluation). Every path cuts with the one rule of `form/rule.rs`. Each forming group's
//!    batches are ordered so every accumulation window mixes lengths (`arrange.rs`; a mixture's
//!    sources: `form/choose.rs`) and its windows' ranks balanced by cost (`balance.rs`) while the
//!    group's rows are in cache; under `trim_steps` each step is trimmed to a common cost
//!    (`form/trim.rs`). The epoch is formed within the batch count every epoch shares (`steps.rs` →
//!    `FormedEpoch`), from other draws of it when its own form too many.
//! 3. **Split for ranks** (`ranks.rs`, with `split.rs`): the count reached by splitting tail batches
//!    (or dropping them under `drop_last`), and the ranks balanced.
//! 4. **Output** (`output.rs`): the [`Plan`] and its [`Stats`].
//!
//! Above the pipeline, built on a planner: resuming on another number of ranks (`resume.rs`) and one
//! plan per machine (`shared/`).
//!
//! Properties. Each bucket's members are in a uniformly random order every epoch, so batch
//! membership is reshuffled every epoch. Every random draw comes from a stream owned by one unit of
//! work (a bucket, a group, a block of windows), so the plan is bit-identical for any thread count.

use crate::error::Result;
use crate::lengths::{with_lengths, Length, Lengths};
use crate::memory;
use crate::plan::buckets::Buckets;
use crate::plan::config::{Config, Mode};
use crate::plan::draws::{Draws, Population};
use crate::plan::form::{ByBucket, Former, ARRANGE_MAX_SAMPLES, COMPANION_MIN_SAMPLES};
use crate::plan::mixture::{prepare_mixture, Labels, Mix, Mixture};
use crate::plan::output::Plan;
use crate::plan::prepare::{prepare, Prepared};
use crate::plan::ranks::{split_for_ranks, Totals};
use crate::plan::steps::{form_within, target_batches, StepCount};
use crate::plan::truncate::{cut_long, dataset_lengths, locate, Later};
use crate::pool::PrivatePool;
use std::sync::OnceLock;

/// Plans epochs of one dataset under one configuration. Construction does the epoch-independent
/// work (validation, edges, the bucket lookup table); [`Planner::plan`] does the rest.
#[derive(Debug)]
pub struct Planner {
    lengths: Lengths,
    config: Config,
    /// What the admit stage found: the bucket edges, the per-length rules, each bucket's row
    /// capacity, the samples and tokens admitted (every admitted sample is in every plan, less
    /// `drop_last`'s), the shortest admitted length and the most batches one forming pass can close
    /// (what the first plan reserves for, before the batch count is known).
    prepared: Prepared,
    companion_min: usize,
    general_only: bool,
    /// Admitted rows by bucket, for shuffled padded epochs up to `ARRANGE_MAX_SAMPLES`
    /// (`by_bucket.rs`); `None` streams the epoch instead (`form/stream.rs`).
    by_bucket: Option<ByBucket>,
    /// Batches of every epoch's plan (see [`Planner::steps`]), set by the first plan or query.
    target: OnceLock<usize>,
    /// [`Planner::fingerprint`], hashed once (a pass over every length).
    pub(super) fingerprint: OnceLock<u64>,
    /// Under `Oversize::Truncate`, the later pieces of the samples split (`truncate.rs`); the lengths
    /// are then the planned entries' lengths.
    later: Option<Later>,
    /// The sources of a mixture and their quotas (`mixture/`): every epoch then plans the rows it
    /// selects, with batches chosen for their sources (`mixture/`).
    pub(super) mix: Option<Mix>,
    /// Which source each row is of, when forming chooses batches for sources: a mixture's, or the
    /// part of one a re-planned epoch holds (`resume.rs`).
    pub(super) labels: Option<Labels>,
    /// Epoch size up to which batches are arranged and balanced (`ARRANGE_MAX_SAMPLES`).
    arrange_max: usize,
    pool: PrivatePool,
}

impl Planner {
    /// Validates `lengths` and `config` and prepares the buckets. `lengths` may be a `Vec<u32>`
    /// (stored as `u16` when every length fits) or [`Lengths`] built by a binding.
    /// Under `Oversize::Truncate` long samples are planned as pieces (see [`Planner::locate`]).
    pub fn new(lengths: impl Into<Lengths>, config: Config) -> Result<Self> {
        config.validate()?;
        let (lengths, later) = cut_long(lengths.into(), &config)?;
        memory::reserve(
            "preparing the planner",
            lengths.len() as u64 * memory::PREPARE_BYTES_PER_SAMPLE,
        )?;
        let prepared = with_lengths!(&lengths, v => prepare(v, &config))?;
        Ok(Self::assemble(lengths, config, prepared, later, None))
    }

    /// Plans epochs of `mixture`'s sources, whose lengths are `lengths` concatenated in the mixture's
    /// order (see `mixture/planning.rs`). Indices of the plans are rows of the concatenation,
    /// repeated where a source is up-sampled.
    pub fn with_mixture(
        lengths: impl Into<Lengths>,
        config: Config,
        mixture: Mixture,
    ) -> Result<Self> {
        let lengths: Lengths = lengths.into();
        let (prepared, mix) = prepare_mixture(&lengths, &config, mixture)?;
        Ok(Self::assemble(lengths, config, prepared, None, Some(mix)))
    }

    /// The planner of prepared lengths (and of a mixture's sources, when `mix` is given).
    fn assemble(
        lengths: Lengths,
        config: Config,
        prepared: Prepared,
        later: Option<Later>,
        mix: Option<Mix>,
    ) -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
        // A mixture's epochs group the rows they select (`mixture/planning.rs`).
        let by_bucket = (mix.is_none()
            && config.shuffle
            && config.mode == Mode::Padded
            && lengths.len() <= ARRANGE_MAX_SAMPLES)
            .then(|| {
                let buckets = prepared.buckets.count();
                with_lengths!(&lengths, v => ByBucket::new(v, &prepared.rules, buckets))
            });
        Self {
            lengths,
            config,
            prepared,
            companion_min: COMPANION_MIN_SAMPLES,
            general_only: false,
            by_bucket,
            target: OnceLock::new(),
            fingerprint: OnceLock::new(),
            later,
            labels: mix.as_ref().map(Mix::labels),
            arrange_max: ARRANGE_MAX_SAMPLES,
            mix,
            pool: PrivatePool::new(threads),
        }
    }

    // -- the pipeline, per epoch -------------------------------------------------------------------

    /// Plans `epoch`: every batch of every rank, in training order (the stages: module docs).
    pub fn plan(&self, epoch: u64) -> Result<Plan> {
        self.lengths.check()?;
        with_lengths!(&self.lengths, v => self.plan_with(v, epoch))
    }

    /// [`Planner::plan`] for one storage width of the lengths.
    fn plan_with<L: Length>(&self, lengths: &[L], epoch: u64) -> Result<Plan> {
        memory::reserve("planning an epoch", self.plan_bytes())?;
        let pool = self.pool.get();
        let draws = self.draws(lengths, pool.as_deref());
        let formed = form_within(&draws, &self.step_count(), epoch)?;
        let target = target_batches(&draws, &self.step_count(), None);
        let totals = Totals {
            admitted_tokens: self.prepared.admitted_tokens,
            skipped: self.skipped(),
            buckets: self.prepared.buckets.count() as u64,
        };
        let ranks = (self.arranged(), pool.as_deref());
        split_for_ranks(
            (lengths, &self.config),
            formed,
            target,
            ranks,
            &totals,
            epoch,
        )
    }

    /// What every draw of an epoch borrows: the forming state and the rows it selects from.
    fn draws<'a, L: Length>(
        &'a self,
        lengths: &'a [L],
        pool: Option<&'a rayon::ThreadPool>,
    ) -> Draws<'a, L> {
        let former = Former {
            lengths,
            config: &self.config,
            rules: &self.prepared.rules,
            bucket_capacity: &self.prepared.bucket_capacity,
            companion_min: self.companion_min,
            general_only: self.general_only,
            shortest: self.prepared.shortest,
            arranged: self.arranged(),
            labels: self.labels.as_ref(),
        };
        let population = match (&self.mix, &self.by_bucket) {
            (Some(mix), _) => Population::Mixture(mix),
            (None, Some(rows)) => Population::ByBucket(rows),
            (None, None) if self.config.shuffle => Population::Streamed,
            (None, None) => Population::Sorted,
        };
        Draws {
            former,
            population,
            pool,
        }
    }

    fn step_count(&self) -> StepCount<'_> {
        StepCount {
            target: &self.target,
            admitted: self.prepared.admitted,
        }
    }

    /// Steps per rank of every epoch: the same for every epoch of this configuration and data.
    pub fn steps(&self) -> u64 {
        let pool = self.pool.get();
        let target = with_lengths!(&self.lengths, v => {
            target_batches(&self.draws(v, pool.as_deref()), &self.step_count(), None)
        });
        target as u64 / u64::from(self.config.world_size)
    }

    /// Bytes an epoch's planning allocates at its peak, at most (`tests/memory_peaks.rs` holds every
    /// path to it): see [`memory::plan_bytes`].
    pub fn plan_bytes(&self) -> u64 {
        memory::plan_bytes(memory::EpochShape {
            samples: self.epoch_samples() as u64,
            by_bucket: self.by_bucket.is_some(),
            mixture: self.mix.is_some(),
            arranged: self.arranged(),
            batch_bound: self.prepared.batch_bound,
            world_size: self.config.world_size,
            target: self.target.get().copied(),
        })
    }

    /// The most batches one forming pass over these lengths can close (what the first plan reserves
    /// working memory for, twice over, before an epoch has set the batch count): see `prepare.rs`.
    pub fn batch_bound(&self) -> u64 {
        self.prepared.batch_bound
    }

    /// The rows epoch `epoch`'s own draws select (the population the plan of an epoch carrying rows
    /// from the one before starts from), or every row without a mixture.
    pub(crate) fn selected_rows(&self, epoch: u64) -> Vec<u32> {
        match &self.mix {
            Some(mix) => mix.population(epoch),
            // `Planner::new` refused more rows than a u32 index addresses.
            #[allow(clippy::cast_possible_truncation)]
            None => (0..self.lengths.len() as u32).collect(),
        }
    }

    // -- answers ------------------------------------------------------------------------------------

    /// Rows left out of every plan for not fitting a batch (`oversize="skip"`).
    fn skipped(&self) -> u64 {
        match &self.mix {
            Some(mix) => mix.skipped,
            None => self.lengths.len() as u64 - self.prepared.admitted,
        }
    }

    /// Samples an epoch plans: the admitted rows, or a mixture's reference selection (epoch 0's).
    fn epoch_samples(&self) -> usize {
        match &self.mix {
            Some(_) => usize::try_from(self.prepared.admitted).unwrap_or(usize::MAX),
            None => self.lengths.len(),
        }
    }

    /// Uses `threads` worker threads (1 = plan on the calling thread). The plan does not change.
    #[must_use]
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.pool = PrivatePool::new(threads);
        self
    }

    /// Forms every epoch with the general loop instead of the table-driven one (a speed trade that
    /// never changes the plan; exposed so tests can prove that). Only streamed epochs have the choice:
    /// see [`Planner::with_streamed_epochs`].
    #[doc(hidden)]
    #[must_use]
    pub fn with_general_stream(mut self) -> Self {
        self.general_only = true;
        self
    }

    /// Streams shuffled epochs (`form/stream.rs`), as epochs past `ARRANGE_MAX_SAMPLES` samples always
    /// do, instead of forming them bucket by bucket (`by_bucket.rs`): exposed so tests can check the
    /// stream's loops on small inputs.
    #[doc(hidden)]
    #[must_use]
    pub fn with_streamed_epochs(mut self) -> Self {
        self.by_bucket = None;
        self
    }

    /// Forms epochs past `samples` samples as huge ones are formed (unarranged, in formation
    /// order), so tests reach that path on small inputs.
    #[doc(hidden)]
    #[must_use]
    pub fn with_arrange_limit(mut self, samples: usize) -> Self {
        self.arrange_max = samples;
        self.by_bucket = self.by_bucket.filter(|_| self.lengths.len() <= samples);
        self
    }

    /// Whether epochs are small enough to arrange and balance their batches.
    pub(crate) fn arranged(&self) -> bool {
        self.epoch_samples() <= self.arrange_max
    }

    /// Carries lengths through the permutation from `samples` on (a speed/memory trade that never
    /// changes the plan; exposed so tests can prove that on small inputs).
    #[doc(hidden)]
    #[must_use]
    pub fn with_companion_threshold(mut self, samples: usize) -> Self {
        self.companion_min = samples;
        self
    }

    /// The bucket edges in use.
    pub fn buckets(&self) -> &Buckets {
        &self.prepared.buckets
    }

    /// The padding efficiency plans are predicted to measure with the chosen edges (see
    /// `optimize.rs`); within a point of the measured one on the seed workload.
    pub fn predicted_efficiency(&self) -> f64 {
        self.prepared.predicted_efficiency
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The mixture whose sources this planner plans, if any.
    pub fn mixture(&self) -> Option<&crate::plan::mixture::Mixture> {
        self.mix.as_ref().map(|mix| &mix.spec)
    }

    /// The lengths of the planned entries: the samples' (under `Oversize::Truncate`, every row's
    /// first piece, then the later pieces; [`Planner::dataset_lengths`] gives the rows').
    pub fn lengths(&self) -> &Lengths {
        &self.lengths
    }

    /// Rows of the dataset: the planned entries less the later pieces of split samples.
    pub fn samples(&self) -> usize {
        self.lengths.len() - self.later.as_ref().map_or(0, |l| l.rows.len())
    }

    /// Samples split into pieces (`Oversize::Truncate`; else 0).
    pub fn truncated(&self) -> u64 {
        self.later.as_ref().map_or(0, |l| l.split)
    }

    /// The token windows `(rows, starts, lengths)` of `entries` of this planner's plans (see
    /// [`locate`]).
    pub fn locate(&self, entries: &[i64]) -> Result<(Vec<u32>, Vec<u32>, Vec<u32>)> {
        self.lengths.check()?;
        let later = self.later.as_ref().map(|l| (&l.rows[..], &l.starts[..]));
        with_lengths!(&self.lengths, v => locate(entries, self.samples(), v, later))
    }

    /// The dataset rows' lengths (what the planner was built from): the planned lengths, with each
    /// split row's pieces summed back under `Oversize::Truncate`.
    pub fn dataset_lengths(&self) -> Result<Vec<u32>> {
        self.lengths.check()?;
        dataset_lengths(&self.lengths, self.samples(), self.later.as_ref())
    }
}

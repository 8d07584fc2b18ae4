//! Lengths + configuration → the [`Plan`] of one epoch: the pipeline, called in order from
//! [`Planner::new`] (once) and [`Planner::plan`] (per epoch).
//!
//! Once per planner:
//!
//! 0. **Admit** (`prepare.rs`): lengths and configuration checked, oversize samples admitted or
//!    refused, bucket edges chosen (`optimize.rs`), per-length rules derived (`rules.rs`).
//!
//! Per epoch, for `(seed, epoch)`:
//!
//! 1. **Shuffle and form** (`form/`): shuffled padded epochs of up to 16.7M samples shuffle every
//!    bucket with its own stream and cut it front to back (`form/by_bucket.rs`); larger epochs and
//!    packed ones draw a uniformly random permutation of all rows (`permute.rs`) and stream it
//!    through the open batches of every bucket (`form/stream.rs`); unshuffled plans sort rows by
//!    length (evaluation). Every path cuts with the one rule of `form/rule.rs`.
//! 2. **Order** each forming group's batches so every accumulation window mixes lengths
//!    (`arrange.rs`), and **balance** its windows' ranks by cost (`balance.rs`), while the group's
//!    rows are in cache; under `trim_steps`, trim each step's batches to a common cost and re-form
//!    the rows trimmed into extra windows (`form/trim.rs`).
//! 3. **Split for ranks** (`split.rs`): bring the batch count to the epoch's target, the same for
//!    every epoch (`steps.rs`), by splitting tail batches (or dropping them under `drop_last`), and
//!    balance the tail.
//! 4. **Assemble** the [`Plan`] and its [`Stats`] (`output.rs`).
//!
//! A checkpoint resumed on another number of ranks re-plans the rest of its epoch (`resume.rs`).
//!
//! Properties. Each bucket's members are in a uniformly random order every epoch, so batch
//! membership is reshuffled every epoch. Every random draw comes from a stream owned by one unit of
//! work (a bucket, a group, a block of windows), so the plan is bit-identical for any thread count.

use crate::error::Result;
use crate::lengths::{with_lengths, Lengths};
use crate::memory;
use crate::plan::buckets::Buckets;
use crate::plan::config::{Config, Mode};
use crate::plan::form::{ByBucket, ARRANGE_MAX_SAMPLES, COMPANION_MIN_SAMPLES};
use crate::plan::mixture::{Labels, Mix};
use crate::plan::prepare::{prepare, Prepared};
use crate::plan::rules::Rules;
use crate::plan::truncate::{cut_long, Later};
use crate::pool::PrivatePool;
use std::sync::OnceLock;

/// Plans epochs of one dataset under one configuration. Construction does the epoch-independent
/// work (validation, edges, the bucket lookup table); [`Planner::plan`] does the rest.
#[derive(Debug)]
pub struct Planner {
    pub(super) lengths: Lengths,
    pub(super) config: Config,
    pub(super) buckets: Buckets,
    /// The padding efficiency the plans are predicted to have (see `optimize.rs`).
    predicted_efficiency: f64,
    pub(super) rules: Rules,
    /// Per bucket, the most rows any batch of it can hold (the capacity at its shortest length):
    /// a batch that reaches it is full.
    pub(super) bucket_capacity: Vec<u32>,
    pub(super) admitted: u64,
    /// Sum of the admitted lengths: every admitted sample is in every plan (less `drop_last`'s).
    pub(super) admitted_tokens: u64,
    /// The shortest admitted length.
    pub(super) shortest: u32,
    /// The most batches one forming pass can close (see `prepare.rs`): what the first plan reserves
    /// for, before the batch count is known.
    pub(super) batch_bound: u64,
    pub(super) companion_min: usize,
    pub(super) general_only: bool,
    /// Admitted rows by bucket, for shuffled padded epochs up to `ARRANGE_MAX_SAMPLES`
    /// (`by_bucket.rs`); `None` streams the epoch instead (`form/stream.rs`).
    pub(super) by_bucket: Option<ByBucket>,
    /// Batches of every epoch's plan (see [`Planner::steps`]), set by the first plan or query.
    pub(super) target: OnceLock<usize>,
    /// [`Planner::fingerprint`], hashed once (a pass over every length).
    pub(super) fingerprint: OnceLock<u64>,
    /// Under `Oversize::Truncate`, the later pieces of the samples split (`truncate.rs`); the lengths
    /// are then the planned entries' lengths.
    pub(super) later: Option<Later>,
    /// The sources of a mixture and their quotas (`mixture/`): every epoch then plans the rows it
    /// selects, with batches chosen for their sources (`mixture/`).
    pub(super) mix: Option<Mix>,
    /// Which source each row is of, when forming chooses batches for sources: a mixture's, or the
    /// part of one a re-planned epoch holds (`resume.rs`).
    pub(super) labels: Option<Labels>,
    /// Epoch size up to which batches are arranged and balanced (`ARRANGE_MAX_SAMPLES`).
    arrange_max: usize,
    pub(super) pool: PrivatePool,
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

    /// The planner of prepared lengths (and of a mixture's sources, when `mix` is given).
    pub(super) fn assemble(
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
            buckets: prepared.buckets,
            predicted_efficiency: prepared.predicted_efficiency,
            rules: prepared.rules,
            bucket_capacity: prepared.bucket_capacity,
            admitted: prepared.admitted,
            admitted_tokens: prepared.admitted_tokens,
            shortest: prepared.shortest,
            batch_bound: prepared.batch_bound,
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

    /// Rows left out of every plan for not fitting a batch (`oversize="skip"`).
    pub(super) fn skipped(&self) -> u64 {
        match &self.mix {
            Some(mix) => mix.skipped,
            None => self.lengths.len() as u64 - self.admitted,
        }
    }

    /// Samples an epoch plans: the admitted rows, or a mixture's reference selection (epoch 0's).
    pub(super) fn epoch_samples(&self) -> usize {
        match &self.mix {
            Some(_) => usize::try_from(self.admitted).unwrap_or(usize::MAX),
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
    pub(super) fn arranged(&self) -> bool {
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
        &self.buckets
    }

    /// The padding efficiency plans are predicted to measure with the chosen edges (see
    /// `optimize.rs`); within a point of the measured one on the seed workload.
    pub fn predicted_efficiency(&self) -> f64 {
        self.predicted_efficiency
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
}

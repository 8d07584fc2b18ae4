//! Lengths + configuration → the [`Plan`] of one epoch.
//!
//! Per epoch, for `(seed, epoch)`:
//!
//! 1. **Shuffle and form.** Shuffled padded epochs of up to 16.7M samples shuffle every bucket with
//!    its own stream and cut it into batches front to back (`by_bucket.rs`); larger epochs,
//!    and packed ones, draw a uniformly random permutation of all rows ([`crate::permute`]) and
//!    stream it once through the open batches of every bucket (`form.rs`), which needs no
//!    buffer beyond the plan's. Unshuffled plans sort rows by length instead (evaluation).
//! 2. **Order** the batches so every accumulation window mixes lengths (`stratify.rs`), per
//!    forming group.
//! 3. **Balance ranks**: match each step's batches by cost (`balance.rs`), and bring the batch
//!    count to the epoch's target ([`crate::order`]).
//!
//! **Every epoch has the same steps** ([`Planner::steps`]): trainers and LR schedules read the count
//! once. Under a token budget the count an epoch forms scatters with its shuffle — by a few batches
//! with narrow buckets, by tens with the seed's 6 wide ones (measured) — so the target is set once:
//! epoch 0's draws and three calibration draws are formed, and the target is the largest count plus
//! their standard deviation (about two deviations above the mean), rounded up to a multiple of
//! `world_size`. A fixed margin of 0.02·√batches sent 7 of 8 epochs with 6 buckets back for more
//! draws (3× the planning time) and one to epoch 0's draws. An epoch
//! that forms fewer batches splits some; one that forms more is formed again from other keyed draws
//! of the same epoch (each exceeds with probability well under a half), and after
//! 16 attempts from epoch 0's draws, which form exactly the reference count — so the loop
//! ends and no sample is ever repeated or dropped. Rejected: an analytic worst-case count (a bucket's
//! batches all cut at the rows its top edge allows), which would split batches in every epoch to
//! reach a count no shuffle forms.
//!
//! Properties. Each bucket's members are in a uniformly random order every epoch, so batch
//! membership is reshuffled every epoch. Every random draw comes from a stream owned by one unit of
//! work (a bucket, a group, a block of windows), so the plan is bit-identical for any thread count.

use crate::balance::{balance_classes, match_windows, stream, Unit};
use crate::buckets::Buckets;
use crate::by_bucket::ByBucket;
pub use crate::config::{
    Batching, Boundaries, Config, CostModel, Mode, Order, Oversize, DEFAULT_TARGET_EFFICIENCY_PPM,
};
use crate::error::{ErrorKind, Result};
use crate::form::{sorted_by_length, Epoch, Former, ARRANGE_MAX_SAMPLES, COMPANION_MIN_SAMPLES};
use crate::lengths::{Length, Lengths};
use crate::memory;
use crate::optimize::{auto_edges, optimal_edges, predicted_efficiency, Histogram};
use crate::order::{drop_to, expand_per_batch, gather, reorder_region, split_to, to_usize};
use crate::plan::{Plan, Stats};
use crate::pool::PrivatePool;
use crate::rng::Pcg64;
use crate::rules::Rules;
use crate::with_lengths;
use std::sync::OnceLock;

/// The draws that set every epoch's batch count: epoch 0's.
const REFERENCE_KEY: u64 = 0;

/// Other draws of an epoch tried when its own form more batches than the target (each does with a
/// probability well under a half: the margin is set for that), before the reference draws.
const REFORM_ATTEMPTS: u64 = 16;

/// The key of the `attempt`-th other draw of `epoch` (attempt 0 is the epoch's own).
fn reform_key(epoch: u64, attempt: u64) -> u64 {
    epoch.wrapping_add(attempt.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Other draws formed once, besides epoch 0's, to measure how much the count scatters (epochs up to
/// `ARRANGE_MAX_SAMPLES` samples; each costs one forming pass, once per planner).
const CALIBRATION_DRAWS: u64 = 3;

/// The key of the `i`-th calibration draw (none is an epoch's own or retry draw in practice).
fn calibration_key(i: u64) -> u64 {
    reform_key(REFERENCE_KEY, REFORM_ATTEMPTS + i)
}

/// The batches of every epoch from the counts the reference and calibration draws formed: above the
/// largest by their standard deviation (about two standard deviations above the mean), a multiple of
/// the ranks, split up to it; under `drop_last` below the smallest by as much, the rest dropped.
/// Without calibration draws (huge epochs), `√batches / 20` stands in for the deviation (~0.02·√batches
/// was measured on the seed workload with narrow buckets).
fn steps_target(counts: &[usize], config: &Config) -> usize {
    let world = config.world_size as usize;
    let (lo, hi) = (
        counts.iter().min().copied().unwrap_or(0),
        counts.iter().max().copied().unwrap_or(0),
    );
    let margin = if counts.len() > 1 {
        // Counts are far below 2^53; the deviation only sizes a margin.
        #[allow(clippy::cast_precision_loss)]
        let (n, mean) = (
            counts.len() as f64,
            counts.iter().sum::<usize>() as f64 / counts.len() as f64,
        );
        #[allow(clippy::cast_precision_loss)]
        let variance = counts
            .iter()
            .map(|&c| (c as f64 - mean).powi(2))
            .sum::<f64>()
            / n;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let margin = variance.sqrt().ceil() as usize;
        margin
    } else {
        hi.isqrt() / 20
    };
    if config.drop_last {
        let steps = lo.saturating_sub(margin) / world;
        return if steps == 0 { lo / world } else { steps } * world;
    }
    (hi + margin).next_multiple_of(world)
}

/// Plans epochs of one dataset under one configuration. Construction does the epoch-independent
/// work (validation, edges, the bucket lookup table); [`Planner::plan`] does the rest.
#[derive(Debug)]
pub struct Planner {
    lengths: Lengths,
    config: Config,
    buckets: Buckets,
    /// The padding efficiency the plans are predicted to have (see `optimize.rs`).
    predicted_efficiency: f64,
    rules: Rules,
    /// Per bucket, the most rows any batch of it can hold (the capacity at its shortest length):
    /// a batch that reaches it is full.
    bucket_capacity: Vec<u32>,
    admitted: u64,
    /// Sum of the admitted lengths: every admitted sample is in every plan (less `drop_last`'s).
    admitted_tokens: u64,
    /// The shortest admitted length.
    shortest: u32,
    companion_min: usize,
    general_only: bool,
    /// Admitted rows by bucket, for shuffled padded epochs up to `ARRANGE_MAX_SAMPLES`
    /// (`by_bucket.rs`); `None` streams the epoch instead (`form.rs`).
    by_bucket: Option<ByBucket>,
    /// Batches of every epoch's plan (see [`Planner::steps`]), set by the first plan or query.
    target: OnceLock<usize>,
    pool: PrivatePool,
}

impl Planner {
    /// Validates `lengths` and `config` and prepares the buckets. `lengths` may be a `Vec<u32>`
    /// (stored as `u16` when every length fits) or [`Lengths`] built by a binding.
    pub fn new(lengths: impl Into<Lengths>, config: Config) -> Result<Self> {
        let lengths = lengths.into();
        config.validate()?;
        memory::reserve(
            "preparing the planner",
            lengths.len() as u64 * memory::PREPARE_BYTES_PER_SAMPLE,
        )?;
        let prepared = with_lengths!(&lengths, v => prepare(v, &config))?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
        let by_bucket =
            (config.shuffle && config.mode == Mode::Padded && lengths.len() <= ARRANGE_MAX_SAMPLES)
                .then(|| {
                    let buckets = prepared.buckets.count();
                    with_lengths!(&lengths, v => ByBucket::new(v, &prepared.rules, buckets))
                });
        Ok(Self {
            lengths,
            config,
            buckets: prepared.buckets,
            predicted_efficiency: prepared.predicted_efficiency,
            rules: prepared.rules,
            bucket_capacity: prepared.bucket_capacity,
            admitted: prepared.admitted,
            admitted_tokens: prepared.admitted_tokens,
            shortest: prepared.shortest,
            companion_min: COMPANION_MIN_SAMPLES,
            general_only: false,
            by_bucket,
            target: OnceLock::new(),
            pool: PrivatePool::new(threads),
        })
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

    /// Streams shuffled epochs (`form.rs`), as epochs past `ARRANGE_MAX_SAMPLES` samples always
    /// do, instead of forming them bucket by bucket (`by_bucket.rs`): exposed so tests can check the
    /// stream's loops on small inputs.
    #[doc(hidden)]
    #[must_use]
    pub fn with_streamed_epochs(mut self) -> Self {
        self.by_bucket = None;
        self
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
    /// [`crate::optimize`]); within a point of the measured one on the seed workload.
    pub fn predicted_efficiency(&self) -> f64 {
        self.predicted_efficiency
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The sample lengths.
    pub fn lengths(&self) -> &Lengths {
        &self.lengths
    }

    /// Fingerprint of the lengths and configuration (see [`crate::fingerprint`]).
    pub fn fingerprint(&self) -> u64 {
        with_lengths!(&self.lengths, v => crate::fingerprint::fingerprint(v, &self.config))
    }

    /// Fingerprint of the lengths and configuration as if for one rank: the same for any
    /// `world_size`, so a checkpoint can be resumed on another number of ranks.
    pub fn fingerprint_any_ranks(&self) -> u64 {
        let config = Config {
            world_size: 1,
            ..self.config.clone()
        };
        with_lengths!(&self.lengths, v => crate::fingerprint::fingerprint(v, &config))
    }

    /// Plans `epoch` over only the samples `rows` (row numbers of this planner's lengths), with this
    /// configuration: the rest of an epoch re-planned after a resume on another number of ranks.
    /// Indices are row numbers of the full lengths; buckets are chosen for the subset.
    pub fn plan_subset(&self, epoch: u64, rows: &[u32]) -> Result<Plan> {
        let n = self.lengths.len();
        if let Some(&row) = rows.iter().find(|&&r| r as usize >= n) {
            return Err(ErrorKind::RowOutOfRange {
                row: i128::from(row),
                rows: n as u64,
            }
            .into());
        }
        let lengths: Vec<u32> = with_lengths!(&self.lengths, v => lengths_of(v, rows));
        let sub = Planner::new(lengths, self.config.clone())?.plan(epoch)?;
        let (world_size, epoch) = (sub.world_size(), sub.epoch());
        let (offsets, mut indices, stats) = sub.into_parts();
        for index in &mut indices {
            *index = rows[*index as usize];
        }
        Ok(Plan::new(offsets, indices, world_size, epoch, stats))
    }

    /// Plans `epoch`: every batch of every rank, in training order.
    pub fn plan(&self, epoch: u64) -> Result<Plan> {
        with_lengths!(&self.lengths, v => self.plan_with(v, epoch))
    }

    /// [`Planner::plan`] for one storage width of the lengths.
    fn plan_with<L: Length>(&self, lengths: &[L], epoch: u64) -> Result<Plan> {
        memory::reserve(
            "planning an epoch",
            lengths.len() as u64 * memory::PLAN_BYTES_PER_SAMPLE,
        )?;
        let former = self.former(lengths);
        let (mut order, mut formed, key, reformed) = self.form_within(&former, epoch);
        let target = self.target_batches(&former, None);
        let world_size = self.config.world_size;
        let mut real_tokens = self.admitted_tokens;
        let cost = |members: &[u32]| self.cost(lengths, members);
        let mut split_batches = 0;
        let (mut dropped, mut dropped_batches) = (0, 0);
        if formed.offsets.len() - 1 > target {
            // Only drop_last keeps more than the target after forming.
            let gone = drop_to(&mut formed.offsets, &order, target, cost);
            let tail = &order[gone.rows.clone()];
            real_tokens -= tokens_of(lengths, tail);
            formed.padded_tokens -= gone.cost;
            (dropped, dropped_batches) = (tail.len() as u64, gone.batches);
            order.truncate(gone.rows.start);
            formed.cost.truncate(formed.offsets.len() - 1);
        } else {
            // Splits come from the tail, so the main batches' windows stay aligned (`Epoch`).
            let first = formed.tail_start;
            let split = split_to(&mut formed.offsets, &order, target, world_size, first, cost)?;
            formed.padded_tokens = formed.padded_tokens - split.before + split.after;
            split_batches = split.batches;
            // Costs exist only where batches are ordered and balanced (see `Formed::new`).
            if !formed.cost.is_empty() {
                expand_per_batch(&mut formed.cost, &split, &formed.offsets, |s, e| {
                    let rows = &order[to_usize(s)..to_usize(e)];
                    let longest = rows.iter().map(|&r| lengths[r as usize].into()).max();
                    // Matched, not summed (see `Formed::cost`).
                    #[allow(clippy::cast_possible_truncation)]
                    let cost = self
                        .config
                        .batch_cost(rows.len() as u64, longest.unwrap_or(0))
                        as f32;
                    cost
                });
            }
        }
        let epoch_key = key;
        if self.config.shuffle && lengths.len() <= ARRANGE_MAX_SAMPLES {
            if let Some(ppm) = self.config.balance_tolerance_ppm {
                // Batch numbers fit in u32: at most one batch per sample.
                #[allow(clippy::cast_possible_truncation)]
                let mut sequence: Vec<u32> = (0..formed.cost.len() as u32).collect();
                let pool = self.pool.get();
                let pool = pool.as_deref();
                balance_classes(
                    &mut sequence,
                    &formed.cost,
                    &self.config,
                    ppm,
                    epoch_key,
                    pool,
                );
                let rows;
                (rows, formed.offsets) =
                    gather(&order, &formed.offsets, &sequence, Vec::new(), pool);
                order = rows;
            } else {
                self.balance_tail(&mut order, &mut formed, epoch_key);
            }
        }
        let batches = (formed.offsets.len() - 1) as u64;
        if batches == 0 {
            let samples = formed.written;
            return Err(ErrorKind::TooFewSamplesForRanks {
                samples,
                world_size,
                drop_last: self.config.drop_last,
                batches: 0,
                needed: world_size as usize,
            }
            .into());
        }
        let (min_rows, max_rows) = row_range(&formed.offsets);
        let stats = Stats {
            batches,
            steps: batches / u64::from(world_size),
            samples: order.len() as u64,
            real_tokens,
            padded_tokens: formed.padded_tokens,
            skipped: self.lengths.len() as u64 - self.admitted,
            dropped,
            dropped_batches,
            split_batches,
            reformed,
            buckets: self.buckets.count() as u64,
            min_rows,
            max_rows,
        };
        Ok(Plan::new(formed.offsets, order, world_size, epoch, stats))
    }

    /// One forming pass (shuffle, form, order inside groups) of the random draws keyed `key`; the
    /// plan's rows truncated to those formed.
    fn form<L: Length>(&self, former: &Former<'_, L>, key: u64) -> (Vec<u32>, Epoch) {
        let pool = self.pool.get();
        let (mut order, formed) = if let Some(by_bucket) = &self.by_bucket {
            former.form_by_bucket(by_bucket, key, pool.as_deref())
        } else if self.config.shuffle {
            former.form_shuffled(key, pool.as_deref())
        } else {
            let mut order = sorted_by_length(former.lengths);
            let formed = former.form_sorted(&mut order);
            (order, formed)
        };
        order.truncate(formed.written);
        (order, formed)
    }

    /// Forms `epoch` with no more batches than the target (see [`Planner::steps`]): the epoch's own
    /// draws, or — in the rare epoch that forms more — up to [`REFORM_ATTEMPTS`] other keyed draws
    /// of it, and at last the reference draws, which form exactly the reference count. Returns the
    /// rows, the epoch, the key used and how many extra forming passes it took.
    fn form_within<L: Length>(
        &self,
        former: &Former<'_, L>,
        epoch: u64,
    ) -> (Vec<u32>, Epoch, u64, u64) {
        let (order, formed) = self.form(former, epoch);
        let target = self.target_batches(former, (epoch == REFERENCE_KEY).then_some(&formed));
        if self.config.drop_last || formed.offsets.len() - 1 <= target {
            return (order, formed, epoch, 0);
        }
        for attempt in 1..=REFORM_ATTEMPTS {
            let key = reform_key(epoch, attempt);
            let (order, formed) = self.form(former, key);
            if formed.offsets.len() - 1 <= target {
                return (order, formed, key, attempt);
            }
        }
        let (order, formed) = self.form(former, REFERENCE_KEY);
        (order, formed, REFERENCE_KEY, REFORM_ATTEMPTS + 1)
    }

    /// Batches every epoch's plan has, all ranks together, decided once from the reference draws
    /// (`reference`, when the caller has just formed them) and the calibration draws.
    fn target_batches<L: Length>(
        &self,
        former: &Former<'_, L>,
        reference: Option<&Epoch>,
    ) -> usize {
        *self.target.get_or_init(|| {
            let count = |key| self.form(former, key).1.offsets.len() - 1;
            let first = reference.map_or_else(|| count(REFERENCE_KEY), |f| f.offsets.len() - 1);
            let fixed = !self.config.shuffle
                || (self.by_bucket.is_some() && matches!(self.config.batching, Batching::Rows(_)));
            if fixed {
                return steps_target(&[first, first], &self.config);
            }
            let mut counts = vec![first];
            if self.lengths.len() <= ARRANGE_MAX_SAMPLES {
                counts.extend((1..=CALIBRATION_DRAWS).map(|i| count(calibration_key(i))));
            }
            steps_target(&counts, &self.config)
        })
    }

    /// Steps per rank of every epoch: the same for every epoch of this configuration and data.
    pub fn steps(&self) -> u64 {
        self.plan_target() / u64::from(self.config.world_size)
    }

    fn plan_target(&self) -> u64 {
        let target = with_lengths!(&self.lengths, v => self.target_batches(&self.former(v), None));
        target as u64
    }

    /// The read-only state one forming pass borrows.
    fn former<'a, L: Length>(&'a self, lengths: &'a [L]) -> Former<'a, L> {
        Former {
            lengths,
            config: &self.config,
            rules: &self.rules,
            bucket_capacity: &self.bucket_capacity,
            companion_min: self.companion_min,
            general_only: self.general_only,
            shortest: self.shortest,
        }
    }

    /// Matches the ranks of the tail's windows (the main batches were matched while forming) and
    /// moves its rows; the tail is small (mostly each group's flushed partial batches).
    fn balance_tail(&self, order: &mut [u32], formed: &mut Epoch, epoch: u64) {
        let batches = formed.offsets.len() - 1;
        let start = formed.tail_start.min(batches);
        // Batch numbers fit in u32: at most one batch per sample.
        #[allow(clippy::cast_possible_truncation)]
        let mut sequence: Vec<u32> = (0..(batches - start) as u32).collect();
        let mut rng = Pcg64::new(self.config.seed, epoch, stream(Unit::Tail));
        match_windows(&mut sequence, &formed.cost[start..], &self.config, &mut rng);
        let mut ends = Vec::with_capacity(sequence.len());
        let offsets = &formed.offsets;
        let bound = |i: usize| to_usize(offsets[start + i]);
        reorder_region(order, bound, &sequence, |_, end| ends.push(end as u64));
        let tail_cost: Vec<f32> = sequence
            .iter()
            .map(|&id| formed.cost[start + id as usize])
            .collect();
        formed.offsets[start + 1..].copy_from_slice(&ends);
        formed.cost[start..].copy_from_slice(&tail_cost);
    }

    /// Padded tokens of a batch with these members (a packed row: its capacity).
    fn cost<L: Length>(&self, lengths: &[L], members: &[u32]) -> u64 {
        if let (Mode::Packed { .. }, Batching::Tokens(capacity)) =
            (self.config.mode, self.config.batching)
        {
            // A packed row occupies the whole row, filled or not.
            return capacity;
        }
        let longest = members
            .iter()
            .map(|&r| lengths[r as usize].into())
            .max()
            .unwrap_or(0);
        members.len() as u64 * self.config.padded(longest)
    }
}

/// The lengths of `rows`, widened.
fn lengths_of<L: Length>(lengths: &[L], rows: &[u32]) -> Vec<u32> {
    rows.iter().map(|&r| lengths[r as usize].into()).collect()
}

/// Sum of the lengths of `rows`.
fn tokens_of<L: Length>(lengths: &[L], rows: &[u32]) -> u64 {
    rows.iter()
        .map(|&r| u64::from(lengths[r as usize].into()))
        .sum()
}

/// Fewest and most rows in a batch, in one pass over the offsets.
fn row_range(offsets: &[u64]) -> (u64, u64) {
    let sizes = offsets.windows(2).map(|w| w[1] - w[0]);
    let (min, max) = sizes.fold((u64::MAX, 0), |(lo, hi), s| (lo.min(s), hi.max(s)));
    (if max == 0 { 0 } else { min }, max)
}

/// The epoch-independent state [`Planner::new`] derives from the lengths.
struct Prepared {
    buckets: Buckets,
    predicted_efficiency: f64,
    rules: Rules,
    bucket_capacity: Vec<u32>,
    admitted: u64,
    admitted_tokens: u64,
    shortest: u32,
}

fn prepare<L: Length>(lengths: &[L], config: &Config) -> Result<Prepared> {
    check_lengths(lengths)?;
    check_cost_range(lengths, config)?;
    let admit_max = admission(lengths, config)?;
    let (buckets, predicted_efficiency) = choose_buckets(lengths, config, admit_max)?;
    let longest = lengths.iter().copied().max().map_or(0, Into::into);
    let rules = Rules::new(&buckets, config, admit_max, longest);
    let mut bucket_capacity = vec![0u32; buckets.count()];
    let (mut admitted, mut admitted_tokens, mut shortest) = (0, 0, u32::MAX);
    for &l in lengths {
        if let Some((b, capacity)) = rules.get(l.into()) {
            bucket_capacity[b] = bucket_capacity[b].max(capacity);
            admitted += 1;
            admitted_tokens += u64::from(l.into());
            shortest = shortest.min(l.into());
        }
    }
    Ok(Prepared {
        buckets,
        predicted_efficiency,
        rules,
        bucket_capacity,
        admitted,
        admitted_tokens,
        shortest,
    })
}

fn check_lengths<L: Length>(lengths: &[L]) -> Result<()> {
    if lengths.is_empty() {
        return Err(ErrorKind::EmptyLengths.into());
    }
    if u32::try_from(lengths.len()).is_err() {
        return Err(ErrorKind::TooManySamples {
            count: lengths.len(),
        }
        .into());
    }
    match lengths.iter().position(|&l| l.into() == 0) {
        Some(row) => Err(ErrorKind::NonPositiveLength { row, value: 0 }.into()),
        None => Ok(()),
    }
}

/// Batch costs are matched as `f32` (`balance.rs`): a cost model that prices the shortest row, or a
/// fixed-row batch of the longest, past its range would make every cost infinite (the cost-class loop
/// then never ended).
fn check_cost_range<L: Length>(lengths: &[L], config: &Config) -> Result<()> {
    if config.cost.is_tokens() {
        return Ok(());
    }
    let (shortest, longest) = lengths.iter().fold((u32::MAX, 0), |(lo, hi), &l| {
        let l: u32 = l.into();
        (lo.min(l), hi.max(l))
    });
    let (length, rows) = match config.batching {
        Batching::Rows(n) => (config.padded(longest), u64::from(n)),
        Batching::Tokens(_) => (config.padded(shortest), 1),
    };
    // Row counts stay far below 2^53.
    #[allow(clippy::cast_precision_loss)]
    let cost = config.cost.row(length) * rows as f64;
    if cost.is_finite() && cost <= f64::from(f32::MAX) {
        return Ok(());
    }
    let CostModel { linear, quadratic } = config.cost;
    let given = format!("({linear:?}, {quadratic:?})");
    Err(ErrorKind::CostOverflow {
        given,
        length,
        rows,
    }
    .into())
}

/// The longest length that enters the plan: every length, or under `max_tokens` those that fit a
/// batch on their own (`round_up(l, pad) ≤ max_tokens ⇔ l ≤ ⌊max_tokens / pad⌋ · pad`).
fn admission<L: Length>(lengths: &[L], config: &Config) -> Result<u32> {
    let budget = match config.batching {
        Batching::Tokens(t) => t,
        Batching::Rows(_) => u64::MAX,
    };
    let admit_max = largest_admitted(config, budget);
    let fits = |l: u32| l <= admit_max;
    if let Some((row, &shortest)) = lengths.iter().enumerate().min_by_key(|(_, &l)| l) {
        if !fits(shortest.into()) {
            let length: u32 = shortest.into();
            let shortest = config.padded(length);
            let packed = matches!(config.mode, Mode::Packed { .. });
            let priced = (!config.cost.is_tokens() && !packed).then(|| {
                let CostModel { linear, quadratic } = config.cost;
                let price = config.cost.row(shortest);
                (format!("({linear:?}, {quadratic:?})"), format!("{price:e}"))
            });
            return Err(ErrorKind::MaxTokensBelowShortest {
                max_tokens: budget,
                shortest,
                length,
                row,
                priced,
            }
            .into());
        }
    }
    if config.oversize == Oversize::Error {
        if let Some(row) = lengths.iter().position(|&l| !fits(l.into())) {
            let length = config.padded(lengths[row].into());
            return Err(ErrorKind::Oversize {
                row,
                length,
                max_tokens: budget,
                longest: admit_max,
            }
            .into());
        }
    }
    Ok(admit_max)
}

/// The longest padded length whose single row fits `budget`: `⌊budget / pad⌋ · pad` for tokens;
/// under a cost model the largest multiple of `pad` whose row cost fits (found by bisection, since
/// the cost grows with length).
fn largest_admitted(config: &Config, budget: u64) -> u32 {
    let pad = u64::from(config.pad_to_multiple_of);
    // A packed row holds any sample up to its capacity; the cost model only prices rows.
    let packed = matches!(config.mode, Mode::Packed { .. });
    if budget == u64::MAX || config.cost.is_tokens() || packed {
        return u32::try_from(budget / pad * pad).unwrap_or(u32::MAX);
    }
    // Budgets stay far below 2^53.
    #[allow(clippy::cast_precision_loss)]
    let fits = |multiple: u64| config.cost.row(multiple * pad) <= budget as f64;
    let (mut lo, mut hi) = (0u64, u64::from(u32::MAX) / pad + 1);
    if fits(hi) {
        return u32::MAX;
    }
    // Invariant: fits(lo) (a zero-length row costs 0), !fits(hi).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    u32::try_from(lo * pad).unwrap_or(u32::MAX)
}

/// Buckets of `bucketed` packing with `boundaries="auto"`: wide enough that a row mixes lengths and
/// fills (narrow buckets leave long samples two to a row), narrow enough to bound `max_seqlen`. Seed
/// workload, C = 16,384 (measured): utilization 0.956 with 2 buckets, 0.941 with 3, 0.937 with 4
/// (0.991 unbucketed).
const PACKED_BUCKETS: usize = 2;

fn choose_buckets<L: Length>(
    lengths: &[L],
    config: &Config,
    admit_max: u32,
) -> Result<(Buckets, f64)> {
    let keep = |l: u32| l <= admit_max;
    let histogram = Histogram::new(lengths, keep);
    let boundaries = match (config.mode, &config.boundaries) {
        (Mode::Padded, boundaries) => boundaries,
        (Mode::Packed { bucketed: false }, Boundaries::Auto) => {
            // One bucket: every admitted length shares the packing window.
            let top = lengths
                .iter()
                .map(|&l| l.into())
                .filter(|&l| keep(l))
                .max()
                .unwrap_or(1);
            return Ok((Buckets::from_edges(vec![0, top.max(1)])?, f64::NAN));
        }
        (Mode::Packed { bucketed: false }, _) => {
            return Err(ErrorKind::PackedSetting {
                problem: "packs every length together; boundaries apply with bucketed=True",
            }
            .into());
        }
        (Mode::Packed { bucketed: true }, Boundaries::Auto) => &Boundaries::Count(PACKED_BUCKETS),
        (Mode::Packed { bucketed: true }, boundaries) => boundaries,
    };
    let optimized = match boundaries {
        Boundaries::Edges(edges) => {
            let buckets = Buckets::from_edges(edges.clone())?;
            buckets.check_covers(lengths, keep)?;
            let predicted = predicted_efficiency(&histogram, buckets.edges(), config);
            return Ok((buckets, predicted));
        }
        Boundaries::Count(k) => {
            if *k == 0 || *k > usize::from(u16::MAX) {
                return Err(ErrorKind::InvalidSetting {
                    name: "boundaries (bucket count)",
                    value: *k as i128,
                    expected: "between 1 and 65535",
                }
                .into());
            }
            optimal_edges(&histogram, *k, config)
        }
        Boundaries::Auto => {
            let target = f64::from(config.target_efficiency_ppm) / 1e6;
            auto_edges(&histogram, target, config)
        }
    };
    Ok((
        Buckets::from_edges(optimized.edges)?,
        optimized.predicted_efficiency,
    ))
}

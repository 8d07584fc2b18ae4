//! One epoch through the pipeline (`planner.rs` lists the stages): formed within the shared batch
//! count, split or dropped to it, balanced at the tail, and assembled with its stats.

use crate::error::{ErrorKind, Result};
use crate::lengths::{to_usize, with_lengths, Length};
use crate::memory;
use crate::plan::balance::balance_classes;
use crate::plan::config::{Batching, Mode};
use crate::plan::form::{Epoch, Former};
use crate::plan::output::{row_range, Plan, Stats};
use crate::plan::planner::Planner;
use crate::plan::split::{drop_to, expand_per_batch, gather, split_to};

impl Planner {
    /// Plans `epoch`: every batch of every rank, in training order.
    pub fn plan(&self, epoch: u64) -> Result<Plan> {
        self.lengths.check()?;
        with_lengths!(&self.lengths, v => self.plan_with(v, epoch))
    }

    /// Bytes an epoch's planning allocates at its peak, at most (`tests/memory_peaks.rs` holds every
    /// path to it): per sample, and per batch for epochs of few samples a batch.
    pub fn plan_bytes(&self) -> u64 {
        let samples = self.epoch_samples() as u64;
        let per_sample = if self.by_bucket.is_some() {
            memory::ARRANGED_BYTES_PER_SAMPLE
        } else if self.mix.is_some() {
            // The selection in its epoch buffer and a bucket's copy, or the listed rows (`mixture/`).
            memory::ARRANGED_BYTES_PER_SAMPLE + memory::MIXTURE_BYTES_PER_SAMPLE
        } else {
            memory::STREAMED_BYTES_PER_SAMPLE
        };
        // Before the first plan the batch count is unknown: twice what one forming pass can close
        // (the target adds a margin and splits; a mixture's epochs repeat rows: one a sample).
        let first = if self.mix.is_some() {
            samples
        } else {
            2 * self.batch_bound + u64::from(self.config.world_size)
        };
        let batches = self
            .target
            .get()
            .map_or(first, |&t| 2 * t as u64)
            .min(samples);
        let per_batch = if self.mix.is_none() && !self.arranged() {
            memory::UNARRANGED_BYTES_PER_BATCH
        } else {
            memory::PLAN_BYTES_PER_BATCH
        };
        memory::PLAN_FIXED_BYTES + samples * per_sample + batches * per_batch
    }

    /// The most batches one forming pass over these lengths can close (what the first plan reserves
    /// working memory for, twice over, before an epoch has set the batch count): see `prepare.rs`.
    pub fn batch_bound(&self) -> u64 {
        self.batch_bound
    }

    /// [`Planner::plan`] for one storage width of the lengths.
    fn plan_with<L: Length>(&self, lengths: &[L], epoch: u64) -> Result<Plan> {
        memory::reserve("planning an epoch", self.plan_bytes())?;
        let former = self.former(lengths);
        let (mut order, mut formed, key, reformed) = self.form_within(&former, epoch)?;
        let target = self.target_batches(&former, None);
        let world_size = self.config.world_size;
        let mut real_tokens = formed.tokens.unwrap_or(self.admitted_tokens);
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
        if self.config.shuffle && self.arranged() {
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
                formed.balance_tail(&mut order, &self.config, epoch_key);
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
            skipped: self.skipped(),
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

    /// One forming pass (shuffle, form, order inside groups) of the random draws keyed `key`, over a
    /// mixture's selection keyed `select`; the plan's rows truncated to those formed.
    pub(super) fn form<L: Length>(
        &self,
        former: &Former<'_, L>,
        (select, key): (u64, u64),
    ) -> (Vec<u32>, Epoch) {
        let pool = self.pool.get();
        let (mut order, formed) = if let Some(mix) = &self.mix {
            self.form_population(former, mix, (select, key), pool.as_deref())
        } else if let Some(by_bucket) = &self.by_bucket {
            former.form_by_bucket(by_bucket, key, pool.as_deref())
        } else if self.config.shuffle {
            former.form_shuffled(None, key, pool.as_deref())
        } else {
            former.form_sorted()
        };
        order.truncate(formed.written);
        (order, formed)
    }

    /// The read-only state one forming pass borrows.
    pub(super) fn former<'a, L: Length>(&'a self, lengths: &'a [L]) -> Former<'a, L> {
        Former {
            lengths,
            config: &self.config,
            rules: &self.rules,
            bucket_capacity: &self.bucket_capacity,
            companion_min: self.companion_min,
            general_only: self.general_only,
            shortest: self.shortest,
            arranged: self.arranged(),
            labels: self.labels.as_ref(),
        }
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

/// Sum of the lengths of `rows`.
fn tokens_of<L: Length>(lengths: &[L], rows: &[u32]) -> u64 {
    rows.iter()
        .map(|&r| u64::from(lengths[r as usize].into()))
        .sum()
}

//! Forming a shuffled padded epoch bucket by bucket: the default path up to
//! `form::ARRANGE_MAX_SAMPLES` samples.
//!
//! The planner keeps the admitted rows grouped by bucket ([`ByBucket`], built once). Each epoch:
//!
//! 1. **Shuffle and cut, per bucket** (parallel over buckets, largest first): the bucket's rows, with
//!    their lengths, are shuffled into the epoch buffer with the bucket's own stream `(seed, epoch,
//!    bucket)` (an inside-out Fisher–Yates: no copy first), then cut into batches front to back by
//!    the batching rule, in place. Only the last batch of a bucket can be partial. Every batch is a
//!    contiguous run of the buffer; nothing is copied per batch.
//! 2. **Arrange, balance and place, per group** (parallel over groups): group `g` of `G` takes the
//!    `g`-th `G`-th of every bucket's complete batches — a stratified random sample of the epoch, so
//!    its length mix is the dataset's — orders them (`arrange.rs`), matches the ranks of its whole
//!    mixing windows (`balance.rs`), and writes their rows, in that order, into its region of the
//!    plan's buffer. The group's remainder of a window joins the epoch's tail (`form::Epoch`).
//! 3. The buckets' partial batches go to the tail too, in a seeded order.
//!
//! The batches are exactly those of streaming a shuffled bucket through the rule, as the general
//! stream (`form/stream.rs`) does; the difference is the work. The stream draws a global permutation
//! (a scatter into cache-sized chunks, then a Fisher–Yates per chunk), looks up every sample's
//! bucket, keeps an open batch per bucket and copies each closed batch back, then moves every row
//! once more to order the group: ~206 instructions a sample on the seed workload (callgrind). Here
//! there is one Fisher–Yates per sample, a sequential cut with no per-batch copy, and one move into
//! place: ~139 (6 buckets, one thread). Large epochs keep the stream: this path holds 16 more bytes
//! a sample (the grouping and the epoch buffer, a row and a length each), which past 16.7M samples
//! would break the 1 GB budget at 100M.

use std::sync::Mutex;

use crate::lengths::Length;
use crate::plan::arrange::arrange;
use crate::plan::balance::{balance_windows, Unit};
use crate::plan::config::Mode;
use crate::plan::form::batches::{Epoch, Formed};
use crate::plan::form::cut::{group_by_bucket, length_of, place, row_of, Batches, Derived};
use crate::plan::form::rule::closing_order;
use crate::plan::form::stream::Former;
use crate::plan::form::trim::spread;
use crate::plan::form::MAX_GROUPS;
use crate::plan::rules::Rules;
use crate::rng::{shuffle_into, Pcg64, Stream};
use crate::tasks::{run, run_largest_first, split_chunks};

/// Rows per forming group, about: enough windows per group that few batches go to the tail, small
/// enough that a group's rows (≤ 256 KB) stay in cache while they are ordered and moved.
const GROUP_ROWS: usize = 1 << 16;

/// The admitted rows grouped by bucket, ascending inside each: what every epoch shuffles. Each
/// carries its length (`row << 32 | length`), so cutting reads lengths in order where looking each
/// up would be a cache miss (a fifth of the cut's time, measured).
#[derive(Debug)]
pub(crate) struct ByBucket {
    pairs: Vec<u64>,
    /// Bucket `b`'s rows are `pairs[starts[b]..starts[b + 1]]`.
    starts: Vec<usize>,
    /// The epoch buffer of the last plan, for the next (concurrent plans each take their own).
    spare: Mutex<Vec<u64>>,
}

impl ByBucket {
    /// Groups the rows of `lengths` that `rules` admits by bucket (a counting sort, O(n)).
    pub(crate) fn new<L: Length>(lengths: &[L], rules: &Rules, buckets: usize) -> Self {
        let rows = (0u64..)
            .zip(lengths)
            .map(|(row, &l)| row << 32 | u64::from(l.into()));
        let (pairs, starts) = group_by_bucket(rows, rules, buckets);
        Self {
            pairs,
            starts,
            spare: Mutex::new(Vec::new()),
        }
    }

    /// An epoch buffer as long as `pairs`: the spare one, or a new one. Its contents are garbage.
    fn take_buffer(&self) -> Vec<u64> {
        let spare = self.spare.lock().map(|mut s| std::mem::take(&mut *s));
        match spare {
            Ok(buffer) if buffer.len() == self.pairs.len() => buffer,
            _ => vec![0; self.pairs.len()],
        }
    }

    /// Keeps `buffer` for the next epoch.
    fn give_back(&self, buffer: Vec<u64>) {
        if let Ok(mut spare) = self.spare.lock() {
            *spare = buffer;
        }
    }
}

impl<L: Length> Former<'_, L> {
    /// Forms a shuffled padded epoch from `by_bucket`, as the module docs describe.
    pub(crate) fn form_by_bucket(
        &self,
        by_bucket: &ByBucket,
        epoch: u64,
        pool: Option<&rayon::ThreadPool>,
    ) -> (Vec<u32>, Epoch) {
        // Reused across epochs: zeroing a fresh one cost as much as a tenth of the epoch (measured).
        let mut shuffled = by_bucket.take_buffer();
        let formed = self.form_buckets(
            &by_bucket.starts,
            &mut shuffled,
            epoch,
            pool,
            |b, rng, rows| {
                shuffle_into(
                    rng,
                    &by_bucket.pairs[by_bucket.starts[b]..by_bucket.starts[b + 1]],
                    rows,
                );
            },
        );
        by_bucket.give_back(shuffled);
        formed
    }

    /// Forms a shuffled padded epoch whose bucket `b` holds `shuffled[starts[b]..starts[b + 1]]`,
    /// written there by `fill(b, rng, rows)` with the bucket's random stream: the planner's rows
    /// shuffled, or a mixture's selection (`mixture/select.rs`).
    pub(crate) fn form_buckets(
        &self,
        starts: &[usize],
        shuffled: &mut [u64],
        epoch: u64,
        pool: Option<&rayon::ThreadPool>,
        fill: impl Fn(usize, &mut Pcg64, &mut [u64]) + Sync,
    ) -> (Vec<u32>, Epoch) {
        debug_assert!(matches!(self.config.mode, Mode::Padded));
        let n = shuffled.len();
        let tasks: Vec<_> = split_chunks(shuffled, starts)
            .into_iter()
            .enumerate()
            .collect();
        let cuts: Vec<Batches> = run_largest_first(
            pool,
            tasks,
            |(_, rows)| rows.len(),
            |(b, rows)| {
                // Bucket counts fit in u32 (the planner caps them at 65,535).
                #[allow(clippy::cast_possible_truncation)]
                let mut rng = Pcg64::new(self.config.seed, epoch, Stream::Bucket(b as u32));
                fill(b, &mut rng, rows);
                self.cut(rows, starts[b])
            },
        );
        let shuffled = &*shuffled;

        let groups = (n / GROUP_ROWS).clamp(1, MAX_GROUPS);
        let share = |cut: &Batches, g: usize| {
            (g * cut.complete / groups)..((g + 1) * cut.complete / groups)
        };
        // Each group's region of the plan buffer, then the partial batches'.
        let mut region_starts = vec![0usize];
        for g in 0..groups {
            let rows: usize = cuts.iter().map(|c| c.rows(share(c, g))).sum();
            region_starts.push(region_starts[g] + rows);
        }
        region_starts.push(n);
        let mut order = vec![0u32; n];
        let mut regions = split_chunks(&mut order, &region_starts);
        let partial_region = regions.pop().unwrap_or_default();
        let partials = self.place_partials(&cuts, shuffled, partial_region, epoch);
        let tasks: Vec<_> = regions.into_iter().enumerate().collect();
        let parts = run(pool, tasks, |(g, out)| {
            let mut batches = Batches::with_capacity(cuts.iter().map(|c| share(c, g).len()).sum());
            for cut in &cuts {
                batches.extend(cut, share(cut, g));
            }
            // Groups number at most MAX_GROUPS.
            #[allow(clippy::cast_possible_truncation)]
            self.place_group(batches, shuffled, out, epoch, g as u32)
        });

        let batches: usize = cuts.iter().map(Batches::len).sum();
        let mut total = Epoch::with_room(batches, self.config.world_size);
        for (g, part) in parts.into_iter().enumerate() {
            total.append(&mut order, region_starts[g], part);
        }
        total.append(&mut order, region_starts[groups], partials);
        total.finish(&mut order);
        (order, total)
    }

    /// Orders one group's `batches` (in the epoch buffer `shuffled`), matches the ranks of its whole
    /// windows, trims its steps if asked (`trim.rs`), and writes their rows in that order into `out`.
    fn place_group(
        &self,
        mut batches: Batches,
        shuffled: &[u64],
        out: &mut [u32],
        epoch: u64,
        group: u32,
    ) -> Formed {
        let config = self.config;
        let m = batches.len();
        let derived = Derived::new(&batches, config);
        let mut sequence = arrange(&derived.mean, m, m, config.order, config.seed, epoch, group);
        if let Some(labels) = self.labels {
            let mut parts = labels.parts(m);
            for (b, (&s, &e)) in batches.starts.iter().zip(&batches.ends).enumerate() {
                let rows = shuffled[s as usize..e as usize].iter();
                parts.add_batch(b, rows.map(|&pair| (row_of(pair), length_of(pair))));
            }
            parts.choose(&mut sequence, &derived.mean);
        }
        let main = m / config.window() * config.window();
        let cost = &derived.cost;
        let mut rng = balance_windows(
            &mut sequence[..main],
            cost,
            config,
            epoch,
            Unit::Group(group),
        );
        if !config.trim_steps {
            return place(&batches, &derived, &sequence, (shuffled, &[]), out, main);
        }
        let spill = self.trim_steps(&mut batches, shuffled, &sequence[..main]);
        let (spilled, extra) = self.reform(&spill, shuffled.len());
        let own = batches.len();
        batches.extend(&extra, 0..extra.len());
        let derived = Derived::new(&batches, config);
        let (sequence, main) = spread(
            &sequence,
            main,
            own..batches.len(),
            &derived.cost,
            config,
            &mut rng,
        );
        place(
            &batches,
            &derived,
            &sequence,
            (shuffled, &spilled),
            out,
            main,
        )
    }

    /// The buckets' partial batches, in a seeded order, written into `out`: all of them go to the
    /// epoch's tail.
    fn place_partials(
        &self,
        cuts: &[Batches],
        shuffled: &[u64],
        out: &mut [u32],
        epoch: u64,
    ) -> Formed {
        let partial: Vec<usize> = (0..cuts.len())
            .filter(|&b| cuts[b].len() > cuts[b].complete)
            .collect();
        let partial = closing_order(self.config.seed, partial, Some((epoch, u32::MAX)));
        let mut batches = Batches::default();
        for &b in &partial {
            batches.extend(&cuts[b], cuts[b].complete..cuts[b].len());
        }
        let derived = Derived::new(&batches, self.config);
        // Batch numbers fit in u32 (at most one per bucket).
        #[allow(clippy::cast_possible_truncation)]
        let in_order: Vec<u32> = (0..batches.len() as u32).collect();
        place(&batches, &derived, &in_order, (shuffled, &[]), out, 0)
    }
}

#[cfg(test)]
mod tests;

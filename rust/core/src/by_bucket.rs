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
//!    its length mix is the dataset's — orders them (`stratify.rs`), matches the ranks of its whole
//!    mixing windows (`balance.rs`), and writes their rows, in that order, into its region of the
//!    plan's buffer. The group's remainder of a window joins the epoch's tail (`form::Epoch`).
//! 3. The buckets' partial batches go to the tail too, in a seeded order.
//!
//! The batches are exactly those of streaming a shuffled bucket through the rule, as the general
//! stream (`form.rs`) does; the difference is the work. The stream draws a global permutation
//! (a scatter into cache-sized chunks, then a Fisher–Yates per chunk), looks up every sample's
//! bucket, keeps an open batch per bucket and copies each closed batch back, then moves every row
//! once more to order the group: ~206 instructions a sample on the seed workload (callgrind). Here
//! there is one Fisher–Yates per sample, a sequential cut with no per-batch copy, and one move into
//! place: ~139 (6 buckets, one thread). Large epochs keep the stream: this path holds 16 more bytes
//! a sample (the grouping and the epoch buffer, a row and a length each), which past 16.7M samples
//! would break the 1 GB budget at 100M.

use std::sync::Mutex;

use crate::balance::{match_windows, stream, Unit};
use crate::config::{Config, Mode};
use crate::form::{mean_length, Epoch, Formed, Former};
use crate::lengths::Length;
use crate::permute::{run, run_largest_first, split_chunks};
use crate::rng::{shuffle, shuffle_into, Pcg64, Stream};
use crate::rules::{table_entry_parts, Rules};
use crate::stratify::arrange;

/// Rows per forming group, about: enough windows per group that few batches go to the tail, small
/// enough that a group's rows (≤ 256 KB) stay in cache while they are ordered and moved.
const GROUP_ROWS: usize = 1 << 16;

/// Most groups: enough for 16 threads.
const MAX_GROUPS: usize = 16;

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

/// The row of a pair.
#[inline]
fn row_of(pair: u64) -> u32 {
    // The high half is the row.
    #[allow(clippy::cast_possible_truncation)]
    let row = (pair >> 32) as u32;
    row
}

/// The length of a pair.
#[inline]
fn length_of(pair: u64) -> u32 {
    // The low half is the length.
    #[allow(clippy::cast_possible_truncation)]
    let length = pair as u32;
    length
}

impl ByBucket {
    /// Groups the rows of `lengths` that `rules` admits by bucket (a counting sort, O(n)).
    pub(crate) fn new<L: Length>(lengths: &[L], rules: &Rules, buckets: usize) -> Self {
        let mut starts = vec![0usize; buckets + 1];
        for &l in lengths {
            if let Some((b, _)) = rules.get(l.into()) {
                starts[b + 1] += 1;
            }
        }
        for b in 0..buckets {
            starts[b + 1] += starts[b];
        }
        let mut next = starts.clone();
        let mut pairs = vec![0u64; starts[buckets]];
        for (row, &l) in lengths.iter().enumerate() {
            let length: u32 = l.into();
            if let Some((b, _)) = rules.get(length) {
                pairs[next[b]] = (row as u64) << 32 | u64::from(length);
                next[b] += 1;
            }
        }
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

    /// Admitted rows.
    pub(crate) fn len(&self) -> usize {
        self.pairs.len()
    }
}

/// Writes `batches` (in the epoch buffer `shuffled`) into `out` in `sequence` order, the first
/// `main` of them staying in place: where each batch goes is computed first, then the rows move in
/// formation order, reading the buffer front to back and writing at random, which does not stall as
/// random reads would (measured).
fn place(
    batches: &Batches,
    derived: &Derived,
    sequence: &[u32],
    shuffled: &[u64],
    out: &mut [u32],
    main: usize,
) -> Formed {
    let mut dest = vec![0u32; batches.len()];
    let mut offsets = Vec::with_capacity(sequence.len() + 1);
    offsets.push(0u32);
    let mut at = 0u32;
    for &id in sequence {
        dest[id as usize] = at;
        at += derived.rows[id as usize];
        offsets.push(at);
    }
    let cost = sequence
        .iter()
        .map(|&id| derived.cost[id as usize])
        .collect();
    let formed = Formed::placed(offsets, cost, derived.padded.iter().sum(), main);
    for ((&s, &e), &d) in batches.starts.iter().zip(&batches.ends).zip(&dest) {
        let (s, e, d) = (s as usize, e as usize, d as usize);
        for (slot, &pair) in out[d..d + e - s].iter_mut().zip(&shuffled[s..e]) {
            *slot = row_of(pair);
        }
    }
    formed
}

/// Batches after shuffling and cutting, as the cut records them: batch `j` spans
/// `start(j)..ends[j]` of the epoch buffer. One bucket's (consecutive batches share bounds), or a
/// group's, gathered from its buckets. The cut records only what it must, three numbers a batch;
/// the rest is derived per group in bulk ([`Derived`]): a mean, a cost and padded tokens computed in
/// the cut's loop made every batch wait for a float division (a third of the cut, measured).
#[derive(Default)]
struct Batches {
    starts: Vec<u32>,
    ends: Vec<u32>,
    longest: Vec<u32>,
    tokens: Vec<u64>,
    /// Batches closed by the rule; a last, partial one may follow (a bucket's).
    complete: usize,
}

impl Batches {
    fn with_capacity(room: usize) -> Self {
        Self {
            starts: Vec::with_capacity(room),
            ends: Vec::with_capacity(room),
            longest: Vec::with_capacity(room),
            tokens: Vec::with_capacity(room),
            complete: 0,
        }
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    /// Rows of batches `range`, which are contiguous in a bucket.
    fn rows(&self, range: std::ops::Range<usize>) -> usize {
        if range.is_empty() {
            0
        } else {
            (self.ends[range.end - 1] - self.starts[range.start]) as usize
        }
    }

    /// Records a batch over `start..end` whose longest row has `longest` tokens, `tokens` in all.
    #[inline]
    fn close(&mut self, (start, end): (usize, usize), longest: u32, tokens: u64) {
        // Bounds are below the admitted count, a u32.
        #[allow(clippy::cast_possible_truncation)]
        {
            self.starts.push(start as u32);
            self.ends.push(end as u32);
        }
        self.longest.push(longest);
        self.tokens.push(tokens);
    }

    /// Appends `other`'s batches `range`.
    fn extend(&mut self, other: &Batches, range: std::ops::Range<usize>) {
        self.starts.extend_from_slice(&other.starts[range.clone()]);
        self.ends.extend_from_slice(&other.ends[range.clone()]);
        self.longest
            .extend_from_slice(&other.longest[range.clone()]);
        self.tokens.extend_from_slice(&other.tokens[range]);
    }
}

/// What ordering and balance need of a group's batches, derived in bulk from [`Batches`].
struct Derived {
    /// Rows.
    rows: Vec<u32>,
    /// Mean row length (`stratify.rs` ranks batches by it).
    mean: Vec<u32>,
    /// Padded tokens.
    padded: Vec<u64>,
    /// Cost for rank balance (`Config::batch_cost`); `f32` suffices to match costs.
    cost: Vec<f32>,
}

impl Derived {
    fn new(batches: &Batches, config: &Config) -> Self {
        let counts: Vec<u32> = batches
            .starts
            .iter()
            .zip(&batches.ends)
            .map(|(&s, &e)| e - s)
            .collect();
        let rows = || counts.iter().map(|&r| u64::from(r));
        let mean = rows()
            .zip(&batches.tokens)
            // The mean is at most the longest length, a u32.
            .map(|(r, &t)| {
                #[allow(clippy::cast_possible_truncation)]
                let mean = mean_length(t, r) as u32;
                mean
            })
            .collect();
        let padded: Vec<u64> = rows()
            .zip(&batches.longest)
            .map(|(r, &l)| r * config.padded(l))
            .collect();
        // Costs are matched, not summed: f32 precision is plenty.
        #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
        let cost = if config.cost.is_tokens() {
            padded.iter().map(|&p| p as f32).collect()
        } else {
            rows()
                .zip(&batches.longest)
                .map(|(r, &l)| config.batch_cost(r, l) as f32)
                .collect()
        };
        Self {
            rows: counts,
            mean,
            padded,
            cost,
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
        debug_assert!(matches!(self.config.mode, Mode::Padded));
        let n = by_bucket.len();
        // Reused across epochs: zeroing a fresh one cost as much as a tenth of the epoch (measured).
        let mut shuffled = by_bucket.take_buffer();
        let tasks: Vec<_> = split_chunks(&mut shuffled, &by_bucket.starts)
            .into_iter()
            .enumerate()
            .collect();
        let cuts: Vec<Batches> = run_largest_first(
            pool,
            tasks,
            |(_, rows)| rows.len(),
            |(b, rows)| {
                let first = by_bucket.starts[b];
                // Bucket counts fit in u32 (the planner caps them at 65,535).
                #[allow(clippy::cast_possible_truncation)]
                let mut rng = Pcg64::new(self.config.seed, epoch, Stream::Bucket(b as u32));
                shuffle_into(
                    &mut rng,
                    &by_bucket.pairs[first..by_bucket.starts[b + 1]],
                    rows,
                );
                self.cut(rows, first)
            },
        );

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
        let partials = self.place_partials(&cuts, &shuffled, partial_region, epoch);
        let tasks: Vec<_> = regions.into_iter().enumerate().collect();
        let parts = run(pool, tasks, |(g, out)| {
            let mut batches = Batches::with_capacity(cuts.iter().map(|c| share(c, g).len()).sum());
            for cut in &cuts {
                batches.extend(cut, share(cut, g));
            }
            // Groups number at most MAX_GROUPS.
            #[allow(clippy::cast_possible_truncation)]
            self.place_group(&batches, &shuffled, out, epoch, g as u32)
        });

        let batches: usize = cuts.iter().map(Batches::len).sum();
        let mut total = Epoch::with_room(batches, self.config.world_size);
        for (g, part) in parts.into_iter().enumerate() {
            total.append(&mut order, region_starts[g], part);
        }
        total.append(&mut order, region_starts[groups], partials);
        total.finish(&mut order);
        by_bucket.give_back(shuffled);
        (order, total)
    }

    /// Cuts one shuffled bucket, `rows` at `first` of the epoch buffer, into batches front to back:
    /// a batch closes when the next row would break the rule, or when it is full (no row of the
    /// bucket could join), exactly as the general stream closes it.
    fn cut(&self, pairs: &[u64], first: usize) -> Batches {
        match self.rules.table.as_deref() {
            // Every row of a bucket is admitted, so its entry holds its capacity.
            Some(table) => self.cut_with(pairs, first, |length| {
                table
                    .get(length as usize)
                    .map_or(u32::MAX, |&e| table_entry_parts(e).1)
            }),
            None => self.cut_with(pairs, first, |length| {
                self.rules.get(length).map_or(u32::MAX, |(_, c)| c)
            }),
        }
    }

    /// [`Self::cut`] with `fits(length)`: the most rows a batch holding that length may have
    /// (`u32::MAX` never closes a batch).
    #[inline]
    fn cut_with(&self, pairs: &[u64], first: usize, fits: impl Fn(u32) -> u32) -> Batches {
        // Every closed batch but the last holds at least two rows in the common case (and at least
        // one always): room for that many saves most reallocation.
        let room = pairs.len() / 2 + 1;
        let mut cut = Batches::with_capacity(room);
        let mut start = first;
        let (mut len, mut capacity, mut longest, mut tokens) = (0u32, u32::MAX, 0u32, 0u64);
        for (k, &pair) in pairs.iter().enumerate() {
            let length = length_of(pair);
            let fits = fits(length);
            let at = first + k;
            let limit = capacity.min(fits);
            if len >= limit {
                cut.close((start, at), longest, tokens);
                (len, capacity, longest, tokens, start) = (0, fits, 0, 0, at);
            } else {
                capacity = limit;
            }
            len += 1;
            longest = longest.max(length);
            tokens += u64::from(length);
            if len >= capacity {
                cut.close((start, at + 1), longest, tokens);
                (len, capacity, longest, tokens, start) = (0, u32::MAX, 0, 0, at + 1);
            }
        }
        cut.complete = cut.len();
        if len > 0 {
            cut.close((start, first + pairs.len()), longest, tokens);
        }
        cut
    }

    /// Orders one group's `batches` (in the epoch buffer `shuffled`), matches the ranks of its whole
    /// windows, and writes their rows in that order into `out`.
    fn place_group(
        &self,
        batches: &Batches,
        shuffled: &[u64],
        out: &mut [u32],
        epoch: u64,
        group: u32,
    ) -> Formed {
        let config = self.config;
        let m = batches.len();
        let derived = Derived::new(batches, config);
        let mut sequence = arrange(&derived.mean, m, m, config.order, config.seed, epoch, group);
        let main = m / config.window() * config.window();
        // Cost classes regroup the whole epoch later (see `form.rs`).
        if config.balance_tolerance_ppm.is_none() {
            let mut rng = Pcg64::new(config.seed, epoch, stream(Unit::Group(group)));
            match_windows(&mut sequence[..main], &derived.cost, config, &mut rng);
        }
        place(batches, &derived, &sequence, shuffled, out, main)
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
        let mut partial: Vec<usize> = (0..cuts.len())
            .filter(|&b| cuts[b].len() > cuts[b].complete)
            .collect();
        shuffle(
            &mut Pcg64::new(self.config.seed, epoch, Stream::Flush(u32::MAX)),
            &mut partial,
        );
        let mut batches = Batches::default();
        for &b in &partial {
            batches.extend(&cuts[b], cuts[b].complete..cuts[b].len());
        }
        let derived = Derived::new(&batches, self.config);
        // Batch numbers fit in u32 (at most one per bucket).
        #[allow(clippy::cast_possible_truncation)]
        let in_order: Vec<u32> = (0..batches.len() as u32).collect();
        place(&batches, &derived, &in_order, shuffled, out, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buckets::Buckets;
    use crate::config::Batching;

    /// A former over `lengths` with `edges` and `batching`, and its rules.
    fn with_former<T>(
        lengths: &[u32],
        edges: Vec<u32>,
        batching: Batching,
        test: impl FnOnce(&Former<'_, u32>, &Rules) -> T,
    ) -> T {
        let config = Config::new(batching);
        let buckets = Buckets::from_edges(edges).expect("valid edges");
        let longest = lengths.iter().copied().max().unwrap_or(1);
        let rules = Rules::new(&buckets, &config, longest, longest);
        let bucket_capacity: Vec<u32> = (0..buckets.count()).map(|_| u32::MAX).collect();
        let former = Former {
            lengths,
            config: &config,
            rules: &rules,
            bucket_capacity: &bucket_capacity,
            companion_min: usize::MAX,
            general_only: false,
            shortest: 1,
        };
        test(&former, &rules)
    }

    /// Rows `0..` with `lengths`, in that order, as the epoch buffer holds them.
    fn in_row_order(lengths: &[u32]) -> Vec<u64> {
        (0u32..)
            .zip(lengths)
            .map(|(r, &l)| u64::from(r) << 32 | u64::from(l))
            .collect()
    }

    fn pairs(rows_and_lengths: &[(u32, u32)]) -> Vec<u64> {
        rows_and_lengths
            .iter()
            .map(|&(r, l)| u64::from(r) << 32 | u64::from(l))
            .collect()
    }

    #[test]
    fn rows_are_grouped_by_bucket_in_row_order_with_their_lengths() {
        let lengths = [30u32, 5, 12, 7, 40, 1];
        with_former(&lengths, vec![0, 10, 50], Batching::Rows(2), |_, rules| {
            let by = ByBucket::new(&lengths[..], rules, 2);
            assert_eq!(by.starts, [0, 3, 6]);
            assert_eq!(
                by.pairs,
                pairs(&[(1, 5), (3, 7), (5, 1), (0, 30), (2, 12), (4, 40)])
            );
        });
    }

    #[test]
    fn cut_closes_batches_as_the_budget_rule_says() {
        // Budget 100: a batch holds rows × longest ≤ 100.
        let lengths = [30u32, 20, 40, 50, 10, 60, 25];
        with_former(&lengths, vec![0, 60], Batching::Tokens(100), |former, _| {
            let cut = former.cut(&in_row_order(&lengths), 10);
            // [30, 20] closes when 40 arrives (3 × 40 > 100); [40, 50] is full (no third row of
            // ≥ 50 fits); [10] closes when 60 arrives (2 × 60 > 100); [60] is full on its own;
            // [25] is what is left at the end.
            assert_eq!(cut.starts, [10, 12, 14, 15, 16]);
            assert_eq!(cut.ends, [12, 14, 15, 16, 17]);
            assert_eq!(cut.longest, [30, 50, 10, 60, 25]);
            assert_eq!(cut.tokens, [50, 90, 10, 60, 25]);
            assert_eq!(cut.complete, 4, "the last batch is the partial one");
        });
    }

    #[test]
    fn cut_by_rows_fills_every_batch_but_the_last() {
        let lengths: Vec<u32> = (1..=7).collect();
        with_former(&lengths, vec![0, 7], Batching::Rows(3), |former, _| {
            let order = in_row_order(&lengths);
            let cut = former.cut(&order, 0);
            assert_eq!(cut.ends, [3, 6, 7]);
            assert_eq!(cut.complete, 2);
            // Exactly full: no partial batch.
            let cut = former.cut(&order[..6], 0);
            assert_eq!((cut.ends.as_slice(), cut.complete), (&[3u32, 6][..], 2));
        });
    }

    #[test]
    fn derived_figures_follow_the_batches() {
        let batches = Batches {
            starts: vec![0, 3],
            ends: vec![3, 5],
            longest: vec![10, 7],
            tokens: vec![25, 13],
            complete: 2,
        };
        let config = Config {
            pad_to_multiple_of: 4,
            ..Config::new(Batching::Tokens(64))
        };
        let derived = Derived::new(&batches, &config);
        assert_eq!(derived.mean, [8, 6], "⌊25 / 3⌋, ⌊13 / 2⌋");
        assert_eq!(derived.padded, [36, 16], "3 × 12, 2 × 8");
        assert_eq!(derived.cost, [36.0, 16.0]);
    }
}

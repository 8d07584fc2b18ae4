//! A shuffled bucket cut into batches as runs of the epoch buffer ([`Batches`], through the rule
//! with [`Run`] keeping the open batch), what ordering needs of them ([`Derived`]), and their rows
//! written in training order ([`place`]); rows grouped by bucket before cutting
//! ([`group_by_bucket`]). Forming bucket by bucket (`by_bucket.rs`) and re-forming trimmed rows
//! (`trim.rs`) both cut here.

use crate::lengths::Length;
use crate::plan::config::Config;
use crate::plan::form::batches::{mean_length, Formed};
use crate::plan::form::rule::{take, Filling, OpenBatches};
use crate::plan::form::stream::Former;
use crate::plan::rules::{table_entry_parts, Rules};

/// The row of a pair.
#[inline]
pub(crate) fn row_of(pair: u64) -> u32 {
    // The high half is the row.
    #[allow(clippy::cast_possible_truncation)]
    let row = (pair >> 32) as u32;
    row
}

/// The length of a pair.
#[inline]
pub(crate) fn length_of(pair: u64) -> u32 {
    // The low half is the length.
    #[allow(clippy::cast_possible_truncation)]
    let length = pair as u32;
    length
}

/// Writes `batches` (in the epoch buffer `shuffled`, or past its end in `spill`: the rows that
/// `trim.rs` re-formed) into `out` in `sequence` order, the first `main` of them staying in place:
/// where each batch goes is computed first, then the rows move in formation order, reading the
/// buffer front to back and writing at random, which does not stall as random reads would
/// (measured).
pub(crate) fn place(
    batches: &Batches,
    derived: &Derived,
    sequence: &[u32],
    (shuffled, spill): (&[u64], &[u64]),
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
    let base = shuffled.len();
    for ((&s, &e), &d) in batches.starts.iter().zip(&batches.ends).zip(&dest) {
        let (s, e, d) = (s as usize, e as usize, d as usize);
        let pairs = if s < base {
            &shuffled[s..e]
        } else {
            &spill[s - base..e - base]
        };
        for (slot, &pair) in out[d..d + e - s].iter_mut().zip(pairs) {
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
pub(crate) struct Batches {
    pub(crate) starts: Vec<u32>,
    pub(crate) ends: Vec<u32>,
    pub(crate) longest: Vec<u32>,
    pub(crate) tokens: Vec<u64>,
    /// Batches closed by the rule; a last, partial one may follow (a bucket's).
    pub(crate) complete: usize,
}

impl Batches {
    pub(crate) fn with_capacity(room: usize) -> Self {
        Self {
            starts: Vec::with_capacity(room),
            ends: Vec::with_capacity(room),
            longest: Vec::with_capacity(room),
            tokens: Vec::with_capacity(room),
            complete: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Rows of batches `range`, which are contiguous in a bucket.
    pub(crate) fn rows(&self, range: std::ops::Range<usize>) -> usize {
        if range.is_empty() {
            0
        } else {
            (self.ends[range.end - 1] - self.starts[range.start]) as usize
        }
    }

    /// Records a batch over `start..end` whose longest row has `longest` tokens, `tokens` in all.
    #[inline]
    pub(crate) fn close(&mut self, (start, end): (usize, usize), longest: u32, tokens: u64) {
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
    pub(crate) fn extend(&mut self, other: &Batches, range: std::ops::Range<usize>) {
        self.starts.extend_from_slice(&other.starts[range.clone()]);
        self.ends.extend_from_slice(&other.ends[range.clone()]);
        self.longest
            .extend_from_slice(&other.longest[range.clone()]);
        self.tokens.extend_from_slice(&other.tokens[range]);
    }
}

/// A shuffled bucket's open batch: the run of the epoch buffer from `start`, as many rows long as
/// the batch, so a row joins by being counted and a batch closes by recording its bounds.
pub(crate) struct Run {
    pub(crate) fill: Filling,
    pub(crate) start: usize,
}

impl OpenBatches<Batches> for Run {
    #[inline(always)]
    fn get(&self, _: usize) -> Filling {
        self.fill
    }

    #[inline(always)]
    fn set(&mut self, _: usize, fill: Filling) {
        self.fill = fill;
    }

    #[inline(always)]
    fn join(&mut self, _: usize, _: u32, _: u32) {}

    #[inline(always)]
    fn close(&mut self, _: usize, fill: &Filling, cut: &mut Batches) {
        let end = self.start + fill.len as usize;
        cut.close((self.start, end), fill.longest, fill.tokens);
        self.start = end;
    }
}

/// What ordering and balance need of a group's batches, derived in bulk from [`Batches`].
pub(crate) struct Derived {
    /// Rows.
    pub(crate) rows: Vec<u32>,
    /// Mean row length (`arrange.rs` ranks batches by it).
    pub(crate) mean: Vec<u32>,
    /// Padded tokens.
    pub(crate) padded: Vec<u64>,
    /// Cost for rank balance (`Config::batch_cost`); `f32` suffices to match costs.
    pub(crate) cost: Vec<f32>,
}

impl Derived {
    pub(crate) fn new(batches: &Batches, config: &Config) -> Self {
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
        let cost = if config.balance_cost().is_tokens() {
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

/// The pairs of `pairs` that `rules` admits, grouped by bucket in their order (a stable counting
/// sort, O(n)), and where each bucket's start: bucket `b` is `grouped[starts[b]..starts[b + 1]]`.
/// The planner's grouping of every row, and `trim.rs`'s of the rows it trims.
pub(crate) fn group_by_bucket(
    pairs: impl Iterator<Item = u64> + Clone,
    rules: &Rules,
    buckets: usize,
) -> (Vec<u64>, Vec<usize>) {
    let bucket = |pair: u64| rules.get(length_of(pair)).map(|(b, _)| b);
    let mut starts = vec![0usize; buckets + 1];
    for b in pairs.clone().filter_map(bucket) {
        starts[b + 1] += 1;
    }
    for b in 0..buckets {
        starts[b + 1] += starts[b];
    }
    let mut next = starts.clone();
    let mut grouped = vec![0u64; starts[buckets]];
    for pair in pairs {
        if let Some(b) = bucket(pair) {
            grouped[next[b]] = pair;
            next[b] += 1;
        }
    }
    (grouped, starts)
}

impl<L: Length> Former<'_, L> {
    /// Cuts one shuffled bucket, `rows` at `first` of the epoch buffer, into batches front to back:
    /// a batch closes when the next row would break the rule, or when it is full (no row of the
    /// bucket could join), exactly as the general stream closes it.
    pub(crate) fn cut(&self, pairs: &[u64], first: usize) -> Batches {
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
        let mut run = Run {
            fill: Filling::EMPTY,
            start: first,
        };
        for &pair in pairs {
            let length = length_of(pair);
            take(&mut run, &mut cut, 0, fits(length), (row_of(pair), length));
        }
        cut.complete = cut.len();
        if run.fill.len > 0 {
            let fill = run.fill;
            run.close(0, &fill, &mut cut);
        }
        cut
    }
}

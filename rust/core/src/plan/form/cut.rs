//! A shuffled bucket cut into batches as runs of the epoch buffer ([`Batches`], through the rule
//! with [`Run`] keeping the open batch), what ordering needs of them ([`Derived`]), and their rows
//! written in training order ([`place`]).

use crate::plan::config::Config;
use crate::plan::form::batches::{mean_length, Formed};
use crate::plan::form::rule::{Filling, OpenBatches};

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

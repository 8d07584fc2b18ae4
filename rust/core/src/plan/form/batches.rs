//! The batches a forming pass records: [`Formed`] for one stream (a group of the epoch, or a
//! bucket placed by `by_bucket.rs`), and the whole [`Epoch`] they are concatenated into.

use crate::lengths::to_usize;
use crate::plan::balance::{balance_windows, Unit};
use crate::plan::config::Config;
use crate::plan::output::offset;
use crate::plan::split::reorder_region;

/// The batches of one stream, in training order, written into its slice of the permutation buffer.
/// Offsets are relative to the slice and `u32` (a slice never holds more rows than that): at 100M
/// samples this halves the largest temporary of the plan.
pub(crate) struct Formed {
    pub(crate) offsets: Vec<u32>,
    pub(crate) written: usize,
    padded_tokens: u64,
    /// The mean row length of each batch (real tokens / rows, rounded down): `arrange.rs` ranks
    /// batches by it to order them.
    pub(crate) mean: Vec<u32>,
    /// The cost of each batch (`Config::batch_cost`), for rank balance (`balance.rs`); `f32` is
    /// ample for matching costs and halves the array.
    pub(crate) cost: Vec<f32>,
    /// Batches that stay in the group's place; those after them go to the epoch's tail (see
    /// [`Epoch`]).
    pub(crate) main: usize,
    /// Whether `mean` and `cost` are recorded (see [`Formed::new`]).
    ranked: bool,
    /// Packed streams: samples of the rows still open at the end, packed again with every other
    /// stream's at the end of the epoch (`pack.rs`).
    pub(crate) leftover: Vec<u32>,
}

impl Formed {
    /// Records a padded batch with `rows` rows written up to `end`, whose longest row has `longest`
    /// tokens and whose rows hold `tokens` in all.
    #[inline]
    pub(crate) fn close(
        &mut self,
        end: usize,
        rows: usize,
        longest: u32,
        tokens: u64,
        config: &Config,
    ) {
        let padded_tokens = rows as u64 * config.padded(longest);
        let cost = || {
            // Costs are matched, not summed: f32 precision is plenty.
            #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
            let cost = if config.balance_cost().is_tokens() {
                padded_tokens as f32
            } else {
                config.batch_cost(rows as u64, longest) as f32
            };
            cost
        };
        self.record(end, padded_tokens, mean_length(tokens, rows as u64), cost);
    }

    /// Records a batch written up to `end` that occupies `padded_tokens`, with mean row length `mean`
    /// and cost `cost()` (evaluated only when ranked).
    #[inline]
    pub(crate) fn record(
        &mut self,
        end: usize,
        padded_tokens: u64,
        mean: u64,
        cost: impl FnOnce() -> f32,
    ) {
        if self.ranked {
            self.cost.push(cost());
            // The mean is at most the longest length, a u32.
            #[allow(clippy::cast_possible_truncation)]
            self.mean.push(mean as u32);
        }
        self.written = end;
        // `end` ≤ the stream's length, which fits in u32.
        #[allow(clippy::cast_possible_truncation)]
        self.offsets.push(end as u32);
        self.padded_tokens += padded_tokens;
    }
}

impl Formed {
    /// Batches placed by `by_bucket.rs`: ends `offsets` (from 0), one cost each, `main` of them
    /// staying in place.
    pub(crate) fn placed(
        offsets: Vec<u32>,
        cost: Vec<f32>,
        padded_tokens: u64,
        main: usize,
    ) -> Self {
        Self {
            written: offsets.last().map_or(0, |&o| o as usize),
            offsets,
            padded_tokens,
            mean: Vec::new(),
            cost,
            main,
            ranked: true,
            leftover: Vec::new(),
        }
    }

    /// An empty stream; `ranked`: record each batch's mean length and cost, which only ordering and
    /// rank balance use (skipped past `ARRANGE_MAX_SAMPLES`: at 100M samples the two arrays would add
    /// ~120 MB to the plan's peak, measured).
    pub(crate) fn new(ranked: bool) -> Self {
        Self {
            offsets: vec![0],
            written: 0,
            padded_tokens: 0,
            mean: Vec::new(),
            cost: Vec::new(),
            main: 0,
            ranked,
            leftover: Vec::new(),
        }
    }
}

/// `⌊tokens / rows⌋` through a float division: exact for totals below 2^53 (the quotient's rounding
/// error is smaller than its distance to the next integer, `1 / rows`), and several times cheaper
/// than a 64-bit integer division, which cost ~2 ms an epoch at one per batch (measured).
#[inline]
pub(crate) fn mean_length(tokens: u64, rows: u64) -> u64 {
    // Both far below 2^53; the quotient is non-negative and below 2^32.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let mean = (tokens as f64 / rows as f64) as u64;
    mean
}

/// The whole epoch: the streams' batches concatenated, offsets absolute.
///
/// Rank balance matches batches inside windows of `accumulation × world_size` batches, and does it
/// while each group's rows are still in cache (right after forming it), so windows must not cross
/// group boundaries: each group keeps the largest multiple of a window of its batches in place (its
/// *main* batches), and its last few — mostly the partial batches flushed at its end — go to a *tail*
/// after every group. The epoch is then main batches in whole windows, then the tail, which is where
/// rank splitting and dropping happen and is matched on its own (`planner.rs`).
#[derive(Default)]
pub(crate) struct Epoch {
    pub(crate) offsets: Vec<u32>,
    /// The cost of each batch (see [`Formed::cost`]).
    pub(crate) cost: Vec<f32>,
    /// The first batch of the tail.
    pub(crate) tail_start: usize,
    pub(crate) written: usize,
    pub(crate) padded_tokens: u64,
    /// Packed streams' leftover samples (see [`Formed::leftover`]).
    pub(crate) leftover: Vec<u32>,
    /// The tokens of the samples formed, when whoever chose them counted them (a mixture's selection);
    /// else they are the planner's admitted tokens.
    pub(crate) tokens: Option<u64>,
    /// Rows, sizes and costs of tail batches waiting for every group to be placed.
    tail_rows: Vec<u32>,
    tail_sizes: Vec<u32>,
    tail_cost: Vec<f32>,
}

impl Epoch {
    /// An empty epoch whose offsets hold `batches` plus the splits up to the epoch's shared count
    /// without reallocating (a reallocation of the offsets cost ~2 ms of fresh pages an epoch at 1M
    /// samples, measured): a multiple of the ranks and a margin over the count epochs scatter by
    /// (`planner.rs`; ~0.1% of the batches on the seed workload). The room is capped by the batches,
    /// not sized by a world of 2^31 ranks (16 GB: an abort).
    pub(crate) fn with_room(batches: usize, world_size: u32) -> Self {
        let splits = (world_size as usize)
            .saturating_add(batches / 256 + 64)
            .min(batches + 1);
        let mut offsets = Vec::with_capacity(batches + 1 + splits);
        offsets.push(0);
        Self {
            offsets,
            cost: Vec::with_capacity(batches + splits),
            ..Self::default()
        }
    }

    /// Appends a stream that wrote its batches at `start` of `order`: its main batches move up to
    /// close the gap left by earlier tails and skipped samples; its tail is set aside.
    pub(crate) fn append(&mut self, order: &mut [u32], start: usize, part: Formed) {
        let batches = part.offsets.len() - 1;
        let main_rows = part.offsets[part.main] as usize;
        self.tail_rows
            .extend_from_slice(&order[start + main_rows..start + part.written]);
        for b in part.main..batches {
            self.tail_sizes.push(part.offsets[b + 1] - part.offsets[b]);
        }
        // Costs are recorded only for ranked streams (see `Formed::new`).
        let (main_cost, tail_cost) = part.cost.split_at(part.main.min(part.cost.len()));
        self.tail_cost.extend_from_slice(tail_cost);
        self.leftover.extend_from_slice(&part.leftover);
        if start != self.written {
            order.copy_within(start..start + main_rows, self.written);
        }
        let shift = offset(self.written);
        let main_ends = &part.offsets[1..=part.main];
        self.offsets.extend(main_ends.iter().map(|&o| o + shift));
        self.cost.extend_from_slice(main_cost);
        self.written += main_rows;
        self.padded_tokens += part.padded_tokens;
    }

    /// Appends the closed rows of a stream that lives in its own buffer `rows` after everything
    /// placed so far (the packed leftovers).
    pub(crate) fn push_rows(&mut self, order: &mut [u32], rows: &[u32], part: Formed) {
        order[self.written..self.written + part.written].copy_from_slice(&rows[..part.written]);
        let shift = offset(self.written);
        self.offsets
            .extend(part.offsets[1..].iter().map(|&o| o + shift));
        self.cost.extend_from_slice(&part.cost);
        self.written += part.written;
        self.padded_tokens += part.padded_tokens;
    }

    /// Matches the ranks of the tail's windows (the main batches were matched while forming) and
    /// moves its rows; the tail is small (mostly each group's flushed partial batches).
    pub(crate) fn balance_tail(&mut self, order: &mut [u32], config: &Config, epoch: u64) {
        let batches = self.offsets.len() - 1;
        let start = self.tail_start.min(batches);
        // Batch numbers fit in u32: at most one batch per sample.
        #[allow(clippy::cast_possible_truncation)]
        let mut sequence: Vec<u32> = (0..(batches - start) as u32).collect();
        balance_windows(
            &mut sequence,
            &self.cost[start..],
            config,
            epoch,
            Unit::Tail,
        );
        let mut ends = Vec::with_capacity(sequence.len());
        let offsets = &self.offsets;
        let bound = |i: usize| to_usize(offsets[start + i]);
        reorder_region(order, bound, &sequence, |_, end| ends.push(offset(end)));
        let tail_cost: Vec<f32> = sequence
            .iter()
            .map(|&id| self.cost[start + id as usize])
            .collect();
        self.offsets[start + 1..].copy_from_slice(&ends);
        self.cost[start..].copy_from_slice(&tail_cost);
    }

    /// Places the tail after every group's main batches.
    pub(crate) fn finish(&mut self, order: &mut [u32]) {
        self.tail_start = self.offsets.len() - 1;
        let end = self.written + self.tail_rows.len();
        order[self.written..end].copy_from_slice(&self.tail_rows);
        for &size in &self.tail_sizes {
            self.written += size as usize;
            self.offsets.push(offset(self.written));
        }
        self.cost.append(&mut self.tail_cost);
        self.tail_rows = Vec::new();
        self.tail_sizes = Vec::new();
    }
}

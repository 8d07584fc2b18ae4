//! One epoch's batches for all ranks, in training order, in CSR form, with its statistics.
//!
//! Batch `i` is `indices[offsets[i]..offsets[i + 1]]`; step `s` on rank `r` of `world_size` ranks is
//! batch `s * world_size + r`. Two flat vectors instead of a `Vec<Vec<u32>>` keep an epoch of a million
//! samples in two allocations and let the Python binding hand them to numpy without copying.

use crate::error::{ErrorKind, Result};
use crate::lengths::to_usize;
use crate::lengths::{with_lengths, Lengths};

/// Figures that describe a plan. Token counts use the padded length of each batch:
/// `rows × round_up(longest row, pad_to_multiple_of)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Batches in the plan, all ranks together.
    pub batches: u64,
    /// Steps per rank (`batches / world_size`).
    pub steps: u64,
    /// Samples in the plan.
    pub samples: u64,
    /// Sum of the lengths of the planned samples.
    pub real_tokens: u64,
    /// Sum over batches of rows × padded longest row.
    pub padded_tokens: u64,
    /// Samples left out because they exceed `max_tokens` (`oversize="skip"`).
    pub skipped: u64,
    /// Samples left out with the batches dropped by `drop_last`.
    pub dropped: u64,
    /// Batches dropped by `drop_last`.
    pub dropped_batches: u64,
    /// Batches split in two (or more) so every rank gets the same number of steps.
    pub split_batches: u64,
    /// Extra forming passes this epoch took to stay within the step count every epoch shares (0 in
    /// nearly every epoch; 17 means it reused epoch 0's draws).
    pub reformed: u64,
    /// Number of length buckets.
    pub buckets: u64,
    /// Fewest rows in a batch.
    pub min_rows: u64,
    /// Most rows in a batch.
    pub max_rows: u64,
}

impl Stats {
    /// Padding efficiency: real tokens / padded tokens (1.0 means no padding at all).
    pub fn efficiency(&self) -> f64 {
        if self.padded_tokens == 0 {
            return 0.0;
        }
        // Token counts stay far below 2^53 in practice; the ratio is a report, not an exact value.
        #[allow(clippy::cast_precision_loss)]
        let ratio = self.real_tokens as f64 / self.padded_tokens as f64;
        ratio
    }
}

/// An epoch's plan: every batch of every rank in training order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    offsets: Vec<u32>,
    indices: Vec<u32>,
    world_size: u32,
    epoch: u64,
    stats: Stats,
}

impl Plan {
    /// Assembles a plan; the planner guarantees `offsets` is monotone, starts at 0 and ends at
    /// `indices.len()`, and that the batch count is a multiple of `world_size`.
    pub(crate) fn new(
        offsets: Vec<u32>,
        indices: Vec<u32>,
        world_size: u32,
        epoch: u64,
        stats: Stats,
    ) -> Self {
        debug_assert_eq!(offsets.last().map(|&o| o as usize), Some(indices.len()));
        Self {
            offsets,
            indices,
            world_size,
            epoch,
            stats,
        }
    }

    /// Number of batches, all ranks together.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// True when the plan holds no batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Batch `i` in training order.
    pub fn batch(&self, i: usize) -> Option<&[u32]> {
        let (start, end) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        self.indices.get(to_usize(start)..to_usize(end))
    }

    /// Elements of the largest padded batch `rank` runs from step `start` on (see
    /// [`largest_padded`]).
    pub fn largest_padded(
        &self,
        lengths: &Lengths,
        start: u64,
        rank: u32,
        multiple: u32,
    ) -> Result<u64> {
        let csr = (self.offsets.as_slice(), self.indices.as_slice());
        largest_padded(csr, self.world_size, lengths, (start, rank), multiple)
    }

    /// The batch that rank `rank` trains on at step `step`.
    pub fn step(&self, step: u64, rank: u32) -> Result<&[u32]> {
        check_rank(rank, self.world_size)?;
        let steps = self.stats.steps;
        let i = step
            .checked_mul(u64::from(self.world_size))
            .and_then(|i| i.checked_add(u64::from(rank)))
            .filter(|_| step < steps)
            .ok_or(ErrorKind::StepOutOfRange { step, steps })?;
        Ok(self.batch(to_usize(i)).unwrap_or_default())
    }

    /// CSR offsets, `len() + 1` of them.
    pub fn offsets(&self) -> &[u32] {
        &self.offsets
    }

    /// Sample indices of all batches, concatenated in training order.
    pub fn indices(&self) -> &[u32] {
        &self.indices
    }

    /// Ranks the plan was made for.
    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    /// The epoch this plan belongs to.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Figures about the plan.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Moves the vectors out (for zero-copy hand-over to numpy).
    pub fn into_parts(self) -> (Vec<u32>, Vec<u32>, Stats) {
        (self.offsets, self.indices, self.stats)
    }
}

/// Elements of the largest padded batch that `rank` runs from step `start` on in the plan `csr`
/// (offsets, indices) of `world_size` ranks — rows × its longest length (from `lengths`) rounded up
/// to `multiple` — or 1 when it runs none: what a buffer that holds every one of them needs. A rank
/// outside the plan's is an error.
pub fn largest_padded(
    (offsets, indices): (&[u32], &[u32]),
    world_size: u32,
    lengths: &Lengths,
    (start, rank): (u64, u32),
    multiple: u32,
) -> Result<u64> {
    check_rank(rank, world_size)?;
    lengths.check()?;
    Ok(with_lengths!(lengths, v => {
        let multiple = u64::from(multiple.max(1));
        let (world, batches) = (u64::from(world_size.max(1)), offsets.len().saturating_sub(1) as u64);
        let batch = |i: u64| {
            let (s, e) = (to_usize(offsets[to_usize(i)]), to_usize(offsets[to_usize(i) + 1]));
            indices.get(s..e).unwrap_or_default()
        };
        let largest = (start..batches / world)
            .map(|step| batch(step * world + u64::from(rank)))
            .map(|rows| {
                let longest = rows.iter().map(|&r| v.get(r as usize).map_or(0, |&l| u64::from(Into::<u32>::into(l)))).max();
                rows.len() as u64 * longest.unwrap_or(0).div_ceil(multiple) * multiple
            })
            .max();
        largest.unwrap_or(0).max(1)
    }))
}

/// `position` in a plan's indices as an offset. A plan holds at most `u32::MAX` entries (the planner
/// refuses more samples, pieces or mixture places: `too_many_samples`, `too_many_pieces`), so `u32`
/// offsets always fit and take half the bytes of `u64` ones.
#[inline]
pub(crate) fn offset(position: usize) -> u32 {
    debug_assert!(u32::try_from(position).is_ok(), "{position} entries");
    // Bounded above.
    #[allow(clippy::cast_possible_truncation)]
    let offset = position as u32;
    offset
}

/// `rank` must be one of the plan's `world_size` ranks.
fn check_rank(rank: u32, world_size: u32) -> Result<()> {
    if rank >= world_size {
        return Err(ErrorKind::RankOutOfRange { rank, world_size }.into());
    }
    Ok(())
}

/// Fewest and most rows in a batch, in one pass over the offsets.
pub(crate) fn row_range(offsets: &[u32]) -> (u64, u64) {
    let sizes = offsets.windows(2).map(|w| w[1] - w[0]);
    let (min, max) = sizes.fold((u32::MAX, 0), |(lo, hi), s| (lo.min(s), hi.max(s)));
    (u64::from(if max == 0 { 0 } else { min }), u64::from(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Plan {
        let stats = Stats {
            batches: 4,
            steps: 2,
            ..Stats::default()
        };
        Plan::new(vec![0, 2, 3, 5, 6], vec![4, 1, 0, 2, 5, 3], 2, 0, stats)
    }

    #[test]
    fn batches_and_steps_follow_the_layout() {
        let p = tiny();
        assert_eq!(p.len(), 4);
        assert_eq!(p.batch(0), Some(&[4, 1][..]));
        assert_eq!(p.batch(4), None);
        assert_eq!(p.step(1, 0).unwrap(), &[2, 5]);
        assert_eq!(p.step(1, 1).unwrap(), &[3]);
        assert_eq!(
            p.step(2, 0).unwrap_err().kind(),
            &ErrorKind::StepOutOfRange { step: 2, steps: 2 }
        );
    }

    #[test]
    fn efficiency_is_real_over_padded() {
        let s = Stats {
            real_tokens: 3,
            padded_tokens: 4,
            ..Stats::default()
        };
        assert!((s.efficiency() - 0.75).abs() < 1e-12);
        assert!(Stats::default().efficiency().abs() < 1e-12);
    }
}

//! Rank balance on a formed epoch: equal step counts without repeating or losing samples.
//!
//! Every rank must run the same number of steps, or the ranks that finish first hang in the next
//! collective. Batches arrive here already in training order as CSR (see [`crate::planner`]).
//!
//! * `drop_last=false`: the batch count is raised to a multiple of `world_size` by *splitting*
//!   batches — the one with the most rows first (ties: the earliest), into near-equal contiguous parts.
//!   Splitting only inserts offsets; no index moves. At most `world_size − 1` extra batches appear, so
//!   the cost to padding efficiency is negligible.
//! * `drop_last=true`: the last `batches mod world_size` batches are dropped and counted.
//!
//! Rejected: padding the last step with repeated samples (`DistributedSampler`'s choice), which
//! double-counts samples in the loss and makes "samples seen" differ from the dataset size.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::error::{ErrorKind, Result};

/// Splits batches in place until their count is a multiple of `world_size`.
///
/// `offsets` is the CSR of the epoch. `cost(members)` prices a batch; the return value is
/// `(batches split, total cost before, total cost after)` over the batches that changed.
pub fn split_for_ranks(
    offsets: &mut Vec<u64>,
    indices: &[u32],
    world_size: u32,
    cost: impl Fn(&[u32]) -> u64,
) -> Result<(u64, u64, u64)> {
    let batches = offsets.len() - 1;
    let world = world_size as usize;
    let needed = (world - batches % world) % world;
    if needed == 0 {
        return Ok((0, 0, 0));
    }
    let rows = |i: usize| offsets[i + 1] - offsets[i];
    let parts = choose_parts(batches, needed, rows).ok_or_else(|| {
        let samples = indices.len();
        ErrorKind::TooFewSamplesForRanks {
            samples,
            world_size,
        }
    })?;
    let members = |s: u64, e: u64| &indices[to_usize(s)..to_usize(e)];
    let (mut before, mut after) = (0, 0);
    for &(i, p) in &parts {
        before += cost(members(offsets[i], offsets[i + 1]));
        after += part_bounds(offsets[i], offsets[i + 1], p)
            .map(|(s, e)| cost(members(s, e)))
            .sum::<u64>();
    }
    expand(offsets, &parts, needed);
    Ok((parts.len() as u64, before, after))
}

/// Which batches to split and into how many parts: `(batch, parts)` sorted by batch, or `None` when
/// there are not enough rows. Only the `needed` largest batches can ever be chosen, so the heap holds
/// just those.
fn choose_parts(
    batches: usize,
    needed: usize,
    rows: impl Fn(usize) -> u64,
) -> Option<Vec<(usize, u64)>> {
    // Max-heap on the largest part; `Reverse(index)` breaks ties toward the earliest batch.
    let mut top: BinaryHeap<Reverse<(u64, Reverse<usize>)>> = BinaryHeap::with_capacity(needed + 1);
    for i in 0..batches {
        let entry = Reverse((rows(i), Reverse(i)));
        // Most batches lose to the current `needed`-th largest: one comparison, no heap traffic.
        if top.len() == needed && top.peek().is_some_and(|smallest| entry >= *smallest) {
            continue;
        }
        top.push(entry);
        if top.len() > needed {
            top.pop();
        }
    }
    let mut heap: BinaryHeap<(u64, Reverse<usize>, u64)> =
        top.into_iter().map(|Reverse((r, i))| (r, i, 1)).collect();
    for _ in 0..needed {
        let (largest, Reverse(i), parts) = heap.pop()?;
        if largest < 2 {
            return None;
        }
        heap.push((rows(i).div_ceil(parts + 1), Reverse(i), parts + 1));
    }
    let mut chosen: Vec<(usize, u64)> = heap
        .into_iter()
        .filter(|&(_, _, p)| p > 1)
        .map(|(_, Reverse(i), p)| (i, p))
        .collect();
    chosen.sort_unstable();
    Some(chosen)
}

/// The `(start, end)` of each of `parts` near-equal pieces of `start..end` (larger pieces first).
fn part_bounds(start: u64, end: u64, parts: u64) -> impl Iterator<Item = (u64, u64)> {
    let (base, extra) = ((end - start) / parts, (end - start) % parts);
    (0..parts).scan(start, move |s, p| {
        let e = *s + base + u64::from(p < extra);
        let piece = (*s, e);
        *s = e;
        Some(piece)
    })
}

/// Rewrites `offsets` in place with the split points of `parts` (sorted by batch), walking from the
/// back: the unsplit batches between two splits move up as one block (`copy_within`, memory speed:
/// a per-offset loop cost ~4M instructions an epoch on the seed workload), so every old offset is
/// read before its slot is overwritten.
fn expand(offsets: &mut Vec<u64>, parts: &[(usize, u64)], needed: usize) {
    let batches = offsets.len() - 1;
    offsets.resize(batches + 1 + needed, 0);
    let mut shift = needed; // where old offsets after the current split move: up by the parts left
    let mut tail = batches + 1; // old offsets `i + 2..tail` follow split batch `i` and are unplaced
    for &(i, p) in parts.iter().rev() {
        offsets.copy_within(i + 2..tail, i + 2 + shift);
        let (start, end) = (offsets[i], offsets[i + 1]);
        let extra = to_usize(p) - 1;
        let first = i + 1 + shift - extra;
        for (k, (_, e)) in part_bounds(start, end, p).enumerate() {
            offsets[first + k] = e;
        }
        shift -= extra;
        tail = i + 1; // old offset `i + 1` (this batch's end) is placed; `i` is the previous end
    }
}

/// What [`drop_remainder`] removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// Batches dropped.
    pub batches: u64,
    /// Their rows: a range of the plan's indices, at its end.
    pub rows: std::ops::Range<usize>,
    /// Their total cost.
    pub cost: u64,
}

/// Truncates the epoch's offsets to a multiple of `world_size` batches; `cost` prices what is dropped.
pub fn drop_remainder(
    offsets: &mut Vec<u64>,
    indices: &[u32],
    world_size: u32,
    cost: impl Fn(&[u32]) -> u64,
) -> Dropped {
    let batches = offsets.len() - 1;
    let keep = batches - batches % world_size as usize;
    let rows = to_usize(offsets[keep])..to_usize(offsets[batches]);
    let cost = offsets[keep..]
        .windows(2)
        .map(|w| cost(&indices[to_usize(w[0])..to_usize(w[1])]))
        .sum();
    offsets.truncate(keep + 1);
    Dropped {
        batches: (batches - keep) as u64,
        rows,
        cost,
    }
}

/// Offsets index a `Vec` in memory, so they always fit in `usize`.
fn to_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(offsets: &[u64]) -> Vec<u64> {
        offsets.windows(2).map(|w| w[1] - w[0]).collect()
    }

    #[test]
    fn splits_largest_batches_into_near_equal_parts() {
        let indices: Vec<u32> = (0..10).collect();
        let mut offsets = vec![0, 2, 7, 10];
        let rows = |m: &[u32]| m.len() as u64;
        let got = split_for_ranks(&mut offsets, &indices, 5, rows).unwrap();
        // Two more batches are needed. The 5-row batch splits into 3+2; its 3-row part then ties with
        // the 3-row batch and, being earlier, splits again: 2+2+1.
        assert_eq!(sizes(&offsets), [2, 2, 2, 1, 3]);
        assert_eq!(offsets, [0, 2, 4, 6, 7, 10]);
        assert_eq!(got, (1, 5, 5));
    }

    #[test]
    fn splits_several_batches() {
        let indices: Vec<u32> = (0..12).collect();
        let mut offsets = vec![0, 4, 8, 9, 12];
        split_for_ranks(&mut offsets, &indices, 3, |m| m.len() as u64).unwrap();
        assert_eq!(sizes(&offsets), [2, 2, 2, 2, 1, 3]);
    }

    #[test]
    fn no_split_when_already_a_multiple() {
        let mut offsets = vec![0, 1, 2];
        let got = split_for_ranks(&mut offsets, &[0, 1], 2, |m| m.len() as u64).unwrap();
        assert_eq!((offsets, got), (vec![0, 1, 2], (0, 0, 0)));
    }

    #[test]
    fn too_few_samples_is_an_error() {
        let err = split_for_ranks(&mut vec![0, 2], &[0, 1], 4, |m| m.len() as u64).unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::TooFewSamplesForRanks {
                samples: 2,
                world_size: 4
            }
        );
    }

    #[test]
    fn drop_remainder_keeps_a_multiple() {
        let mut offsets = vec![0, 1, 3, 4, 6, 7, 9, 10];
        let indices: Vec<u32> = (0..10).collect();
        let dropped = drop_remainder(&mut offsets, &indices, 3, |m| 10 * m.len() as u64);
        assert_eq!(
            dropped,
            Dropped {
                batches: 1,
                rows: 9..10,
                cost: 10
            }
        );
        assert_eq!(offsets, [0, 1, 3, 4, 6, 7, 9]);
    }
}

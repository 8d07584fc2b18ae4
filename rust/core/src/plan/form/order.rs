//! A streamed group's batches put in training order while its rows are in cache: arranged
//! (`arrange.rs`), chosen for a mixture's sources (`choose.rs`), matched for rank balance
//! window by window (`balance.rs`), and the rows moved once.

use crate::lengths::Length;
use crate::plan::arrange::arrange;
use crate::plan::balance::{balance_windows, Unit};
use crate::plan::form::batches::Formed;
use crate::plan::form::stream::Former;
use crate::plan::split::reorder_region;

impl<L: Length> Former<'_, L> {
    /// Puts a formed group's batches in training order (`arrange.rs`, unless `arranged`: rows
    /// composed by cost come in their order), matches its main batches' ranks window by window
    /// (`balance.rs`), and moves the rows once, while they are in cache.
    pub(super) fn arrange_and_balance(
        &self,
        piece: &mut [u32],
        formed: &mut Formed,
        complete: usize,
        (epoch, group): (u64, u32),
        arranged: bool,
    ) {
        let config = self.config;
        let batches = formed.offsets.len() - 1;
        let mut sequence = if arranged {
            // Batch counts fit in u32 (one batch per sample at most).
            #[allow(clippy::cast_possible_truncation)]
            let sequence = (0..batches as u32).collect();
            sequence
        } else {
            let (order, seed) = (config.order, config.seed);
            arrange(&formed.mean, batches, complete, order, seed, epoch, group)
        };
        self.choose(
            piece,
            &formed.offsets,
            &mut sequence[..complete.min(batches)],
        );
        formed.main = sequence.len() / config.window() * config.window();
        // Cost classes regroup the whole epoch later and need the stratified order as it is: any
        // stretch of it mixes well, where a window matched here mixes well only as a whole.
        let main = &mut sequence[..formed.main];
        balance_windows(main, &formed.cost, config, epoch, Unit::Group(group));
        formed.offsets = reorder_batches(piece, &formed.offsets, &sequence);
        formed.cost = sequence
            .iter()
            .map(|&id| formed.cost[id as usize])
            .collect();
        // Means were only needed to choose the order.
        formed.mean.clear();
    }

    /// Batches left in formation order (not arranged): with a mixture's sources, its complete ones
    /// chosen for them all the same, and the rows moved once.
    pub(super) fn choose_in_place(&self, piece: &mut [u32], formed: &mut Formed, complete: usize) {
        if self.labels.is_none() {
            return;
        }
        // Batches count fit u32 (one per sample at most).
        #[allow(clippy::cast_possible_truncation)]
        let mut sequence: Vec<u32> = (0..formed.offsets.len() as u32 - 1).collect();
        self.choose(piece, &formed.offsets, &mut sequence[..complete]);
        formed.offsets = reorder_batches(piece, &formed.offsets, &sequence);
    }

    /// With a mixture's sources, refills the places of `sequence` (complete batches of a group whose
    /// rows are `piece`, batch `i` at `offsets[i]..offsets[i + 1]`) with the batches chosen for the
    /// sources (`choose.rs`), by mean length among their neighbours. Epochs too large to
    /// arrange count each batch's samples by source and rank batches by their rows instead: their
    /// lengths would be random reads of the whole epoch's (3.6 of a 4.3 s epoch at 100M samples,
    /// measured), and the samples of a bucket's batch are alike in length.
    fn choose(&self, piece: &[u32], offsets: &[u32], sequence: &mut [u32]) {
        let Some(labels) = self.labels else {
            return;
        };
        let batches = offsets.len() - 1;
        let mut parts = labels.parts(batches);
        let mut mean = Vec::with_capacity(batches);
        if !self.arranged {
            for (b, bounds) in offsets.windows(2).enumerate() {
                let rows = &piece[bounds[0] as usize..bounds[1] as usize];
                parts.add_batch(b, rows.iter().map(|&r| (r, 1)));
                // Rows of a batch fit u32 (its offsets do).
                #[allow(clippy::cast_possible_truncation)]
                mean.push(rows.len() as u32);
            }
            parts.choose(sequence, &mean);
            return;
        }
        // The lengths first, in one pass of independent loads that overlap (looked up inside the
        // counting, each waited on its own: the most of a 100M-sample epoch, measured).
        let rows = &piece[..offsets[batches] as usize];
        let lengths: Vec<u32> = rows
            .iter()
            .map(|&r| self.lengths[r as usize].into())
            .collect();
        for (b, bounds) in offsets.windows(2).enumerate() {
            let range = bounds[0] as usize..bounds[1] as usize;
            let own = &lengths[range.clone()];
            let tokens: u64 = own.iter().map(|&l| u64::from(l)).sum();
            parts.add_batch(b, rows[range].iter().copied().zip(own.iter().copied()));
            // A mean is at most the longest length, a u32.
            #[allow(clippy::cast_possible_truncation)]
            mean.push((tokens / own.len().max(1) as u64) as u32);
        }
        parts.choose(sequence, &mean);
    }
}

/// Moves the batches of `piece` (batch `i` at `offsets[i]..offsets[i + 1]`) into the order of
/// `sequence`, once; returns their new offsets.
fn reorder_batches(piece: &mut [u32], offsets: &[u32], sequence: &[u32]) -> Vec<u32> {
    let mut moved = Vec::with_capacity(offsets.len());
    moved.push(0u32);
    let bound = |i: usize| offsets[i] as usize;
    reorder_region(piece, bound, sequence, |_, end| {
        // Rows of a group fit in u32 (formed offsets are u32 already).
        #[allow(clippy::cast_possible_truncation)]
        moved.push(end as u32);
    });
    moved
}

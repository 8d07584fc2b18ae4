//! **Split for ranks** and **output**: a formed epoch brought to the batch count every epoch shares
//! (`steps.rs`) — tail batches split, or dropped under `drop_last` (`split.rs`) — its ranks balanced
//! (`balance.rs`), and the [`Plan`] assembled with its [`Stats`] (`output.rs`).

use crate::error::{ErrorKind, Result};
use crate::lengths::{to_usize, Length};
use crate::plan::balance::balance_classes;
use crate::plan::config::{Batching, Config, Mode};
use crate::plan::output::{row_range, Plan, Stats};
use crate::plan::split::{drop_to, expand_per_batch, gather, split_to};
use crate::plan::steps::FormedEpoch;

/// What an epoch's stats count besides its own batches.
pub(crate) struct Totals {
    /// Tokens of every sample planned (a mixture's epoch counts its own selection's).
    pub(crate) admitted_tokens: u64,
    /// Rows left out of every plan for not fitting a batch.
    pub(crate) skipped: u64,
    pub(crate) buckets: u64,
}

/// Brings a formed epoch to the `target` batches every epoch has (splitting tail batches, or dropping
/// them under `drop_last`), balances its ranks (whole steps under `balance_tolerance`, else the
/// tail), and assembles the [`Plan`] of `epoch` and its [`Stats`].
pub(crate) fn split_for_ranks<L: Length>(
    (lengths, config): (&[L], &Config),
    formed: FormedEpoch,
    target: usize,
    (arranged, pool): (bool, Option<&rayon::ThreadPool>),
    totals: &Totals,
    epoch: u64,
) -> Result<Plan> {
    let FormedEpoch {
        mut order,
        epoch: mut formed,
        key: epoch_key,
        reformed,
    } = formed;
    let world_size = config.world_size;
    let mut real_tokens = formed.tokens.unwrap_or(totals.admitted_tokens);
    let cost = |members: &[u32]| batch_cost(config, lengths, members);
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
                let cost = config.batch_cost(rows.len() as u64, longest.unwrap_or(0)) as f32;
                cost
            });
        }
    }
    if config.shuffle && arranged {
        if let Some(ppm) = config.balance_tolerance_ppm {
            // Batch numbers fit in u32: at most one batch per sample.
            #[allow(clippy::cast_possible_truncation)]
            let mut sequence: Vec<u32> = (0..formed.cost.len() as u32).collect();
            balance_classes(&mut sequence, &formed.cost, config, ppm, epoch_key, pool);
            let rows;
            (rows, formed.offsets) = gather(&order, &formed.offsets, &sequence, Vec::new(), pool);
            order = rows;
        } else {
            formed.balance_tail(&mut order, config, epoch_key);
        }
    }
    let batches = (formed.offsets.len() - 1) as u64;
    if batches == 0 {
        let samples = formed.written;
        return Err(ErrorKind::TooFewSamplesForRanks {
            samples,
            world_size,
            drop_last: config.drop_last,
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
        skipped: totals.skipped,
        dropped,
        dropped_batches,
        split_batches,
        reformed,
        buckets: totals.buckets,
        min_rows,
        max_rows,
    };
    Ok(Plan::new(formed.offsets, order, world_size, epoch, stats))
}

/// Padded tokens of a batch with these members (a packed row: its capacity).
fn batch_cost<L: Length>(config: &Config, lengths: &[L], members: &[u32]) -> u64 {
    if let (Mode::Packed { .. }, Batching::Tokens(capacity)) = (config.mode, config.batching) {
        // A packed row occupies the whole row, filled or not.
        return capacity;
    }
    let longest = members
        .iter()
        .map(|&r| lengths[r as usize].into())
        .max()
        .unwrap_or(0);
    members.len() as u64 * config.padded(longest)
}

/// Sum of the lengths of `rows`.
fn tokens_of<L: Length>(lengths: &[L], rows: &[u32]) -> u64 {
    rows.iter()
        .map(|&r| u64::from(lengths[r as usize].into()))
        .sum()
}

//! The last resort of a mixture's epoch under a row count per batch (`batch_size`): merging batches.
//!
//! A mixture's selection is part of the epoch's key (`steps.rs`): re-forming may change the forming
//! draws, never the rows. Under `batch_size` the forming draws cannot change the batch count either —
//! each bucket of the selection is cut into full batches and one partial one — so an epoch whose
//! selection holds more partial batches than the shared count allows (~2% of epochs of a down-sampled
//! source, measured on the seed mixture) merges its smallest batches instead: first fit, smallest
//! first, into batches of at most `batch_size` rows, each merge one batch fewer, until the count is
//! reached. Merged batches mix buckets (more padding in a few batches of a rare epoch) and go to the
//! epoch's tail, where balancing places them like every tail batch. No row is added or dropped.

use crate::lengths::Length;
use crate::plan::config::Config;
use crate::plan::form::Epoch;

/// Merges batches of `formed` (rows `order`) until it has `target` batches of at most `rows` rows
/// each; `false` (nothing changed) when first fit cannot reach it.
pub(crate) fn merge_to<L: Length>(
    lengths: &[L],
    config: &Config,
    rows: u64,
    order: &mut Vec<u32>,
    formed: &mut Epoch,
    target: usize,
) -> bool {
    let offsets = &formed.offsets;
    let batches = offsets.len() - 1;
    let size = |b: usize| u64::from(offsets[b + 1] - offsets[b]);
    let mut by_size: Vec<usize> = (0..batches).collect();
    by_size.sort_by_key(|&b| (size(b), b));
    let mut bins: Vec<(Vec<usize>, u64)> = Vec::new();
    let mut merges = 0;
    for &b in &by_size {
        if merges == batches.saturating_sub(target) {
            break;
        }
        match bins.iter_mut().find(|(_, r)| r + size(b) <= rows) {
            Some(bin) => {
                bin.0.push(b);
                bin.1 += size(b);
                merges += 1;
            }
            None => bins.push((vec![b], size(b))),
        }
    }
    if batches - merges > target {
        return false;
    }
    let merged: Vec<&Vec<usize>> = bins
        .iter()
        .map(|(m, _)| m)
        .filter(|m| m.len() > 1)
        .collect();
    let mut gone = vec![false; batches];
    for &b in merged.iter().flat_map(|m| m.iter()) {
        gone[b] = true;
    }
    let span = |b: usize| formed.offsets[b] as usize..formed.offsets[b + 1] as usize;
    let (mut rows_out, mut ends, mut costs) =
        (Vec::with_capacity(order.len()), vec![0u32], Vec::new());
    let mut push = |members: Vec<u32>, rows_out: &mut Vec<u32>| {
        let longest = members
            .iter()
            .map(|&r| lengths[r as usize].into())
            .max()
            .unwrap_or(0);
        // Matched, not summed (see `Formed::cost`).
        #[allow(clippy::cast_possible_truncation)]
        costs.push(config.batch_cost(members.len() as u64, longest) as f32);
        rows_out.extend(members);
        // At most one entry per sample, which `Planner::new` keeps within u32.
        #[allow(clippy::cast_possible_truncation)]
        ends.push(rows_out.len() as u32);
    };
    for b in (0..batches).filter(|&b| !gone[b]) {
        push(order[span(b)].to_vec(), &mut rows_out);
    }
    let kept = batches - gone.iter().filter(|&&g| g).count();
    for members in &merged {
        push(
            members
                .iter()
                .flat_map(|&b| order[span(b)].iter().copied())
                .collect(),
            &mut rows_out,
        );
    }
    formed.padded_tokens = padded(lengths, config, &rows_out, &ends);
    if !formed.cost.is_empty() {
        formed.cost = costs;
    }
    formed.offsets = ends;
    formed.tail_start = formed.tail_start.min(kept);
    *order = rows_out;
    true
}

/// Padded tokens of the batches `ends` cuts `rows` into.
fn padded<L: Length>(lengths: &[L], config: &Config, rows: &[u32], ends: &[u32]) -> u64 {
    ends.windows(2)
        .map(|w| {
            let members = &rows[w[0] as usize..w[1] as usize];
            let longest = members
                .iter()
                .map(|&r| lengths[r as usize].into())
                .max()
                .unwrap_or(0);
            members.len() as u64 * config.padded(longest)
        })
        .sum()
}

//! The last resort of a mixture's padded epoch: merging batches.
//!
//! A mixture's selection is part of the epoch's key (`steps.rs`): re-forming may change the forming
//! draws, never the rows. Under `batch_size` the forming draws cannot change the batch count at all —
//! each bucket of the selection is cut into full batches and one partial one — and under a token budget
//! an epoch whose own selection forms too many batches under every draw happens too (~2% of epochs of a
//! down-sampled source under `batch_size`, measured on the seed mixture; rarer under `max_tokens`). Such
//! an epoch merges its smallest batches instead: first fit, fewest rows first, each merged batch within
//! the capacity of its longest member (`batch_size`, or the rows `max_tokens` allows at that length),
//! each merge one batch fewer, until the count is reached. Merged batches mix buckets (more padding in a
//! few batches of a rare epoch) and go to the epoch's tail, where balancing places them like every tail
//! batch. No row is added or dropped.

use crate::lengths::Length;
use crate::plan::config::Config;
use crate::plan::form::Epoch;

/// A bin of first fit: its batches, rows and longest length.
struct Bin {
    batches: Vec<usize>,
    rows: u64,
    longest: u32,
}

/// Merges batches of `formed` (rows `order`) until it has `target` batches, each within `capacity` rows
/// for its longest member's length; `false` (nothing changed) when first fit cannot reach it.
pub(crate) fn merge_to<L: Length>(
    lengths: &[L],
    config: &Config,
    capacity: impl Fn(u32) -> u64,
    order: &mut Vec<u32>,
    formed: &mut Epoch,
    target: usize,
) -> bool {
    let batches = formed.offsets.len() - 1;
    let span = |b: usize| formed.offsets[b] as usize..formed.offsets[b + 1] as usize;
    let longest_of = |members: &[u32]| -> u32 {
        members
            .iter()
            .map(|&r| lengths[r as usize].into())
            .max()
            .unwrap_or(0)
    };
    let mut by_size: Vec<usize> = (0..batches).collect();
    by_size.sort_by_key(|&b| (span(b).len(), b));
    let mut bins: Vec<Bin> = Vec::new();
    let mut merges = 0;
    for &b in &by_size {
        if merges == batches.saturating_sub(target) {
            break;
        }
        let (rows, longest) = (span(b).len() as u64, longest_of(&order[span(b)]));
        let fits = |bin: &&mut Bin| bin.rows + rows <= capacity(bin.longest.max(longest));
        if let Some(bin) = bins.iter_mut().find(fits) {
            bin.batches.push(b);
            (bin.rows, bin.longest) = (bin.rows + rows, bin.longest.max(longest));
            merges += 1;
        } else {
            bins.push(Bin {
                batches: vec![b],
                rows,
                longest,
            });
        }
    }
    if batches - merges > target {
        return false;
    }
    let merged: Vec<&Vec<usize>> = bins
        .iter()
        .map(|bin| &bin.batches)
        .filter(|m| m.len() > 1)
        .collect();
    let mut gone = vec![false; batches];
    for &b in merged.iter().flat_map(|m| m.iter()) {
        gone[b] = true;
    }
    let (mut rows_out, mut ends) = (Vec::with_capacity(order.len()), vec![0u32]);
    let (mut costs, mut padded_tokens) = (Vec::new(), 0u64);
    let mut push = |members: Vec<u32>, rows_out: &mut Vec<u32>| {
        let longest = longest_of(&members);
        // Matched, not summed (see `Formed::cost`).
        #[allow(clippy::cast_possible_truncation)]
        costs.push(config.batch_cost(members.len() as u64, longest) as f32);
        padded_tokens += members.len() as u64 * config.padded(longest);
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
        let rows = members.iter().flat_map(|&b| order[span(b)].iter().copied());
        push(rows.collect(), &mut rows_out);
    }
    formed.padded_tokens = padded_tokens;
    if !formed.cost.is_empty() {
        formed.cost = costs;
    }
    formed.offsets = ends;
    formed.tail_start = formed.tail_start.min(kept);
    *order = rows_out;
    true
}

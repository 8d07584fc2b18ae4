//! One step's batch, online: the sequences of one optimizer step (an RL step's rollouts, whose lengths are
//! known only when they end) split into micro-batches under a token budget, the same number on every
//! rank (FSDP and DDP run in lockstep), ranks balanced by a cost model. No state: the same lengths, ranks,
//! budget, cost and seed give the same split.
//!
//! 1. **Form** micro-batches from the sequences, longest first (ties in a seeded order): padded, a run of
//!    sequences while `rows × longest ≤ budget`; packed, best fit — each sequence into the open
//!    micro-batch with the least room that still holds it.
//! 2. **Equal counts**: the count is raised to a multiple of the ranks — formed again under the smallest
//!    budget that forms no more (so the micro-batches are evenly filled), then, if still short, by halving
//!    the micro-batch with the most rows (a sequence is never split, nor repeated, nor dropped).
//! 3. **Assign**, most costly first, in rounds of one micro-batch per rank: each round's costliest to the
//!    least loaded rank. Each rank gets as many; the j-th micro-batches of the ranks are alike (what a
//!    lockstep collective waits on). Then swaps between the most and least loaded ranks while one narrows
//!    the gap, and each rank's micro-batches ordered costliest first again.
//!
//! Rejected: Karmarkar–Karp differencing (verl's): near-optimal totals per rank, but with an equal count
//! per rank it needs a cardinality-aware variant, and its micro-batch order says nothing of lockstep;
//! greedy longest-first onto the least loaded rank without rounds (counts differ per rank).

use std::collections::BTreeSet;

use crate::error::{ErrorKind, Result};
use crate::plan::config::CostModel;
use crate::plan::prepare::check_lengths;
use crate::rng::{shuffle, Pcg64, Stream};

/// What the split of one step holds: micro-step `j` of rank `r` is batch `j × world_size + r` of the CSR.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSplit {
    /// CSR offsets over `indices`, `micro_batches × world_size + 1` of them.
    pub offsets: Vec<u32>,
    /// Sequence indices, batch after batch.
    pub indices: Vec<u32>,
    /// Micro-batches per rank.
    pub micro_batches: u32,
    /// Every rank's total cost.
    pub loads: Vec<f64>,
}

/// How one step's sequences are split (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSpec {
    /// Ranks.
    pub world_size: u32,
    /// Tokens a micro-batch may hold: padded tokens (`rows × longest`), or with `packed` the sum.
    pub max_tokens: u64,
    /// Whether micro-batches are packed rows (their sum within the budget) rather than padded batches.
    pub packed: bool,
    /// What a row costs, for rank balance: `a·L + b·L²` of a padded row's length, or of each packed sequence.
    pub cost: CostModel,
    /// Orders sequences of equal length.
    pub seed: u64,
}

/// Splits one step's sequences of `lengths` (see the module docs).
///
/// # Errors
/// `EmptyLengths`, `NonPositiveLength` (a zero length), `InvalidSetting` (`world_size` or `max_tokens`
/// zero), `InvalidCost`, `TooManySamples`, `SequenceOverBudget` (a sequence longer than the budget: it is
/// never split), `StepTooSmall` (the sequences cannot give every rank as many micro-batches).
pub fn split_step(lengths: &[u32], spec: &StepSpec) -> Result<StepSplit> {
    check(lengths, spec)?;
    let order = longest_first(lengths, spec.seed);
    let form = |budget: u64| {
        if spec.packed {
            best_fit(lengths, &order, budget)
        } else {
            runs(lengths, &order, budget)
        }
    };
    let mut batches = form(spec.max_tokens);
    let world = spec.world_size as usize;
    let target = batches.len().next_multiple_of(world);
    if batches.len() < target {
        // The count must rise to a multiple of the ranks anyway: formed again under the smallest budget
        // that still forms at most that many, the micro-batches come out evenly filled instead of full
        // ones and a few slivers (which a lockstep step waits on as if they were full).
        let (mut lo, mut hi) = (u64::from(lengths[order[0] as usize]), spec.max_tokens);
        let count = |budget: u64| {
            if spec.packed {
                best_fit(lengths, &order, budget).len()
            } else {
                count_runs(lengths, &order, budget)
            }
        };
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if count(mid) <= target {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        batches = form(hi);
    }
    while batches.len() < target {
        // The micro-batch with the most rows (the first such), halved; none with two rows left: too few.
        let (at, rows) = batches
            .iter()
            .enumerate()
            .map(|(i, b)| (i, b.len()))
            .max_by_key(|&(i, rows)| (rows, std::cmp::Reverse(i)))
            .unwrap_or((0, 0));
        if rows < 2 {
            return Err(ErrorKind::StepTooSmall {
                sequences: lengths.len(),
                world_size: spec.world_size,
                formed: batches.len(),
                needed: target,
            }
            .into());
        }
        let second = halve(&mut batches[at], spec.packed);
        batches.push(second);
    }
    let costs: Vec<f64> = batches.iter().map(|b| cost_of(lengths, b, spec)).collect();
    let mut ranks = assign(&costs, world);
    let loads = settle(&mut ranks, &costs);
    Ok(output(&batches, &ranks, loads))
}

fn check(lengths: &[u32], spec: &StepSpec) -> Result<()> {
    check_lengths(lengths)?;
    for (name, value) in [
        ("world_size", u64::from(spec.world_size)),
        ("max_tokens", spec.max_tokens),
    ] {
        if value == 0 {
            return Err(ErrorKind::InvalidSetting {
                name,
                value: 0,
                expected: "≥ 1",
            }
            .into());
        }
    }
    spec.cost.check("cost")?;
    for (row, &length) in lengths.iter().enumerate() {
        if u64::from(length) > spec.max_tokens {
            return Err(ErrorKind::SequenceOverBudget {
                row,
                length,
                max_tokens: spec.max_tokens,
            }
            .into());
        }
    }
    Ok(())
}

/// Sequence indices, longest first; equal lengths in a seeded order.
fn longest_first(lengths: &[u32], seed: u64) -> Vec<u32> {
    // Lengths fit u32 indices (checked).
    #[allow(clippy::cast_possible_truncation)]
    let mut order: Vec<u32> = (0..lengths.len() as u32).collect();
    shuffle(&mut Pcg64::new(seed, 0, Stream::Step), &mut order);
    order.sort_by_key(|&i| std::cmp::Reverse(lengths[i as usize]));
    order
}

/// Padded micro-batches: runs of the order while `rows × longest` (the run's first) fits.
fn runs(lengths: &[u32], order: &[u32], budget: u64) -> Vec<Vec<u32>> {
    let mut batches: Vec<Vec<u32>> = Vec::new();
    let mut longest = 0u64;
    for &i in order {
        match batches.last_mut() {
            Some(batch) if (batch.len() as u64 + 1) * longest <= budget => batch.push(i),
            _ => {
                longest = u64::from(lengths[i as usize]);
                batches.push(vec![i]);
            }
        }
    }
    batches
}

/// How many micro-batches [`runs`] forms under `budget`, without forming them.
fn count_runs(lengths: &[u32], order: &[u32], budget: u64) -> usize {
    let (mut count, mut rows, mut longest) = (0usize, 0u64, 0u64);
    for &i in order {
        if count > 0 && (rows + 1) * longest <= budget {
            rows += 1;
        } else {
            count += 1;
            rows = 1;
            longest = u64::from(lengths[i as usize]);
        }
    }
    count
}

/// Packed micro-batches, best fit decreasing: each sequence into the open one with the least room that
/// holds it (ties: the earliest), else a new one.
fn best_fit(lengths: &[u32], order: &[u32], budget: u64) -> Vec<Vec<u32>> {
    let mut batches: Vec<Vec<u32>> = Vec::new();
    let mut room: BTreeSet<(u64, usize)> = BTreeSet::new();
    for &i in order {
        let length = u64::from(lengths[i as usize]);
        let fit = room.range((length, 0)..).next().copied();
        let (left, at) = fit.unwrap_or_else(|| {
            batches.push(Vec::new());
            (budget, batches.len() - 1)
        });
        room.remove(&(left, at));
        batches[at].push(i);
        if left > length {
            room.insert((left - length, at));
        }
    }
    batches
}

/// Halves `batch` (at least two rows) in place and returns the other half: padded, its longer half stays
/// (a run stays a run); packed, every other sequence goes, so both halves keep a spread of lengths.
fn halve(batch: &mut Vec<u32>, packed: bool) -> Vec<u32> {
    if packed {
        let mut kept = Vec::with_capacity(batch.len().div_ceil(2));
        let mut moved = Vec::with_capacity(batch.len() / 2);
        for (k, &i) in batch.iter().enumerate() {
            if k % 2 == 0 { &mut kept } else { &mut moved }.push(i);
        }
        *batch = kept;
        moved
    } else {
        batch.split_off(batch.len().div_ceil(2))
    }
}

fn cost_of(lengths: &[u32], batch: &[u32], spec: &StepSpec) -> f64 {
    if spec.packed {
        batch
            .iter()
            .map(|&i| spec.cost.row(u64::from(lengths[i as usize])))
            .sum()
    } else {
        let longest = batch
            .iter()
            .map(|&i| u64::from(lengths[i as usize]))
            .max()
            .unwrap_or(0);
        // Rows are far below 2^53.
        #[allow(clippy::cast_precision_loss)]
        let rows = batch.len() as f64;
        rows * spec.cost.row(longest)
    }
}

/// Each rank's micro-batches (indices into `costs`): rounds of one per rank, costliest first, each round's
/// costliest to the least loaded rank.
fn assign(costs: &[f64], world: usize) -> Vec<Vec<usize>> {
    let mut by_cost: Vec<usize> = (0..costs.len()).collect();
    by_cost.sort_by(|&a, &b| costs[b].total_cmp(&costs[a]).then(a.cmp(&b)));
    let mut ranks: Vec<Vec<usize>> = vec![Vec::new(); world];
    let mut loads = vec![0.0f64; world];
    let mut lightest: Vec<usize> = (0..world).collect();
    for round in by_cost.chunks(world) {
        lightest.sort_by(|&a, &b| loads[a].total_cmp(&loads[b]).then(a.cmp(&b)));
        for (&batch, &rank) in round.iter().zip(&lightest) {
            ranks[rank].push(batch);
            loads[rank] += costs[batch];
        }
    }
    ranks
}

/// Swaps a micro-batch of the most loaded rank for a cheaper one of the least loaded while that narrows
/// their gap (at most a few passes: each swap strictly lowers the largest gap it sees), then orders each
/// rank's micro-batches costliest first. Returns every rank's load.
fn settle(ranks: &mut [Vec<usize>], costs: &[f64]) -> Vec<f64> {
    let load = |r: &Vec<usize>| r.iter().map(|&b| costs[b]).sum::<f64>();
    let mut loads: Vec<f64> = ranks.iter().map(load).collect();
    for _ in 0..4 * ranks.len() {
        let (hi, lo) = extremes(&loads);
        let gap = loads[hi] - loads[lo];
        // The swap that brings the two nearest half the gap apart, if it narrows it.
        let mut best: Option<(usize, usize, f64)> = None;
        for (x, &bx) in ranks[hi].iter().enumerate() {
            for (y, &by) in ranks[lo].iter().enumerate() {
                let d = costs[bx] - costs[by];
                if d > 0.0 && d < gap {
                    let after = (gap - 2.0 * d).abs();
                    if best.is_none_or(|(_, _, b)| after < b) {
                        best = Some((x, y, after));
                    }
                }
            }
        }
        let Some((x, y, after)) = best else { break };
        if after >= gap {
            break;
        }
        let (bx, by) = (ranks[hi][x], ranks[lo][y]);
        ranks[hi][x] = by;
        ranks[lo][y] = bx;
        loads[hi] = load(&ranks[hi]);
        loads[lo] = load(&ranks[lo]);
    }
    for rank in ranks.iter_mut() {
        rank.sort_by(|&a, &b| costs[b].total_cmp(&costs[a]).then(a.cmp(&b)));
    }
    loads
}

fn extremes(loads: &[f64]) -> (usize, usize) {
    let mut hi = 0;
    let mut lo = 0;
    for (r, &l) in loads.iter().enumerate() {
        if l > loads[hi] {
            hi = r;
        }
        if l < loads[lo] {
            lo = r;
        }
    }
    (hi, lo)
}

fn output(batches: &[Vec<u32>], ranks: &[Vec<usize>], loads: Vec<f64>) -> StepSplit {
    let world = ranks.len();
    let per_rank = ranks.first().map_or(0, Vec::len);
    let mut offsets = Vec::with_capacity(per_rank * world + 1);
    let mut indices = Vec::with_capacity(batches.iter().map(Vec::len).sum());
    offsets.push(0u32);
    for j in 0..per_rank {
        for rank in ranks {
            indices.extend_from_slice(&batches[rank[j]]);
            // At most one index per sequence, and sequences fit u32 (checked).
            #[allow(clippy::cast_possible_truncation)]
            offsets.push(indices.len() as u32);
        }
    }
    // Micro-batches per rank are at most the sequences, which fit u32.
    #[allow(clippy::cast_possible_truncation)]
    let micro_batches = per_rank as u32;
    StepSplit {
        offsets,
        indices,
        micro_batches,
        loads,
    }
}

#[cfg(test)]
mod tests;

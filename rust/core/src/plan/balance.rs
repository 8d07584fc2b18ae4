//! Rank balance: which of a step's `world_size` batches each rank runs, so no rank waits for another.
//!
//! A step's ranks finish when the costliest of its batches does (`Config::cost`: padded tokens by
//! default). Under a token budget, full batches still differ in cost: a batch of `k` rows of length
//! `L` costs `k·L` with `k = ⌊budget / L⌋`, anywhere in `(budget·k/(k+1), budget]` — for the seed
//! workload's 5.5K–8K-token samples (two rows) that is 0.67–1.0 of the budget. Two constructions:
//!
//! * **Inside mixing windows (default).** The batches of each window of `accumulation × world_size`
//!   (the optimizer step) are sorted by cost and cut into steps, so a step gets the window's most
//!   similar batches. Inside each step, the batches go to ranks so that every rank's sum over the
//!   window evens out — what it computes between two gradient synchronizations under DDP's
//!   `no_sync` — longest processing time first, one batch per rank per step ([`rank_order`]). Then
//!   steps and ranks are rotated at random inside the window (no rank is always the light one). A
//!   window keeps exactly its batches, so `window_tv` does not change. Seed workload, 8 ranks × 4
//!   micro-batches: p99 step imbalance 1.51 → 1.29; synchronous efficiency per micro-batch 0.966, per
//!   optimizer step 0.978 with random ranks → 0.987 longest first → 0.995 with the swaps of
//!   [`rank_order`] (0.960 → 0.978 → 0.994 under an attention price `cost=(1, 1/30720)`; measured).
//! * **Cost classes (`balance_tolerance_ppm = t`).** Batches are classed by cost in bands of ratio
//!   `1 + t` down from the costliest; each class, in stratified order, is cut into steps, and every
//!   step goes to the mean position of its batches; then windows are matched as above. Steps are
//!   within `1 + t` by construction, except the few made from leftovers (fewer than `world_size` per
//!   class). This trades mixing for balance because the cheap classes are narrow in length: the only
//!   batches costing 0.67–0.70 of a 16K budget are two rows of 5.5K–5.7K tokens, so a step of them
//!   puts a quarter of its window's tokens in one length decile. Measured on the seed workload (p99
//!   imbalance, `window_tv`): default 1.29, 0.069; t = 0.4 → 1.22, 0.093; 0.3 → 1.17, 0.101;
//!   0.15 → 1.14, 0.119; 0.1 → 1.10, 0.152; 0.05 → 1.05, 0.187.
//!
//! Rejected after prototyping: matching over super-windows of several mixing windows (p99 1.11 at
//! `window_tv` 0.17 for 4 windows) and a FIFO that defers a batch until compatible ones arrive (p99
//! 1.10 at 0.18): both are dominated by cost classes. Padding a window's costs to equal shapes is not
//! possible: a full batch of `k` rows of length `L` costs `k·L`, fixed by its samples.
//!
//! Every draw comes from a stream per forming group, the tail, or block of windows, and the classes
//! use IEEE division only (no transcendental functions), so the plan is the same for any thread count
//! or machine.

use crate::plan::config::Config;
use crate::rng::{Pcg64, Stream};
use crate::tasks::run;

/// Mixing windows per random stream and parallel task of the cost-class construction.
const WINDOWS_PER_BLOCK: usize = 256;

/// Swaps at most per window in [`even_out`]: on the seed workload (8 ranks × 4) the swaps converge
/// within 8 (the same plans as without a bound); 2 reach 0.991 of the per-step figure 8 reach 0.995
/// at, for a third of their time (single thread: +2.2 against +6 ms an epoch; measured).
const SWAPS_PER_WINDOW: usize = 8;

/// The one way forming enters rank balance: the random stream of `unit` in `epoch`, with which
/// the whole windows of `sequence` are matched by cost (unless `balance_tolerance` is set: cost
/// classes regroup the whole epoch later, in `balance_classes`). The stream is returned for the
/// work that continues it (trimmed steps spread by `trim.rs`).
pub(crate) fn balance_windows(
    sequence: &mut [u32],
    costs: &[f32],
    config: &Config,
    epoch: u64,
    unit: Unit,
) -> Pcg64 {
    let mut rng = Pcg64::new(config.seed, epoch, balance_stream(unit));
    if config.balance_tolerance_ppm.is_none() {
        match_windows(sequence, costs, config, &mut rng);
    }
    rng
}

/// Matches every window of `ids` (batch numbers in training order, `config.window()` per window,
/// priced by `costs`) in place, as the module docs describe.
pub(crate) fn match_windows(ids: &mut [u32], costs: &[f32], config: &Config, rng: &mut Pcg64) {
    let world = config.world_size as usize;
    if world < 2 {
        return;
    }
    // Sized by the batches there are, not by the window (2^31 ranks asked 16 GB: an abort).
    let mut sorter = Vec::with_capacity(config.window().min(ids.len()));
    for window in ids.chunks_mut(config.window()) {
        match_window(window, costs, world, rng, &mut sorter);
    }
}

/// The random stream for the windows of forming group `group` (below 2^16), the epoch's tail, or
/// block `b` of the cost-class construction.
pub(crate) fn balance_stream(unit: Unit) -> Stream {
    Stream::Balance(match unit {
        Unit::Group(g) => g,
        Unit::Tail => u32::MAX,
        Unit::Block(b) => (1 << 16) + b,
    })
}

/// What a random stream of [`stream`] serves.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Unit {
    /// The windows inside forming group `g`.
    Group(u32),
    /// The windows of the epoch's tail (`form::Epoch`).
    Tail,
    /// Block `b` of windows after cost classes.
    Block(u32),
}

/// The cost-class construction over the whole epoch (`balance_tolerance_ppm`), then every window
/// matched: `sequence` holds the batch numbers in training order, a multiple of `world_size`.
pub(crate) fn balance_classes(
    sequence: &mut [u32],
    costs: &[f32],
    config: &Config,
    ppm: u32,
    epoch: u64,
    pool: Option<&rayon::ThreadPool>,
) {
    let world = config.world_size as usize;
    if world < 2 || sequence.len() < world {
        return;
    }
    let classed = cost_class_steps(sequence, costs, world, ppm);
    sequence.copy_from_slice(&classed);
    let tasks: Vec<(usize, &mut [u32])> = sequence
        .chunks_mut(config.window().saturating_mul(WINDOWS_PER_BLOCK))
        .enumerate()
        .collect();
    run(pool, tasks, |(index, ids)| {
        // Blocks number far fewer than 2^16 below 2^32 batches.
        #[allow(clippy::cast_possible_truncation)]
        let unit = Unit::Block(index as u32);
        let mut rng = Pcg64::new(config.seed, epoch, balance_stream(unit));
        match_windows(ids, costs, config, &mut rng);
    });
}

/// One window's batch numbers in balanced order: sorted by cost (ties by number) and cut into
/// steps (unless the window is one step); the ranks of each step's batches chosen so that every
/// rank's sum over the window evens out ([`rank_order`]); then the steps rotated by a random amount,
/// and the ranks too, so no step slot or rank is always the light one. Sorting `cost bits << 32 | number` as plain integers (positive
/// floats order like their bit patterns) took half the instructions of a comparator on floats, and
/// fewer than selecting each step boundary (measured). The rotations are applied while writing the
/// sorted numbers back: rotating in place called `memmove` twice per step (a tenth of matching's
/// time, measured).
fn match_window(
    ids: &mut [u32],
    costs: &[f32],
    world: usize,
    rng: &mut Pcg64,
    sorter: &mut Vec<u64>,
) {
    sorter.clear();
    sorter.extend(
        ids.iter()
            .map(|&id| u64::from(costs[id as usize].to_bits()) << 32 | u64::from(id)),
    );
    let steps = ids.len() / world;
    // A window of one step keeps its batches whatever their order: only the ranks turn.
    if steps > 1 {
        sorter.sort_unstable();
    }
    if steps == 0 {
        for (slot, &packed) in ids.iter_mut().zip(sorter.iter()) {
            // The low half is the number.
            #[allow(clippy::cast_possible_truncation)]
            {
                *slot = packed as u32;
            }
        }
        return;
    }
    // Below `steps` and `world`, which are usize.
    #[allow(clippy::cast_possible_truncation)]
    let shift = rng.below(steps as u64) as usize;
    #[allow(clippy::cast_possible_truncation)]
    let turn = rng.below(world as u64) as usize;
    let ranks = rank_order(costs_of(sorter), steps, world);
    for (step, slots) in ids.chunks_exact_mut(world).enumerate() {
        // Step `step` takes sorted step `step + shift` (cyclic), its batches on the ranks that
        // `ranks` gives them, turned by `turn`.
        let sorted = (step + shift) % steps;
        let from = &sorter[sorted * world..][..world];
        for (k, &packed) in from.iter().enumerate() {
            // Turned back by `turn`: entry `k` of a one-step window lands where it always did.
            let rank = ranks[sorted * world + k] as usize + world - turn;
            let rank = if rank < world { rank } else { rank - world };
            // The low half is the number.
            #[allow(clippy::cast_possible_truncation)]
            {
                slots[rank] = packed as u32;
            }
        }
    }
    // Rows past the last whole step (none in practice: windows hold whole steps) stay sorted.
    let rest = steps * world;
    for (slot, &packed) in ids[rest..].iter_mut().zip(&sorter[rest..]) {
        #[allow(clippy::cast_possible_truncation)]
        {
            *slot = packed as u32;
        }
    }
}

/// The cost of each sorted entry (the high half of `cost bits << 32 | number`).
fn costs_of(sorter: &[u64]) -> impl Fn(usize) -> f64 + '_ {
    // The high half is the cost's bits.
    #[allow(clippy::cast_possible_truncation)]
    move |i| f64::from(f32::from_bits((sorter[i] >> 32) as u32))
}

/// The rank of each of a window's sorted entries: every step gives each rank one batch, and the
/// window's steps, costliest first, hand their costliest batch to the rank whose batches so far cost
/// least (longest processing time first, one batch per rank per step). Steps keep their batches, so
/// each micro-batch's ranks stay matched, while each rank's sum over the window — what a rank
/// computes between two gradient synchronizations (DDP with `no_sync`) — evens out. With one step
/// the window is one micro-batch and the ranks are the sorted order.
fn rank_order(cost: impl Fn(usize) -> f64, steps: usize, world: usize) -> Vec<u32> {
    let (mut ranks, mut sums) = longest_first(&cost, steps, world);
    if steps >= 2 {
        even_out(&mut ranks, &cost, &mut sums, steps, world);
    }
    ranks
}

/// [`rank_order`]'s first pass (longest processing time first), and each rank's sum over the window.
fn longest_first(cost: &impl Fn(usize) -> f64, steps: usize, world: usize) -> (Vec<u32>, Vec<f64>) {
    // Ranks below world_size, a u32.
    #[allow(clippy::cast_possible_truncation)]
    let mut ranks: Vec<u32> = (0..steps * world).map(|i| (i % world) as u32).collect();
    let mut sums = vec![0.0f64; world];
    if steps < 2 {
        return (ranks, sums);
    }
    let mut lightest: Vec<u32> = ranks[..world].to_vec();
    for step in (0..steps).rev() {
        // Ties go to the lower rank, so the order is the same on every machine.
        lightest.sort_unstable_by(|&x, &y| {
            sums[x as usize]
                .total_cmp(&sums[y as usize])
                .then(x.cmp(&y))
        });
        for (k, &rank) in lightest.iter().enumerate() {
            let entry = step * world + world - 1 - k;
            ranks[entry] = rank;
            sums[rank as usize] += cost(entry);
        }
    }
    (ranks, sums)
}

/// Pairwise swaps after [`rank_order`]'s longest-first pass, which leaves the costliest rank's window
/// sum a few percent above the others' under attention prices (per-optimizer-step synchronous
/// efficiency 0.978 on the seed workload at `cost=(1, 1/30720)`): while some step's batch of the
/// costliest rank, swapped with another rank's batch of the same step, lowers the larger of the two
/// ranks' sums, the swap that lowers it most is made. Each step keeps its batches (a micro-batch's ranks
/// stay matched) and the window its steps; every swap lowers the sum of squared rank sums, so the loop
/// ends, and ties go to the earlier step and the lower rank, so the result is the same on every machine.
///
/// How far a window's ranks can be evened with its steps kept (seed workload, 8 × 4, `cost=(1, 1/30720)`,
/// per-step synchronous efficiency on 300 windows): these swaps 0.9938; a largest-differencing merge of
/// the steps then these swaps 0.9939; a local search over every swap of two ranks in a step, 20 random
/// restarts, 0.9945 — still short of the 0.9951 that end to end 0.975 per step would need (numpy).
fn even_out(
    ranks: &mut [u32],
    cost: &impl Fn(usize) -> f64,
    sums: &mut [f64],
    steps: usize,
    world: usize,
) {
    // slot[step * world + rank]: the entry that rank runs in that step, and its cost (kept beside it:
    // the scans below read each cost up to SWAPS_PER_WINDOW times).
    let mut slot = vec![(0usize, 0.0f64); steps * world];
    for (entry, &rank) in ranks.iter().enumerate() {
        slot[entry / world * world + rank as usize] = (entry, cost(entry));
    }
    for _ in 0..SWAPS_PER_WINDOW.min(steps * world) {
        let top = (0..world).fold(0, |best, r| if sums[r] > sums[best] { r } else { best });
        let mut best: Option<(f64, usize, usize)> = None;
        for (step, row) in slot.chunks_exact(world).enumerate() {
            let heavy = row[top].1;
            for (r, &(_, light)) in row.iter().enumerate() {
                let moved = heavy - light;
                if r == top || moved <= 0.0 {
                    continue;
                }
                let larger = (sums[top] - moved).max(sums[r] + moved);
                if larger < sums[top] && best.is_none_or(|(b, _, _)| larger < b) {
                    best = Some((larger, step, r));
                }
            }
        }
        let Some((_, step, r)) = best else { break };
        let (a, b) = (step * world + top, step * world + r);
        let moved = slot[a].1 - slot[b].1;
        sums[top] -= moved;
        sums[r] += moved;
        slot.swap(a, b);
        // Ranks below world_size, a u32.
        #[allow(clippy::cast_possible_truncation)]
        {
            ranks[slot[a].0] = top as u32;
            ranks[slot[b].0] = r as u32;
        }
    }
}

/// `sequence` in the order of the cost-class construction (module docs): steps of `world` batches
/// of one class, each placed at the mean position of its batches.
fn cost_class_steps(sequence: &[u32], costs: &[f32], world: usize, ppm: u32) -> Vec<u32> {
    let cost_at = |position: u32| costs[sequence[position as usize] as usize];
    let ratio = 1.0 + f64::from(ppm) / 1e6;
    let (most, least) = sequence
        .iter()
        .fold((0.0f32, f32::INFINITY), |(hi, lo), &id| {
            let c = costs[id as usize];
            (hi.max(c), lo.min(c))
        });
    // Band floors, descending: class j holds costs in (floors[j], floors[j - 1]] (floors[-1] = most).
    let mut floors = Vec::new();
    let mut floor = f64::from(most) / ratio;
    while floor >= f64::from(least) && floor > 0.0 {
        floors.push(floor);
        floor /= ratio;
    }
    let classes = floors.len() + 1;
    // Class numbers fit in u32: a tolerance ≥ 0.001 gives at most ~45K bands over f64's range.
    #[allow(clippy::cast_possible_truncation)]
    let class: Vec<u32> = sequence
        .iter()
        .map(|&id| {
            let c = f64::from(costs[id as usize]);
            floors.partition_point(|&f| c <= f) as u32
        })
        .collect();
    // Positions grouped by class (a stable counting sort keeps the stratified order in a class).
    let mut starts = vec![0usize; classes + 1];
    for &k in &class {
        starts[k as usize + 1] += 1;
    }
    for k in 1..=classes {
        starts[k] += starts[k - 1];
    }
    let mut by_class = vec![0u32; sequence.len()];
    let mut next = starts.clone();
    for (position, &k) in class.iter().enumerate() {
        // Positions fit in u32: at most one batch per sample.
        #[allow(clippy::cast_possible_truncation)]
        let position = position as u32;
        by_class[next[k as usize]] = position;
        next[k as usize] += 1;
    }
    let mut steps: Vec<(u64, &[u32])> = Vec::with_capacity(sequence.len() / world);
    let mut leftover = Vec::new();
    for k in 0..classes {
        let members = &by_class[starts[k]..starts[k + 1]];
        let whole = members.len() / world * world;
        let whole_steps = members[..whole].chunks_exact(world);
        steps.extend(whole_steps.map(|s| (position_sum(s), s)));
        leftover.extend_from_slice(&members[whole..]);
    }
    // Leftovers (fewer than `world` per class; a multiple of `world` in all, since the batch count
    // is) make steps of their nearest costs.
    leftover.sort_by(|&a, &b| cost_at(a).total_cmp(&cost_at(b)).then(a.cmp(&b)));
    steps.extend(leftover.chunks_exact(world).map(|s| (position_sum(s), s)));
    // The sum of positions orders steps by their mean position; the first position breaks ties.
    steps.sort_unstable_by_key(|&(sum, s)| (sum, s[0]));
    steps
        .iter()
        .flat_map(|&(_, s)| s.iter().map(|&p| sequence[p as usize]))
        .collect()
}

fn position_sum(step: &[u32]) -> u64 {
    step.iter().map(|&p| u64::from(p)).sum()
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests;

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
//!   optimizer step 0.978 with random ranks → 0.987 with [`rank_order`] (0.960 → 0.978 under an
//!   attention price `cost=(1, 1/30720)`; measured).
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
use crate::plan::permute::run;
use crate::rng::{Pcg64, Stream};

/// Mixing windows per random stream and parallel task of the cost-class construction.
const WINDOWS_PER_BLOCK: usize = 256;

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
    // Ranks below world_size, a u32.
    #[allow(clippy::cast_possible_truncation)]
    let mut ranks: Vec<u32> = (0..steps * world).map(|i| (i % world) as u32).collect();
    if steps < 2 {
        return ranks;
    }
    let mut sums = vec![0.0f64; world];
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
    ranks
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
mod tests {
    use super::*;
    use crate::plan::config::Batching;

    fn config(world_size: u32, accumulation: u32, tolerance: Option<u32>) -> Config {
        Config {
            world_size,
            accumulation,
            balance_tolerance_ppm: tolerance,
            ..Config::new(Batching::Tokens(100))
        }
    }

    /// Balances batches numbered by position whose costs are `costs` (cost classes when the
    /// configuration asks); returns each step's costs, sorted, in training order, and the sequence.
    fn balanced(costs: &[f32], cfg: &Config, epoch: u64) -> (Vec<Vec<u32>>, Vec<u32>) {
        let mut sequence: Vec<u32> = (0..costs.len() as u32).collect();
        match cfg.balance_tolerance_ppm {
            Some(ppm) => balance_classes(&mut sequence, costs, cfg, ppm, epoch, None),
            None => {
                let mut rng = Pcg64::new(cfg.seed, epoch, balance_stream(Unit::Tail));
                match_windows(&mut sequence, costs, cfg, &mut rng);
            }
        }
        let steps = sequence
            .chunks(cfg.world_size as usize)
            .map(|s| {
                let mut c: Vec<u32> = s.iter().map(|&id| costs[id as usize] as u32).collect();
                c.sort_unstable();
                c
            })
            .collect();
        (steps, sequence)
    }

    #[test]
    fn steps_take_the_most_similar_batches_of_their_window() {
        // Two windows of two steps of two ranks; costs interleaved so that in formation order every
        // step pairs a cheap batch with a dear one.
        let costs = [10.0, 90.0, 11.0, 91.0, 50.0, 20.0, 51.0, 21.0];
        let (steps, sequence) = balanced(&costs, &config(2, 2, None), 0);
        let (mut first, mut second) = (steps[..2].to_vec(), steps[2..].to_vec());
        first.sort();
        second.sort();
        // Each window keeps its own batches; inside it, cheap pairs with cheap.
        assert_eq!(first, [vec![10, 11], vec![90, 91]]);
        assert_eq!(second, [vec![20, 21], vec![50, 51]]);
        assert!(sequence[..4].iter().all(|&id| id < 4));
        // Another epoch rotates steps and ranks differently, but matches the same batches.
        let (other_steps, other) = balanced(&costs, &config(2, 2, None), 1);
        assert_ne!(sequence, other);
        let mut a = steps.clone();
        let mut b = other_steps;
        a.sort();
        b.sort();
        assert_eq!(a, b);
    }

    #[test]
    fn one_rank_is_left_alone() {
        let costs = [5.0, 1.0, 4.0, 2.0];
        let (_, sequence) = balanced(&costs, &config(1, 4, None), 0);
        assert_eq!(sequence, [0, 1, 2, 3]);
    }

    #[test]
    fn cost_classes_group_similar_costs_across_windows() {
        // Windows of one step (accumulation 1, 2 ranks): inside-window matching alone cannot help;
        // cost classes of ratio 1.2 pair the 10s, the 50s and the 90s.
        let costs = [10.0, 90.0, 50.0, 10.0, 90.0, 50.0];
        let cfg = config(2, 1, Some(200_000));
        let (steps, _) = balanced(&costs, &cfg, 0);
        // Steps sit at the mean position of their batches: 10s (0 + 3), 90s (1 + 4), 50s (2 + 5).
        assert_eq!(steps, [vec![10, 10], vec![90, 90], vec![50, 50]]);
        // Without classes, steps keep their formation-order partners.
        let (unclassed, _) = balanced(&costs, &config(2, 1, None), 0);
        assert_eq!(unclassed, [vec![10, 90], vec![10, 50], vec![50, 90]]);
    }

    #[test]
    fn leftovers_of_classes_make_steps_of_their_nearest_costs() {
        // Classes of ratio 1.01: 100, 100 | 50 | 30 | 31 ... two ranks, so 50 and 30/31 leftovers pair.
        let costs = [100.0, 50.0, 30.0, 100.0, 31.0, 60.0];
        let (mut steps, sequence) = balanced(&costs, &config(2, 1, Some(10_000)), 0);
        steps.sort();
        assert_eq!(steps, [vec![30, 31], vec![50, 60], vec![100, 100]]);
        let mut all = sequence.clone();
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn rank_order_gives_each_rank_one_batch_per_step_and_evens_the_sums() {
        // Two steps of two ranks, sorted ascending: costs 1, 2 | 3, 10. The costliest step goes first:
        // 10 → rank 0, 3 → rank 1; then the lighter rank (1, at 3) takes 2 and rank 0 takes 1.
        let costs = [1.0, 2.0, 3.0, 10.0];
        assert_eq!(rank_order(|i| costs[i], 2, 2), [0, 1, 1, 0]);
        assert_eq!(
            rank_order(|i| costs[i], 1, 4),
            [0, 1, 2, 3],
            "one step: the sorted order"
        );
    }

    proptest::proptest! {
        #[test]
        fn rank_sums_differ_by_no_more_than_the_costliest_batch(
            mut costs in proptest::collection::vec(1u32..10_000, 2..200),
            world in 2usize..9,
        ) {
            let steps = costs.len() / world;
            proptest::prop_assume!(steps >= 2);
            costs.truncate(steps * world);
            costs.sort_unstable();
            let ranks = rank_order(|i| f64::from(costs[i]), steps, world);
            let mut sums = vec![0u64; world];
            for step in 0..steps {
                let mut seen: Vec<u32> = ranks[step * world..][..world].to_vec();
                seen.sort_unstable();
                proptest::prop_assert_eq!(seen, (0..world as u32).collect::<Vec<_>>());
                for k in 0..world {
                    sums[ranks[step * world + k] as usize] += u64::from(costs[step * world + k]);
                }
            }
            let spread = sums.iter().max().unwrap() - sums.iter().min().unwrap();
            proptest::prop_assert!(spread <= u64::from(*costs.last().unwrap()));
        }
    }
}

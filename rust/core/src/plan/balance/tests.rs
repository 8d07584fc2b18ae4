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

    /// The swaps after the longest-first pass never raise the costliest rank's sum, keep every step
    /// one batch per rank.
    #[test]
    fn swaps_never_raise_the_costliest_rank(
        mut costs in proptest::collection::vec(1u32..10_000, 8..200),
        world in 2usize..9,
        squared in proptest::bool::ANY,
    ) {
        let steps = costs.len() / world;
        proptest::prop_assume!(steps >= 2);
        costs.truncate(steps * world);
        costs.sort_unstable();
        let price = |i: usize| {
            let c = f64::from(costs[i]);
            if squared { c + c * c / 3000.0 } else { c }
        };
        let (first, _) = longest_first(&price, steps, world);
        let swapped = rank_order(price, steps, world);
        let heaviest = |ranks: &[u32]| {
            let mut sums = vec![0.0f64; world];
            for (i, &r) in ranks.iter().enumerate() {
                sums[r as usize] += price(i);
            }
            sums.into_iter().fold(0.0, f64::max)
        };
        proptest::prop_assert!(heaviest(&swapped) <= heaviest(&first) * (1.0 + 1e-12));
        for step in swapped.chunks_exact(world) {
            let mut seen = step.to_vec();
            seen.sort_unstable();
            proptest::prop_assert_eq!(seen, (0..world as u32).collect::<Vec<_>>());
        }
    }
}

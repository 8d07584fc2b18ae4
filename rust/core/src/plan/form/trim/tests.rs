use super::*;
use crate::plan::config::{Batching, Config};
use crate::rng::Stream;

/// A former over `lengths` with `edges`, a token budget and `world_size` ranks.
fn with_former<T>(
    lengths: &[u32],
    edges: Vec<u32>,
    budget: u64,
    world_size: u32,
    test: impl FnOnce(&Former<'_, u32>) -> T,
) -> T {
    let config = Config {
        world_size,
        trim_steps: true,
        ..Config::new(Batching::Tokens(budget))
    };
    crate::plan::form::testing::with_former(lengths, edges, &config, |former, _| test(former))
}

fn pairs(lengths: &[u32]) -> Vec<u64> {
    (0u32..)
        .zip(lengths)
        .map(|(r, &l)| u64::from(r) << 32 | u64::from(l))
        .collect()
}

/// Batches over consecutive runs of the buffer, `sizes` rows each.
fn batches_of(buffer: &[u64], sizes: &[usize]) -> Batches {
    let mut batches = Batches::default();
    let mut at = 0;
    for &size in sizes {
        let run = &buffer[at..at + size];
        let longest = run.iter().map(|&p| length_of(p)).max().unwrap_or(0);
        let tokens = run.iter().map(|&p| u64::from(length_of(p))).sum();
        batches.close((at, at + size), longest, tokens);
        at += size;
    }
    batches.complete = batches.len();
    batches
}

#[test]
fn candidates_are_the_cheaper_distinct_costs_thinned_evenly() {
    let of = |costs: &[f64], top| {
        let mut out = vec![7.0];
        candidates(costs.iter().copied(), top, &mut out);
        out
    };
    assert_eq!(of(&[5.0, 3.0, 5.0, 9.0, 3.0], 9.0), [3.0, 5.0]);
    assert!(of(&[4.0, 4.0], 4.0).is_empty());
    let many: Vec<f64> = (0..=30).map(f64::from).collect();
    let thinned = of(&many, 30.0);
    assert_eq!(thinned.len(), MAX_CANDIDATES);
    assert_eq!((thinned[0], thinned[MAX_CANDIDATES - 1]), (0.0, 29.0));
    assert!(thinned.windows(2).all(|w| w[0] < w[1]));
}

/// The naive oracle: the rows a batch keeps, scanning its prefixes until one costs over `target`.
fn scanned(former: &Former<'_, u32>, lengths: &[u32], target: f64) -> usize {
    let mut longest = 0;
    for (rows, &l) in lengths.iter().enumerate() {
        longest = longest.max(l);
        if rows > 0 && former.config.batch_cost(rows as u64 + 1, longest) > target {
            return rows;
        }
    }
    lengths.len()
}

fn prefixes_of(former: &Former<'_, u32>, lengths: &[u32]) -> Prefixes {
    let buffer = pairs(lengths);
    let mut prefixes = Prefixes::default();
    prefixes.fill(former.config, std::iter::once(&buffer[..]));
    prefixes
}

#[test]
fn a_batch_keeps_the_longest_prefix_within_the_target_and_at_least_one_row() {
    with_former(&[], vec![0, 100], 100, 2, |former| {
        let prefixes = prefixes_of(former, &[10, 30, 20, 40]);
        assert_eq!(prefixes.of(0), [10.0, 60.0, 90.0, 160.0]);
        assert_eq!(prefixes.cost(0), 160.0);
        // Prefix costs: 10, 60, 90, 160.
        let kept = |target| prefixes.kept(0, target);
        assert_eq!((kept(90.0), kept(89.0), kept(1.0), kept(1e9)), (3, 2, 1, 4));
    });
}

#[test]
fn a_step_is_trimmed_to_its_cheaper_batch_when_that_saves_time() {
    // Two ranks, budget 100. Batch 0: two rows of 40 (cost 80, fixed by its samples). Batch 1: ten
    // rows of 10 (cost 100). Trimming batch 1 to 80 keeps 8 rows: the step costs 2·80 + 20/0.97,
    // less than 2·100.
    let lengths = [40, 40, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10];
    with_former(&lengths, vec![0, 20, 100], 100, 2, |former| {
        let buffer = pairs(&lengths);
        let mut batches = batches_of(&buffer, &[2, 10]);
        let spill = former.trim_steps(&mut batches, &buffer, &[0, 1]);
        assert_eq!(
            (batches.ends[1], batches.longest[1], batches.tokens[1]),
            (10, 10, 80)
        );
        assert_eq!(spill, buffer[10..12]);
        // The trimmed rows re-form into one batch of their bucket, addressed past the buffer.
        let (grouped, extra) = former.reform(&spill, buffer.len());
        assert_eq!(grouped, spill);
        assert_eq!(
            (extra.starts.as_slice(), extra.ends.as_slice()),
            (&[12][..], &[14][..])
        );
    });
}

#[test]
fn a_step_that_trimming_would_not_speed_up_is_left_alone() {
    // Batch 0: one row of 99. Batch 1: two rows of 50 (cost 100). Trimming to 99 keeps one row of
    // 50 and moves the other: 2·99 + 50/0.97 is more than the 2·100 of the step as it is.
    let lengths = [99, 50, 50];
    with_former(&lengths, vec![0, 60, 100], 100, 2, |former| {
        let buffer = pairs(&lengths);
        let mut batches = batches_of(&buffer, &[1, 2]);
        let before = (batches.ends.clone(), batches.longest.clone());
        let spill = former.trim_steps(&mut batches, &buffer, &[0, 1]);
        assert!(spill.is_empty());
        assert_eq!((batches.ends, batches.longest), before);
    });
}

#[test]
fn a_step_of_equal_costs_has_nothing_to_trim() {
    let lengths = [50, 50, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10];
    with_former(&lengths, vec![0, 20, 100], 100, 2, |former| {
        let buffer = pairs(&lengths);
        let mut batches = batches_of(&buffer, &[2, 10]);
        assert!(former.trim_steps(&mut batches, &buffer, &[0, 1]).is_empty());
    });
}

#[test]
fn one_rank_never_trims() {
    let lengths = [40, 40, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10];
    with_former(&lengths, vec![0, 20, 100], 100, 1, |former| {
        let buffer = pairs(&lengths);
        let mut batches = batches_of(&buffer, &[2, 10]);
        assert!(former.trim_steps(&mut batches, &buffer, &[0, 1]).is_empty());
    });
}

#[test]
fn extra_windows_are_spread_evenly_and_their_remainder_goes_last() {
    let config = Config {
        world_size: 2,
        ..Config::new(Batching::Tokens(100))
    };
    // Own: 4 windows of 2 (ids 0..8) and a part window (8); extra: ids 9..14 (costs 9..14).
    let sequence: Vec<u32> = (0..9).collect();
    let costs: Vec<f32> = (0..14u8).map(f32::from).collect();
    let mut rng = Pcg64::new(0, 0, Stream::Workload);
    let (order, main) = spread(&sequence, 8, 9..14, &costs, &config, &mut rng);
    assert_eq!(main, 12);
    assert_eq!(order.len(), 14);
    let window = |w: usize| {
        let mut ids = order[w * 2..w * 2 + 2].to_vec();
        ids.sort_unstable();
        ids
    };
    // Costliest first: windows {13, 12} and {11, 10}, before own windows 1 and 3.
    let expected: [&[u32]; 6] = [&[0, 1], &[12, 13], &[2, 3], &[4, 5], &[10, 11], &[6, 7]];
    for (w, ids) in expected.iter().enumerate() {
        assert_eq!(window(w), *ids, "window {w}");
    }
    assert_eq!(&order[12..], &[8, 9]);
}

#[test]
fn the_binary_search_keeps_the_rows_the_scan_keeps() {
    let lengths: Vec<u32> = (0..200u32).map(|i| 1 + (i * 7919) % 97).collect();
    with_former(&lengths, vec![0, 100], 10_000, 2, |former| {
        for size in [1, 2, 5, 60, 200] {
            let prefixes = prefixes_of(former, &lengths[..size]);
            for target in [0.5, 1.0, 50.0, 97.0, 300.0, 2_000.0, 9_000.0, 1e9] {
                let expected = scanned(former, &lengths[..size], target);
                assert_eq!(prefixes.kept(0, target), expected, "{size} rows, {target}");
            }
        }
    });
}

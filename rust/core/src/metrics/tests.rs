use super::*;

#[test]
fn deciles_split_the_token_mass() {
    let lengths: Vec<u32> = (1..=1000).collect();
    let deciles = Deciles::new(&lengths);
    for share in deciles.share {
        assert!((share - 0.1).abs() < 0.01, "{:?}", deciles.share);
    }
    assert_eq!(deciles.of(1), 0);
    assert_eq!(deciles.of(1000), 9);
    assert_eq!(deciles.of(5000), 9);
}

/// The oracle: a table over every length up to the longest, each present length in the decile
/// where the middle of its token mass falls.
#[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
fn naive(lengths: &[u32]) -> (Vec<usize>, [f64; 10]) {
    let longest = lengths.iter().copied().max().unwrap_or(0) as usize;
    let mut tokens_at = vec![0u64; longest + 1];
    for &l in lengths {
        tokens_at[l as usize] += u64::from(l);
    }
    let total: u64 = tokens_at.iter().sum();
    let (mut below, mut mass, mut decile_of) = (0u64, [0u64; 10], vec![0usize; longest + 1]);
    for (l, &tokens) in tokens_at.iter().enumerate() {
        let decile = if total == 0 {
            0
        } else {
            ((10 * (2 * below + tokens) / (2 * total)) as usize).min(9)
        };
        decile_of[l] = decile;
        mass[decile] += tokens;
        below += tokens;
    }
    let share = mass.map(|m| m as f64 / total.max(1) as f64);
    (decile_of, share)
}

/// Thresholds give every present length the table's decile and the same shares, counted by
/// table or by sorting (lengths far longer than the sample count).
#[test]
fn deciles_match_the_table_oracle() {
    let mut rng = crate::rng::Pcg64::new(5, 0, crate::rng::Stream::Workload);
    for (n, top) in [(1, 10), (50, 8), (500, 3_000), (2_000, 5_000_000), (300, 5)] {
        for _ in 0..8 {
            // Lengths fit u32 (below `top`).
            #[allow(clippy::cast_possible_truncation)]
            let lengths: Vec<u32> = (0..n).map(|_| rng.below(top) as u32).collect();
            let deciles = Deciles::new(&lengths);
            let (decile_of, share) = naive(&lengths);
            for &l in &lengths {
                assert_eq!(
                    deciles.of(l),
                    decile_of[l as usize],
                    "length {l} of {lengths:?}"
                );
            }
            for (got, want) in deciles.share.iter().zip(share) {
                assert!(
                    (got - want).abs() < 1e-12,
                    "{:?} vs {share:?}",
                    deciles.share
                );
            }
        }
    }
}

/// A length near u32::MAX costs nothing more than a short one (the table of every length up to
/// the longest was 36 GB here: an abort).
#[test]
fn deciles_of_lengths_near_u32_max() {
    let lengths = [u32::MAX - 5, 3, 7, u32::MAX - 2_000_000, 1_000_000];
    let deciles = Deciles::new(&lengths);
    // Two lengths of ~2^32 hold nearly all the mass: the middles of theirs fall at ~25% and
    // ~75%, so deciles 2 and 7; the short ones are in decile 0.
    assert_eq!(deciles.of(3), 0);
    assert_eq!(deciles.of(1_000_000), 0);
    assert_eq!(deciles.of(u32::MAX - 2_000_000), 2);
    assert_eq!(deciles.of(u32::MAX - 5), 7);
    assert!((deciles.share.iter().sum::<f64>() - 1.0).abs() < 1e-12);
}

#[test]
fn a_window_like_the_dataset_has_no_distance_and_sorted_batches_a_large_one() {
    let lengths: Vec<u32> = (1..=100).collect();
    let deciles = Deciles::new(&lengths);
    let whole = window_tv(
        &[0, 100],
        &(0..100).collect::<Vec<u32>>(),
        &lengths,
        &deciles,
        1,
    );
    assert!(whole.unwrap().abs() < 1e-12);
    let offsets: Vec<u32> = (0..=10).map(|b| b * 10).collect();
    let sorted = window_tv(
        &offsets,
        &(0..100).collect::<Vec<u32>>(),
        &lengths,
        &deciles,
        1,
    )
    .unwrap();
    assert!(sorted > 0.8, "{sorted}");
    assert_eq!(
        window_tv(
            &offsets,
            &(0..100).collect::<Vec<u32>>(),
            &lengths,
            &deciles,
            11
        ),
        None
    );
}

#[test]
fn imbalance_is_max_over_min_per_step() {
    // Two ranks; step 0 costs 4 and 2 (ratio 2), step 1 costs 3 and 3 (ratio 1).
    let offsets = [0, 4, 6, 9, 12];
    let indices: Vec<u32> = (0..12).collect();
    let got = rank_imbalance(&batch_costs(&offsets, &indices, |m| m.len() as f64), 2).unwrap();
    assert_eq!((got.p50, got.p99, got.max), (1.0, 2.0, 2.0));
}

#[test]
fn churn_counts_pairs_that_meet_again() {
    let a = ([0u32, 3, 6].as_slice(), [0u32, 1, 2, 3, 4, 5].as_slice());
    // In b, the pairs (0, 1) and (4, 5) are together again: 2 of a's 6 pairs.
    let b = ([0u32, 2, 4, 6].as_slice(), [0u32, 1, 2, 3, 4, 5].as_slice());
    assert_eq!(churn(a, b, 6).unwrap(), Some(2.0 / 6.0));
    assert_eq!(churn(a, a, 6).unwrap(), Some(1.0));
    assert_eq!(
        churn(([0u32, 1].as_slice(), [0u32].as_slice()), a, 6).unwrap(),
        None
    );
}

#[test]
fn synchronous_efficiency_counts_the_wait_for_the_slowest_rank() {
    // Two ranks, four steps, accumulation 2: costs by batch (rank 0, rank 1) per step.
    let costs = [4.0, 2.0, 1.0, 3.0, 5.0, 5.0, 2.0, 2.0];
    let offsets: Vec<u32> = (0..=8).collect();
    let indices: Vec<u32> = (0..8).collect();
    let cost = |m: &[u32]| costs[m[0] as usize];
    let got = synchronous(&batch_costs(&offsets, &indices, cost), 2, 2).unwrap();
    // Per micro-batch: 24 / (2 × (4 + 3 + 5 + 2)) = 24 / 28.
    assert!((got.per_micro_batch - 24.0 / 28.0).abs() < 1e-12);
    // Per optimizer step: rank sums (5, 5) then (7, 7): 24 / (2 × (5 + 7)) = 1.
    assert!((got.per_optimizer_step - 1.0).abs() < 1e-12);
    // A last window shorter than accumulation (3 steps with accumulation 2) still counts.
    let three = synchronous(&batch_costs(&offsets[..7], &indices[..6], cost), 2, 2).unwrap();
    assert!((three.per_optimizer_step - 20.0 / (2.0 * (5.0 + 5.0))).abs() < 1e-12);
    assert_eq!(synchronous(&batch_costs(&[0], &[], cost), 2, 1), None);
}

#[test]
fn the_tail_and_length_gap_are_exact_on_small_plans() {
    // Ten windows of one batch: nine mirror the epoch (lengths 1..=10 each), the last holds only
    // tens. The epoch's mean length is (9·5.5 + 10) / 10 = 5.95.
    let mut lengths: Vec<u32> = Vec::new();
    for _ in 0..9 {
        lengths.extend(1..=10);
    }
    lengths.extend([10; 10]);
    let indices: Vec<u32> = (0..100).collect();
    let offsets: Vec<u32> = (0..=10).map(|b| b * 10).collect();
    let deciles = Deciles::new(&lengths);
    let got = mixing(&offsets, &indices, &lengths, &deciles, 1).unwrap();
    let epoch = 5.95;
    let (even, last) = ((5.5f64 / epoch - 1.0).abs(), (10.0f64 / epoch - 1.0).abs());
    assert!(
        (got.length_gap - (9.0 * even + last) / 10.0).abs() < 1e-12,
        "{got:?}"
    );
    // The last tenth of ten windows is the last window alone.
    assert!((got.length_gap_tail - last).abs() < 1e-12);
    assert!(got.window_tv_tail > got.window_tv, "{got:?}");
    assert_eq!(
        Some(got.window_tv),
        window_tv(&offsets, &indices, &lengths, &deciles, 1)
    );
    // Two windows of five batches: means 5.5 and (4·55 + 100) / 50 = 6.4; the tail is the second.
    let halves = mixing(&offsets, &indices, &lengths, &deciles, 5).unwrap();
    assert!(
        (halves.length_gap_tail - (6.4 / epoch - 1.0)).abs() < 1e-12,
        "{halves:?}"
    );
    let both = ((5.5 / epoch - 1.0f64).abs() + (6.4 / epoch - 1.0)) / 2.0;
    assert!((halves.length_gap - both).abs() < 1e-12);
    assert!(mixing(&offsets, &indices, &lengths, &deciles, 11).is_none());
}

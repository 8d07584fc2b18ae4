use super::*;
use crate::plan::config::{Batching, Config};

/// A former over `lengths` with `edges` and `batching`, and its rules.
fn with_former<T>(
    lengths: &[u32],
    edges: Vec<u32>,
    batching: Batching,
    test: impl FnOnce(&Former<'_, u32>, &Rules) -> T,
) -> T {
    crate::plan::form::testing::with_former(lengths, edges, &Config::new(batching), test)
}

/// Rows `0..` with `lengths`, in that order, as the epoch buffer holds them.
fn in_row_order(lengths: &[u32]) -> Vec<u64> {
    (0u32..)
        .zip(lengths)
        .map(|(r, &l)| u64::from(r) << 32 | u64::from(l))
        .collect()
}

fn pairs(rows_and_lengths: &[(u32, u32)]) -> Vec<u64> {
    rows_and_lengths
        .iter()
        .map(|&(r, l)| u64::from(r) << 32 | u64::from(l))
        .collect()
}

#[test]
fn rows_are_grouped_by_bucket_in_row_order_with_their_lengths() {
    let lengths = [30u32, 5, 12, 7, 40, 1];
    with_former(&lengths, vec![0, 10, 50], Batching::Rows(2), |_, rules| {
        let by = ByBucket::new(&lengths[..], rules, 2);
        assert_eq!(by.starts, [0, 3, 6]);
        assert_eq!(
            by.pairs,
            pairs(&[(1, 5), (3, 7), (5, 1), (0, 30), (2, 12), (4, 40)])
        );
    });
}

#[test]
fn cut_closes_batches_as_the_budget_rule_says() {
    // Budget 100: a batch holds rows × longest ≤ 100.
    let lengths = [30u32, 20, 40, 50, 10, 60, 25];
    with_former(&lengths, vec![0, 60], Batching::Tokens(100), |former, _| {
        let cut = former.cut(&in_row_order(&lengths), 10);
        // [30, 20] closes when 40 arrives (3 × 40 > 100); [40, 50] is full (no third row of
        // ≥ 50 fits); [10] closes when 60 arrives (2 × 60 > 100); [60] is full on its own;
        // [25] is what is left at the end.
        assert_eq!(cut.starts, [10, 12, 14, 15, 16]);
        assert_eq!(cut.ends, [12, 14, 15, 16, 17]);
        assert_eq!(cut.longest, [30, 50, 10, 60, 25]);
        assert_eq!(cut.tokens, [50, 90, 10, 60, 25]);
        assert_eq!(cut.complete, 4, "the last batch is the partial one");
    });
}

#[test]
fn cut_by_rows_fills_every_batch_but_the_last() {
    let lengths: Vec<u32> = (1..=7).collect();
    with_former(&lengths, vec![0, 7], Batching::Rows(3), |former, _| {
        let order = in_row_order(&lengths);
        let cut = former.cut(&order, 0);
        assert_eq!(cut.ends, [3, 6, 7]);
        assert_eq!(cut.complete, 2);
        // Exactly full: no partial batch.
        let cut = former.cut(&order[..6], 0);
        assert_eq!((cut.ends.as_slice(), cut.complete), (&[3u32, 6][..], 2));
    });
}

#[test]
fn derived_figures_follow_the_batches() {
    let batches = Batches {
        starts: vec![0, 3],
        ends: vec![3, 5],
        longest: vec![10, 7],
        tokens: vec![25, 13],
        complete: 2,
    };
    let config = Config {
        pad_to_multiple_of: 4,
        ..Config::new(Batching::Tokens(64))
    };
    let derived = Derived::new(&batches, &config);
    assert_eq!(derived.mean, [8, 6], "⌊25 / 3⌋, ⌊13 / 2⌋");
    assert_eq!(derived.padded, [36, 16], "3 × 12, 2 × 8");
    assert_eq!(derived.cost, [36.0, 16.0]);
}

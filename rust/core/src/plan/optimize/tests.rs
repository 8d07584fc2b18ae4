use super::*;
use crate::plan::config::Batching;

fn config(batching: Batching) -> Config {
    Config::new(batching)
}

/// Every way of cutting `d` distinct lengths into `k` contiguous buckets: the least cost.
fn brute_force(histogram: &Histogram, k: usize, config: &Config) -> u128 {
    let d = histogram.distinct();
    let layers = Layers::<u128>::new(histogram, config);
    let mut best = u128::MAX;
    // Bitmask over the d - 1 possible cut positions.
    for mask in 0u32..(1 << (d - 1)) {
        if mask.count_ones() as usize != k - 1 {
            continue;
        }
        let mut cost = 0u128;
        let mut start = 0;
        for cut in 1..d {
            if mask & (1 << (cut - 1)) != 0 {
                cost += layers.cost(start, cut);
                start = cut;
            }
        }
        cost += layers.cost(start, d);
        best = best.min(cost);
    }
    best
}

fn cost_of(histogram: &Histogram, edges: &[u32], config: &Config) -> u128 {
    let layers = Layers::<u128>::new(histogram, config);
    let mut start = 0;
    let mut cost = 0;
    for &top in &edges[1..] {
        let end = start + histogram.values[start..].partition_point(|&v| v <= top);
        cost += layers.cost(start, end);
        start = end;
    }
    cost
}

#[test]
fn matches_brute_force_on_small_histograms() {
    let mut state = 12345u64;
    for case in 0..200 {
        let d = 1 + case % 9;
        let lengths: Vec<u32> = (0..d)
            .flat_map(|i| {
                state = crate::rng::mix64(state.wrapping_add(i as u64));
                let value = 10 * (i as u32 + 1) + (state % 7) as u32;
                std::iter::repeat_n(value, 1 + (state % 5) as usize)
            })
            .collect();
        let histogram = Histogram::new(&lengths, |_| true);
        for k in 1..=histogram.distinct().min(5) {
            let cfg = config(if case % 2 == 0 {
                Batching::Tokens(400)
            } else {
                Batching::Rows(3)
            });
            let got = optimal_edges(&histogram, k, &cfg);
            assert_eq!(got.edges.len(), k + 1, "case {case}, k {k}");
            assert_eq!(
                cost_of(&histogram, &got.edges, &cfg),
                brute_force(&histogram, k, &cfg),
                "case {case}, k {k}"
            );
        }
    }
}

#[test]
fn edges_cover_every_length_and_auto_reaches_its_target() {
    let lengths = crate::workload::seed_lengths(50_000, 3).unwrap();
    let histogram = Histogram::new(&lengths, |_| true);
    let cfg = config(Batching::Tokens(16_384));
    let auto = auto_edges(&histogram, 0.97, &cfg);
    assert!(auto.predicted_efficiency >= 0.97, "{auto:?}");
    let fewer = optimal_edges(&histogram, auto.edges.len() - 2, &cfg);
    assert!(
        fewer.predicted_efficiency < 0.97,
        "auto must pick the fewest buckets"
    );
    let buckets = crate::plan::buckets::Buckets::from_edges(auto.edges.clone()).unwrap();
    buckets.check_covers(&lengths, |_| true).unwrap();
}

#[test]
fn u64_and_u128_costs_choose_the_same_splits() {
    let lengths = crate::workload::seed_lengths(20_000, 9).unwrap();
    let histogram = Histogram::new(&lengths, |_| true);
    let cfg = config(Batching::Tokens(16_384));
    assert!(fits_u64(&histogram, &cfg));
    let narrow = Layers::<u64>::new(&histogram, &cfg).splits(12, |_| false);
    let wide = Layers::<u128>::new(&histogram, &cfg).splits(12, |_| false);
    assert_eq!(narrow, wide);
}

#[test]
fn coarsening_keeps_order_and_counts() {
    let lengths: Vec<u32> = (1..=1000).chain(1..=10).collect();
    let histogram = Histogram::new(&lengths, |_| true);
    let coarse = histogram.coarsened(10);
    assert!(coarse.distinct() <= 11);
    assert_eq!(coarse.counts.iter().sum::<u64>(), 1010);
    assert_eq!(*coarse.values.last().unwrap(), 1000);
    assert!(coarse.values.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn one_distinct_length_is_one_bucket() {
    let histogram = Histogram::new(&[7u32, 7, 7], |_| true);
    let got = optimal_edges(&histogram, 5, &config(Batching::Rows(2)));
    assert_eq!(got.edges, vec![6, 7]);
    assert!((got.predicted_efficiency - 1.0).abs() < 1e-12);
}

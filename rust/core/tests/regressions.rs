//! Regression tests, each named after what it guards.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use dflash_batch_core::rng::{Pcg64, Stream};
use dflash_batch_core::{Batching, Boundaries, Config, Mode, Planner};

/// 200,000 lengths in 1..131,072: far more distinct lengths than the boundary optimizer works on.
fn long_context_lengths() -> Vec<u32> {
    let mut rng = Pcg64::new(0, 0, Stream::Workload);
    (0..200_000)
        .map(|_| 1 + (rng.next_u64() % 131_071) as u32)
        .collect()
}

#[test]
fn optimized_edges_over_many_distinct_lengths_keep_the_shortest_samples() {
    // The coarsened histogram's first edge was its first group's top minus 1: samples below it were
    // left out and counted as skipped, even with oversize="error".
    let lengths = long_context_lengths();
    let shortest = *lengths.iter().min().unwrap();
    let configs = [
        (Boundaries::Auto, Mode::Padded),
        (Boundaries::Count(7), Mode::Padded),
        (Boundaries::Auto, Mode::Packed { bucketed: true }),
    ];
    for (boundaries, mode) in configs {
        let cfg = Config {
            boundaries: boundaries.clone(),
            mode,
            ..Config::new(Batching::Tokens(262_144))
        };
        let planner = Planner::new(lengths.clone(), cfg).unwrap();
        assert!(
            planner.buckets().edges()[0] < shortest,
            "{boundaries:?} {mode:?}"
        );
        let plan = planner.plan(0).unwrap();
        assert_eq!(plan.stats().skipped, 0, "{boundaries:?} {mode:?}");
        assert_eq!(
            plan.indices().len(),
            lengths.len(),
            "{boundaries:?} {mode:?}"
        );
    }
}

#[test]
fn a_cost_model_past_f32_is_refused_instead_of_looping_forever() {
    use dflash_batch_core::CostModel;
    use dflash_batch_core::ErrorKind;
    // Batch costs beyond f32 were infinite, and the cost-class construction looped until the OOM killer.
    // A coefficient past 1e12 is refused with the settings now (within that range a batch priced past
    // f32 would need tens of millions of rows of 2^32 tokens; the planner's check stays for those).
    let huge = CostModel {
        linear: 1e39,
        quadratic: 0.0,
    };
    let rows = Config {
        cost: huge,
        balance_tolerance_ppm: Some(100_000),
        ..Config::new(Batching::Rows(4))
    };
    let e = Planner::new(vec![3u32, 9, 27, 81], rows).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::InvalidCost { .. }), "{e}");
    assert!(
        e.to_string().contains("each 0 or between 1e-12 and 1e12"),
        "{e}"
    );
}

//! `max_docs_per_row`: no packed row holds more samples than the cap, every admitted sample is in
//! exactly one row, no row passes its capacity (pieces padded to their multiple), on every path that
//! forms packed rows — composed (`form/compose.rs`), best fit (`form/pack.rs`: bucketed, sorted, and
//! epochs too large to arrange) — and the plan is the same for any thread count.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation, missing_docs)]

use dflash_batch_core::{Batching, Boundaries, Config, CostModel, ErrorKind, Mode, Plan, Planner};
use proptest::prelude::*;

const ATTENTION: CostModel = CostModel {
    linear: 1.0,
    quadratic: 1.0 / 4096.0,
};

#[derive(Debug, Clone)]
struct Case {
    lengths: Vec<u32>,
    capacity: u64,
    cap: u32,
    bucketed: bool,
    shuffle: bool,
    priced: bool,
    streamed: bool,
    context_parallel: u32,
    world_size: u32,
    accumulation: u32,
    seed: u64,
}

fn arb_case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(1u32..600, 1..700),
        prop_oneof![Just(256u64), Just(512), Just(1024)],
        1u32..12,
        any::<(bool, bool, bool, bool)>(),
        prop_oneof![Just(1u32), Just(2)],
        (1u32..5, 1u32..4),
        any::<u64>(),
    )
        .prop_map(
            |(lengths, capacity, cap, (bucketed, shuffle, priced, streamed), cp, ranks, seed)| {
                // Every sample fits a row once padded to its multiple (cp 2: 4 tokens).
                let lengths = lengths
                    .into_iter()
                    .map(|l| l.min(capacity as u32 - 4))
                    .collect();
                Case {
                    lengths,
                    capacity,
                    cap,
                    bucketed,
                    shuffle,
                    priced,
                    streamed,
                    context_parallel: cp,
                    world_size: ranks.0,
                    accumulation: ranks.1,
                    seed,
                }
            },
        )
}

/// Epoch `epoch`'s plan, or `None` where rows of so few samples cannot be split into a step for every
/// rank (`TooFewSamplesForRanks`, the documented refusal: one-sample rows do not split).
fn plan(planner: &Planner, epoch: u64) -> Result<Option<Plan>, TestCaseError> {
    match planner.plan(epoch) {
        Ok(plan) => Ok(Some(plan)),
        Err(e) if matches!(e.kind(), ErrorKind::TooFewSamplesForRanks { .. }) => Ok(None),
        Err(e) => Err(TestCaseError::fail(e.to_string())),
    }
}

fn planner(case: &Case, threads: usize) -> Planner {
    let config = Config {
        seed: case.seed,
        shuffle: case.shuffle,
        world_size: case.world_size,
        accumulation: case.accumulation,
        mode: Mode::Packed {
            bucketed: case.bucketed,
        },
        boundaries: if case.bucketed {
            Boundaries::Count(2)
        } else {
            Boundaries::Auto
        },
        cost: if case.priced {
            ATTENTION
        } else {
            CostModel::TOKENS
        },
        context_parallel: case.context_parallel,
        max_docs_per_row: Some(case.cap),
        ..Config::new(Batching::Tokens(case.capacity))
    };
    let planner = Planner::new(case.lengths.clone(), config)
        .unwrap()
        .with_threads(threads);
    if case.streamed {
        planner.with_arrange_limit(0)
    } else {
        planner
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn no_row_holds_more_than_the_cap(case in arb_case(), epoch in 0u64..3) {
        let Some(plan) = plan(&planner(&case, 1), epoch)? else {
            return Ok(());
        };
        let multiple = if case.context_parallel == 1 { 1 } else { 2 * u64::from(case.context_parallel) };
        let mut seen = vec![0u32; case.lengths.len()];
        for w in plan.offsets().windows(2) {
            let row = &plan.indices()[w[0] as usize..w[1] as usize];
            prop_assert!(!row.is_empty());
            prop_assert!(row.len() <= case.cap as usize, "{} samples, cap {}", row.len(), case.cap);
            let tokens: u64 = row
                .iter()
                .map(|&s| u64::from(case.lengths[s as usize]).div_ceil(multiple) * multiple)
                .sum();
            prop_assert!(tokens <= case.capacity, "{tokens} tokens in a row of {}", case.capacity);
            for &s in row {
                seen[s as usize] += 1;
            }
        }
        // Every sample once (splitting rows for equal steps repeats none).
        prop_assert!(seen.iter().all(|&n| n == 1));
        // The same plan on more threads.
        let again = planner(&case, 3).plan(epoch).unwrap();
        prop_assert_eq!(plan.indices(), again.indices());
        prop_assert_eq!(plan.offsets(), again.offsets());
    }

    /// Rows number at least what the cap needs, ⌈samples / cap⌉, and what the tokens need (the cap
    /// may even save a row or two: composing is not optimal either way).
    #[test]
    fn rows_number_at_least_what_the_cap_and_the_tokens_need(case in arb_case()) {
        let Some(capped) = plan(&planner(&case, 1), 0)? else {
            return Ok(());
        };
        let rows = capped.offsets().len() - 1;
        prop_assert!(rows >= case.lengths.len().div_ceil(case.cap as usize));
        let tokens: u64 = case.lengths.iter().map(|&l| u64::from(l)).sum();
        prop_assert!(rows as u64 >= tokens.div_ceil(case.capacity));
    }
}

#[test]
fn a_cap_of_one_gives_every_sample_its_own_row() {
    let lengths: Vec<u32> = (1..=40).collect();
    let case = Case {
        lengths,
        capacity: 256,
        cap: 1,
        bucketed: false,
        shuffle: true,
        priced: false,
        streamed: false,
        context_parallel: 1,
        world_size: 1,
        accumulation: 1,
        seed: 3,
    };
    let plan = planner(&case, 1).plan(0).unwrap();
    assert_eq!(plan.offsets().len() - 1, 40);
}

#[test]
fn a_cap_of_zero_and_a_cap_on_padded_batches_are_setting_errors() {
    for (mode, cap) in [(Mode::Packed { bucketed: false }, 0), (Mode::Padded, 4)] {
        let config = Config {
            mode,
            max_docs_per_row: Some(cap),
            ..Config::new(Batching::Tokens(256))
        };
        let error = Planner::new(vec![3u32, 4], config).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("max_docs_per_row"), "{message}");
    }
}

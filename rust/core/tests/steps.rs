//! Every epoch of one configuration and data has the same steps per rank, known before any plan:
//! trainers and LR schedulers read the count once.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use dflash_batch_core::workload::seed_lengths;
use dflash_batch_core::ErrorKind;
use dflash_batch_core::{Batching, Config, Mode, Planner};
use proptest::prelude::*;

/// Every admitted sample exactly once in every epoch, and the epoch's steps equal `steps`.
fn check_epochs(planner: &Planner, samples: usize, epochs: impl IntoIterator<Item = u64>) {
    let steps = planner.steps();
    for epoch in epochs {
        let plan = match planner.plan(epoch) {
            Ok(plan) => plan,
            Err(e) => {
                assert!(
                    matches!(e.kind(), ErrorKind::TooFewSamplesForRanks { .. }),
                    "{e}"
                );
                return;
            }
        };
        assert_eq!(plan.stats().steps, steps, "epoch {epoch}");
        let mut seen = plan.indices().to_vec();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(
            seen.len() + plan.stats().dropped as usize,
            samples,
            "epoch {epoch}"
        );
        assert_eq!(
            seen.len(),
            plan.indices().len(),
            "a sample twice in epoch {epoch}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Small sets, where counts scatter most relative to their size.
    #[test]
    fn small_sets_have_equal_steps_in_every_epoch(
        lengths in prop::collection::vec(1u32..600, 1..300),
        budget in 600u64..3000,
        world_size in 1u32..5,
        packed in any::<bool>(),
        drop_last in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mode = if packed { Mode::Packed { bucketed: false } } else { Mode::Padded };
        let cfg = Config { seed, world_size, mode, drop_last, ..Config::new(Batching::Tokens(budget)) };
        let Ok(planner) = Planner::new(lengths.clone(), cfg) else { return Ok(()) };
        check_epochs(&planner, lengths.len(), [5, 0, 1, 2, 3, 4, 6, 7, 8, 9]);
    }
}

#[test]
fn seed_workload_has_equal_steps_padded_packed_and_streamed() {
    let lengths = seed_lengths(30_000, 5).unwrap();
    for mode in [
        Mode::Padded,
        Mode::Packed { bucketed: false },
        Mode::Packed { bucketed: true },
    ] {
        for world_size in [1, 8] {
            let cfg = Config {
                seed: 3,
                world_size,
                mode,
                accumulation: 4,
                ..Config::new(Batching::Tokens(16_384))
            };
            let planner = Planner::new(lengths.clone(), cfg.clone()).unwrap();
            check_epochs(&planner, lengths.len(), 0..10);
            let streamed = Planner::new(lengths.clone(), cfg)
                .unwrap()
                .with_streamed_epochs();
            check_epochs(&streamed, lengths.len(), 0..4);
        }
    }
}

#[test]
fn steps_are_known_before_the_first_plan_and_do_not_depend_on_which_epoch_comes_first() {
    let lengths = seed_lengths(5_000, 1).unwrap();
    let cfg = Config {
        world_size: 4,
        ..Config::new(Batching::Tokens(16_384))
    };
    let first = Planner::new(lengths.clone(), cfg.clone()).unwrap();
    let late = Planner::new(lengths, cfg).unwrap();
    let plan = late.plan(7).unwrap();
    assert_eq!(first.steps(), plan.stats().steps);
    assert_eq!(first.plan(7).unwrap().indices(), plan.indices());
}

#[test]
fn fixed_rows_per_batch_are_never_split_for_the_count() {
    // Cut bucket by bucket, a fixed batch size forms the same count in every epoch: no margin.
    let lengths = seed_lengths(20_000, 2).unwrap();
    let planner = Planner::new(lengths.clone(), Config::new(Batching::Rows(8))).unwrap();
    for epoch in 0..5 {
        assert_eq!(planner.plan(epoch).unwrap().stats().split_batches, 0);
    }
    check_epochs(&planner, lengths.len(), 0..5);
}

#[test]
fn an_epoch_that_forms_too_many_batches_is_formed_again_and_stays_exact() {
    // The margin is about two deviations, so over many seeds some epochs form more batches than the
    // target and are drawn again; every one of them still plans each sample once in the shared steps.
    let lengths: Vec<u32> = (0..120).map(|i| 3 + i % 17).collect();
    let (mut again, mut epochs) = (0, 0);
    for seed in 0..60 {
        let cfg = Config {
            seed,
            ..Config::new(Batching::Tokens(64))
        };
        let planner = Planner::new(lengths.clone(), cfg).unwrap();
        for epoch in 0..40 {
            let reformed = planner.plan(epoch).unwrap().stats().reformed;
            assert!(reformed <= 17);
            if reformed > 0 {
                again += 1;
                check_epochs(&planner, lengths.len(), [epoch]);
            }
            epochs += 1;
        }
    }
    assert!(
        again > 0 && again * 10 < epochs,
        "{again} of {epochs} epochs drawn again"
    );
}

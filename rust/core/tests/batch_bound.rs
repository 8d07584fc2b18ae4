//! The batch bound the first plan reserves working memory by (`Planner::batch_bound`, `prepare.rs`):
//! no forming pass closes more batches, whatever the lengths, budget, mode or path, and a plan never
//! has more than twice it plus a step of ranks (what `plan_bytes` reserves for).
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use dflash_batch_core::{Batching, Config, CostModel, Mode, Planner};
use proptest::prelude::*;

fn mode_of(code: u8) -> Mode {
    match code {
        0 => Mode::Padded,
        1 => Mode::Packed { bucketed: false },
        _ => Mode::Packed { bucketed: true },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn no_epoch_forms_more_batches_than_the_bound(
        lengths in prop::collection::vec(1u32..=4096, 1..600),
        budget in 4096u64..=20_000,
        mode in 0u8..3,
        world in 1u32..=4,
        path in 0u8..3,
        attention in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mode = mode_of(mode);
        let config = Config {
            world_size: world,
            seed,
            mode,
            cost: if attention && mode != Mode::Padded {
                CostModel { linear: 1.0, quadratic: 1.0 / 8192.0 }
            } else {
                CostModel::TOKENS
            },
            ..Config::new(Batching::Tokens(budget))
        };
        let mut planner = Planner::new(lengths.clone(), config).unwrap();
        if path > 0 {
            planner = planner.with_streamed_epochs();
        }
        if path > 1 {
            planner = planner.with_arrange_limit(0);
        }
        let bound = planner.batch_bound();
        prop_assert!(bound <= lengths.len() as u64);
        for epoch in 0..3 {
            let Ok(plan) = planner.plan(epoch) else {
                return Ok(()); // too few samples for the ranks: refused, nothing reserved for
            };
            let formed = plan.len() as u64 - plan.stats().split_batches;
            prop_assert!(formed <= bound, "formed {formed} > bound {bound}");
            prop_assert!(plan.len() as u64 <= 2 * bound + u64::from(world));
        }
    }
}

#[test]
fn the_bound_is_exact_where_every_batch_fills() {
    // 8 rows of 512 tokens fill a 4096-token batch: 100 samples close at most ⌈100 / 8⌉ batches,
    // and each stream's end may flush one more (16 groups, the packed epoch's last, a bucket's own).
    let planner = Planner::new(vec![512u32; 100], Config::new(Batching::Tokens(4096))).unwrap();
    assert_eq!(planner.batch_bound(), 13 + 18);
    assert_eq!(planner.plan(0).unwrap().len(), 13);
    // Batches of one row each: one a sample, however many streams.
    let single = Planner::new(vec![4096u32; 10], Config::new(Batching::Tokens(4096))).unwrap();
    assert_eq!(single.batch_bound(), 10);
}

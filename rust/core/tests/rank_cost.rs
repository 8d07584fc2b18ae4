//! `Config::rank_cost`: ranks balanced by one price while the budget, the batches and the step count
//! stay as `cost` forms them (what a cost refitted from step times changes at an epoch boundary).
// Test helpers outside #[test] fns: unwrapping and narrowing casts of small test values are fine here.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use dflash_batch_core::metrics::{batch_costs, synchronous};
use dflash_batch_core::workload::seed_lengths;
use dflash_batch_core::{Batching, Config, CostModel, ErrorKind, Mode, Plan, Planner};
use proptest::prelude::*;

/// The attention price the tests balance for: a row of `L` costs `L + L²/4096`.
const ATTENTION: CostModel = CostModel {
    linear: 1.0,
    quadratic: 1.0 / 4096.0,
};

/// Every batch as its sorted rows, the batches sorted: what a plan trains, whatever the order. (An
/// epoch that forms fewer batches than its steps splits some of its last ones, and which are last
/// follows the balance: those may differ.)
fn batch_set(plan: &Plan) -> Vec<Vec<u32>> {
    let mut batches: Vec<Vec<u32>> = (0..plan.offsets().len() - 1)
        .map(|b| {
            let (s, e) = (plan.offsets()[b] as usize, plan.offsets()[b + 1] as usize);
            let mut rows = plan.indices()[s..e].to_vec();
            rows.sort_unstable();
            rows
        })
        .collect();
    batches.sort();
    batches
}

/// Synchronous efficiency per micro-batch of `plan` when a padded batch really takes `price`.
fn sync_at(
    lengths: &[u32],
    plan: &Plan,
    (world, accumulation): (usize, usize),
    price: CostModel,
) -> f64 {
    let costs = batch_costs(plan.offsets(), plan.indices(), |rows| {
        let longest = rows.iter().map(|&r| lengths[r as usize]).max().unwrap();
        rows.len() as f64 * price.row(u64::from(longest))
    });
    synchronous(&costs, world, accumulation)
        .unwrap()
        .per_micro_batch
}

/// The batches two plans share, as a fraction of `a`'s.
fn shared(a: &Plan, b: &Plan) -> f64 {
    let (a, b) = (batch_set(a), batch_set(b));
    let mut common = 0;
    let mut j = 0;
    for batch in &a {
        while j < b.len() && b[j] < *batch {
            j += 1;
        }
        if j < b.len() && b[j] == *batch {
            common += 1;
            j += 1;
        }
    }
    f64::from(common) / a.len() as f64
}

/// The plan's rows, sorted: every epoch trains each admitted sample once.
fn rows(plan: &Plan) -> Vec<u32> {
    let mut rows = plan.indices().to_vec();
    rows.sort_unstable();
    rows
}

#[test]
fn the_same_batches_and_steps_balanced_by_the_rank_cost() {
    let lengths = seed_lengths(60_000, 0).unwrap();
    // Inside each optimizer window of 8 × 4 batches, steps are cut from batches of similar cost:
    // with one micro-batch a step, a step's batches are fixed before balance, which only deals them.
    let base = Config {
        world_size: 8,
        accumulation: 4,
        ..Config::new(Batching::Tokens(16_384))
    };
    let ranked = Config {
        rank_cost: Some(ATTENTION),
        ..base.clone()
    };
    let plain = Planner::new(lengths.clone(), base).unwrap();
    let priced = Planner::new(lengths.clone(), ranked).unwrap();
    assert_eq!(
        plain.steps(),
        priced.steps(),
        "the step count is the budget's"
    );
    let (mut before, mut after) = (0.0, 0.0);
    for epoch in 0..3 {
        let (a, b) = (plain.plan(epoch).unwrap(), priced.plan(epoch).unwrap());
        assert_eq!(rows(&a), rows(&b), "epoch {epoch}: other samples");
        assert!(shared(&a, &b) > 0.999, "epoch {epoch}: other batches");
        assert_ne!(a.indices(), b.indices(), "epoch {epoch}: the same order");
        before += sync_at(&lengths, &a, (8, 4), ATTENTION);
        after += sync_at(&lengths, &b, (8, 4), ATTENTION);
    }
    // Balanced for the price the batches take, the ranks wait less for each other.
    assert!(after > before + 0.01, "{before} -> {after}");
}

#[test]
fn a_rank_cost_equal_to_the_cost_plans_what_the_cost_plans() {
    let lengths = seed_lengths(20_000, 1).unwrap();
    for cost in [CostModel::TOKENS, ATTENTION] {
        let base = Config {
            world_size: 4,
            accumulation: 2,
            cost,
            // In the attention price's units, the longest sample's row fits.
            ..Config::new(Batching::Tokens(65_536))
        };
        let same = Config {
            rank_cost: Some(cost),
            ..base.clone()
        };
        let (a, b) = (
            Planner::new(lengths.clone(), base).unwrap(),
            Planner::new(lengths.clone(), same).unwrap(),
        );
        let (a, b) = (a.plan(2).unwrap(), b.plan(2).unwrap());
        assert_eq!(a.offsets(), b.offsets());
        assert_eq!(a.indices(), b.indices());
    }
}

#[test]
fn each_bad_rank_cost_is_refused_naming_it() {
    let lengths = vec![5u32, 9, 17, 33];
    for bad in [(0.0, 0.0), (f64::NAN, 1.0), (1.0, -1.0), (5e-324, 0.0)] {
        let config = Config {
            rank_cost: Some(CostModel {
                linear: bad.0,
                quadratic: bad.1,
            }),
            ..Config::new(Batching::Tokens(64))
        };
        let error = Planner::new(lengths.clone(), config).unwrap_err();
        assert!(
            matches!(
                error.kind(),
                ErrorKind::InvalidCost {
                    setting: "rank_cost",
                    ..
                }
            ),
            "{bad:?}: {error}"
        );
        assert!(error.to_string().starts_with("rank_cost=("), "{error}");
        assert_eq!(error.kind().setting(), Some("rank_cost"));
    }
    let trimmed = Config {
        rank_cost: Some(ATTENTION),
        trim_steps: true,
        ..Config::new(Batching::Tokens(64))
    };
    let error = Planner::new(lengths, trimmed).unwrap_err();
    assert!(
        matches!(error.kind(), ErrorKind::TrimSetting { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("rank_cost=None"), "{error}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the data, ranks, accumulation, mode and prices: the same steps and batches, each
    /// plan a function of its inputs.
    #[test]
    fn rank_cost_changes_only_who_trains_what_when(
        lengths in prop::collection::vec(1u32..3_000, 40..600),
        world in 1u32..6,
        accumulation in 1u32..4,
        packed in any::<bool>(),
        quadratic in prop::sample::select(vec![0.0, 1e-4, 1e-2]),
        epoch in 0u64..5,
    ) {
        let base = Config {
            world_size: world,
            accumulation,
            mode: if packed { Mode::Packed { bucketed: false } } else { Mode::Padded },
            ..Config::new(Batching::Tokens(4_096))
        };
        let rank_cost = CostModel { linear: 1.0, quadratic };
        let ranked = Config { rank_cost: Some(rank_cost), ..base.clone() };
        let (Ok(plain), Ok(priced)) = (Planner::new(lengths.clone(), base), Planner::new(lengths.clone(), ranked))
        else {
            return Err(TestCaseError::fail("a valid configuration was refused"));
        };
        let (Ok(a), Ok(b)) = (plain.plan(epoch), priced.plan(epoch)) else {
            // Too few samples for the ranks: refused alike.
            prop_assert!(plain.plan(epoch).is_err() && priced.plan(epoch).is_err());
            return Ok(());
        };
        prop_assert_eq!(plain.steps(), priced.steps());
        prop_assert_eq!(rows(&a), rows(&b));
        prop_assert_eq!(a.offsets().len(), b.offsets().len());
        let again = priced.plan(epoch).unwrap();
        prop_assert_eq!(again.indices(), b.indices());
        prop_assert_eq!(again.offsets(), b.offsets());
    }
}

//! `Config::trim_steps`: what it promises on the seed workload, every epoch, and its refusals.
// Test helpers outside #[test] fns: unwrapping and narrowing casts of small test values are fine here.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use dflash_batch_core::metrics::{batch_costs, synchronous, Synchronous};
use dflash_batch_core::workload::seed_lengths;
use dflash_batch_core::{Batching, Config, CostModel, ErrorKind, Plan, Planner};

const BUDGET: u64 = 16_384;

fn config(accumulation: u32, cost: CostModel, trim_steps: bool) -> Config {
    Config {
        world_size: 8,
        accumulation,
        cost,
        trim_steps,
        ..Config::new(Batching::Tokens(BUDGET))
    }
}

fn sync(lengths: &[u32], plan: &Plan, cfg: &Config) -> Synchronous {
    let costs = batch_costs(plan.offsets(), plan.indices(), |rows| {
        let longest = rows.iter().map(|&r| lengths[r as usize]).max().unwrap();
        cfg.batch_cost(rows.len() as u64, longest)
    });
    synchronous(&costs, 8, cfg.accumulation as usize).unwrap()
}

/// Every sample once, every batch within budget and one bucket: the invariants trimming could break.
fn check(lengths: &[u32], planner: &Planner, plan: &Plan) {
    let mut seen = plan.indices().to_vec();
    seen.sort_unstable();
    assert!(
        seen.iter().copied().eq(0..lengths.len() as u32),
        "a sample lost or repeated"
    );
    let edges = planner.buckets().edges();
    let bucket = |l: u32| edges.partition_point(|&e| e < l);
    for i in 0..plan.len() {
        let rows = plan.batch(i).unwrap();
        let longest = rows.iter().map(|&r| lengths[r as usize]).max().unwrap();
        assert!(planner.config().batch_cost(rows.len() as u64, longest) <= BUDGET as f64);
        let b = bucket(lengths[rows[0] as usize]);
        assert!(
            rows.iter().all(|&r| bucket(lengths[r as usize]) == b),
            "batch mixes buckets"
        );
    }
}

#[test]
fn trimming_raises_synchronous_efficiency_where_steps_wait() {
    let lengths = seed_lengths(100_000, 1).unwrap();
    let attention = CostModel {
        linear: 1.0,
        quadratic: 1.0 / 30_720.0,
    };
    for (accumulation, cost, least_gain) in [(1, CostModel::TOKENS, 0.01), (4, attention, 0.004)] {
        let plain_cfg = config(accumulation, cost, false);
        let trim_cfg = config(accumulation, cost, true);
        let plain = Planner::new(lengths.clone(), plain_cfg.clone()).unwrap();
        let trimmed = Planner::new(lengths.clone(), trim_cfg.clone()).unwrap();
        for epoch in 0..3 {
            let (p, t) = (plain.plan(epoch).unwrap(), trimmed.plan(epoch).unwrap());
            check(&lengths, &trimmed, &t);
            let (before, after) = (
                sync(&lengths, &p, &plain_cfg),
                sync(&lengths, &t, &trim_cfg),
            );
            assert!(
                after.per_micro_batch >= before.per_micro_batch + least_gain,
                "accumulation {accumulation}, epoch {epoch}: {before:?} → {after:?}"
            );
            // More steps (the trimmed rows'), the same every epoch.
            assert!(t.len() > p.len());
            assert_eq!(t.stats().steps, trimmed.steps());
            assert!(t.stats().efficiency() > 0.97, "{:?}", t.stats());
        }
    }
}

#[test]
fn trimmed_plans_do_not_depend_on_thread_count() {
    let lengths = seed_lengths(300_000, 2).unwrap();
    let cfg = config(1, CostModel::TOKENS, true);
    let one = Planner::new(lengths.clone(), cfg.clone())
        .unwrap()
        .with_threads(1);
    let four = Planner::new(lengths.clone(), cfg).unwrap().with_threads(4);
    for epoch in [0, 5] {
        let plan = one.plan(epoch).unwrap();
        check(&lengths, &one, &plan);
        assert_eq!(plan, four.plan(epoch).unwrap());
    }
}

#[test]
fn one_rank_plans_are_untouched_by_trimming() {
    let lengths = seed_lengths(20_000, 3).unwrap();
    let plan = |trim_steps| {
        let cfg = Config {
            world_size: 1,
            trim_steps,
            ..Config::new(Batching::Tokens(BUDGET))
        };
        Planner::new(lengths.clone(), cfg).unwrap().plan(2).unwrap()
    };
    assert_eq!(plan(true), plan(false));
}

#[test]
fn trimming_changes_the_fingerprint() {
    let lengths = seed_lengths(1_000, 4).unwrap();
    let fingerprint = |trim| {
        Planner::new(lengths.clone(), config(1, CostModel::TOKENS, trim))
            .unwrap()
            .fingerprint()
    };
    assert_ne!(fingerprint(true), fingerprint(false));
}

#[test]
fn trimming_refuses_what_it_cannot_work_with() {
    let base = config(1, CostModel::TOKENS, true);
    let cases = [
        (
            Config {
                batching: Batching::Rows(8),
                ..base.clone()
            },
            "needs max_tokens",
        ),
        (
            Config {
                mode: dflash_batch_core::Mode::Packed { bucketed: false },
                ..base.clone()
            },
            "mode='packed'",
        ),
        (
            Config {
                balance_tolerance_ppm: Some(100_000),
                ..base.clone()
            },
            "balance_tolerance=None",
        ),
    ];
    for (cfg, fix) in cases {
        let err = Planner::new(vec![10u32; 100], cfg).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::TrimSetting { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.starts_with("trim_steps=True ") && message.contains(fix),
            "{message}"
        );
    }
}

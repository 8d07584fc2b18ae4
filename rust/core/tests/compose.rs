//! Packed rows composed by attention cost (`plan/form/compose.rs`): against rows filled by tokens
//! (best fit over a window, `pack.rs`) on random mixes of lengths, the rows' attention `Σ l²` spreads
//! less, and the plans stay complete, within capacity and the same for any thread count (the oracle
//! of `planner.rs` covers both constructions).
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::unwrap_used,
    missing_docs
)]

use dflash_batch_core::{Batching, Config, CostModel, Mode, Plan, Planner};
use proptest::prelude::*;

const ATTENTION: CostModel = CostModel {
    linear: 1.0,
    quadratic: 1.0 / 30_720.0,
};

/// The standard deviation of the rows' `Σ l²`.
fn attention_spread(lengths: &[u32], plan: &Plan) -> f64 {
    let offsets = plan.offsets();
    let squares: Vec<f64> = offsets
        .windows(2)
        .map(|w| {
            plan.indices()[w[0] as usize..w[1] as usize]
                .iter()
                .map(|&s| f64::from(lengths[s as usize]).powi(2))
                .sum()
        })
        .collect();
    let mean = squares.iter().sum::<f64>() / squares.len() as f64;
    let variance = squares.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / squares.len() as f64;
    variance.sqrt()
}

fn plan(lengths: &[u32], capacity: u64, cost: CostModel, seed: u64) -> Plan {
    let config = Config {
        seed,
        world_size: 4,
        accumulation: 2,
        mode: Mode::Packed { bucketed: false },
        cost,
        ..Config::new(Batching::Tokens(capacity))
    };
    Planner::new(lengths.to_vec(), config)
        .unwrap()
        .plan(1)
        .unwrap()
}

/// Random mixes of the seed workload's shape at any scale: five length ranges, each twice the one
/// below, up to half a row (`[C/64, C/2]`), with random shares, log-uniform inside each.
fn arb_mix() -> impl Strategy<Value = (Vec<u32>, u64, u64)> {
    (
        2_000usize..12_000,
        prop::array::uniform5(1u32..100),
        prop_oneof![Just(4_096u64), Just(16_384u64)],
        any::<u64>(),
    )
        .prop_map(|(n, shares, capacity, seed)| {
            let total: u32 = shares.iter().sum();
            let mut state = seed | 1;
            let mut unit = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 11) as f64 / (1u64 << 53) as f64
            };
            let lengths = (0..n)
                .map(|_| {
                    let mut pick = unit() * f64::from(total);
                    let bin = shares
                        .iter()
                        .position(|&s| {
                            pick -= f64::from(s);
                            pick < 0.0
                        })
                        .unwrap_or(4);
                    let low = capacity as f64 / f64::from(64u32 >> bin);
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    let l = (low * 2f64.powf(unit())) as u32;
                    l.max(1)
                })
                .collect();
            (lengths, capacity, seed)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn rows_composed_by_cost_spread_their_attention_less((lengths, capacity, seed) in arb_mix()) {
        let by_tokens = attention_spread(&lengths, &plan(&lengths, capacity, CostModel::TOKENS, seed));
        let by_cost = attention_spread(&lengths, &plan(&lengths, capacity, ATTENTION, seed));
        // 0.15–0.69 of the token-filled rows' spread over 300 cases (seed workload: 0.31).
        prop_assert!(by_cost < by_tokens, "{by_cost} against {by_tokens}");
    }
}

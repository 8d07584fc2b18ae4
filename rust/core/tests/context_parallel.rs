//! Packed rows for context parallelism (`Config::context_parallel`, pieces padded to
//! `Config::piece_multiple`): whatever the lengths, the padded pieces of a row fit it, every
//! admitted sample is planned once, the plan is the same for any thread count and within the batch
//! bound, and the settings that cannot work are refused by name.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation, missing_docs)]

use dflash_batch_core::{Batching, Config, CostModel, ErrorKind, Mode, Oversize, Planner};
use proptest::prelude::*;

fn config(capacity: u64, cp: u32, pad: u32, bucketed: bool, attention: bool) -> Config {
    Config {
        mode: Mode::Packed { bucketed },
        context_parallel: cp,
        pad_to_multiple_of: pad,
        world_size: 2,
        accumulation: 2,
        cost: if attention {
            CostModel {
                linear: 1.0,
                quadratic: 1.0 / 8192.0,
            }
        } else {
            CostModel::TOKENS
        },
        ..Config::new(Batching::Tokens(capacity))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn padded_pieces_fit_their_rows_and_every_sample_is_planned_once(
        lengths in prop::collection::vec(1u32..=3000, 1..500),
        cp in prop_oneof![Just(1u32), Just(2), Just(4), Just(8)],
        pad in prop_oneof![Just(1u32), Just(3), Just(16)],
        rows_of in 1u64..=8,
        bucketed in any::<bool>(),
        attention in any::<bool>(),
        truncate in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mut cfg = config(0, cp, pad, bucketed, attention);
        let multiple = cfg.piece_multiple();
        let capacity = (1024 * rows_of).div_ceil(multiple) * multiple;
        cfg.batching = Batching::Tokens(capacity);
        cfg.seed = seed;
        if truncate {
            cfg.oversize = Oversize::Truncate;
        }
        let Ok(planner) = Planner::new(lengths.clone(), cfg.clone()) else {
            // Samples over the row with oversize='error': refused whatever cp is.
            prop_assert!(!truncate && lengths.iter().any(|&l| u64::from(l) > capacity));
            return Ok(());
        };
        let planned = planner.lengths().to_u32_vec().unwrap();
        let Ok(plan) = planner.plan(seed % 3) else {
            return Ok(()); // fewer rows than ranks: refused
        };
        let mut seen = vec![0u32; planned.len()];
        for row in plan.offsets().windows(2) {
            let members = &plan.indices()[row[0] as usize..row[1] as usize];
            let padded: u64 = members.iter().map(|&e| u64::from(cfg.piece(planned[e as usize]))).sum();
            prop_assert!(padded <= capacity, "row of {padded} padded tokens > {capacity}");
            for &e in members {
                let piece = u64::from(cfg.piece(planned[e as usize]));
                prop_assert_eq!(piece % multiple, 0);
                if cp > 1 {
                    prop_assert_eq!(piece % (2 * u64::from(cp)), 0);
                }
                seen[e as usize] += 1;
            }
        }
        // Split rows (world_size 2) may repeat a row's samples on the last step only.
        let split = plan.stats().split_batches;
        if split == 0 {
            prop_assert!(seen.iter().all(|&n| n == 1), "a sample planned {:?} times", seen.iter().max());
        }
        let formed = plan.len() as u64 - split;
        prop_assert!(formed <= planner.batch_bound());
        let threaded = Planner::new(lengths, cfg).unwrap().with_threads(3).plan(seed % 3).unwrap();
        prop_assert_eq!(threaded.offsets(), plan.offsets());
        prop_assert_eq!(threaded.indices(), plan.indices());
    }
}

#[test]
fn padding_to_the_multiple_takes_room_a_row_would_otherwise_fill() {
    // 2 × 5 tokens fill a row of 10 unpadded; with cp = 2 each takes 8 of a row of 16, so 4 samples
    // of 5 need two rows (and without cp, one row of 16 holds 3).
    let plain = Planner::new(vec![5u32; 4], config(16, 1, 1, false, false)).unwrap();
    let cp = Planner::new(vec![5u32; 4], config(16, 2, 1, false, false)).unwrap();
    let (plain, cp) = (plain.plan(0).unwrap(), cp.plan(0).unwrap());
    assert_eq!(plain.len(), 2);
    assert_eq!(cp.len(), 2);
    assert_eq!(cp.stats().real_tokens, 20);
    assert_eq!(cp.stats().padded_tokens, 32);
    let rows: Vec<usize> = cp
        .offsets()
        .windows(2)
        .map(|w| (w[1] - w[0]) as usize)
        .collect();
    assert_eq!(rows, [2, 2]);
}

#[test]
fn settings_that_cannot_work_are_refused_by_name() {
    let err = |cfg: Config| Planner::new(vec![4u32; 8], cfg).unwrap_err();
    let not_multiple = err(config(100, 4, 1, false, false));
    assert!(matches!(
        not_multiple.kind(),
        ErrorKind::PieceMultiple {
            capacity: 100,
            multiple: 8,
            ..
        }
    ));
    let message = not_multiple.to_string();
    assert!(message.contains("max_tokens=104 or 96"), "{message}");
    assert!(message.contains("2·context_parallel=8"), "{message}");
    // pad_to_multiple_of joins as the least common multiple: lcm(6, 8) = 24.
    let lcm = err(config(64, 4, 6, false, false));
    assert!(
        matches!(lcm.kind(), ErrorKind::PieceMultiple { multiple: 24, .. }),
        "{lcm}"
    );
    let padded = Config {
        context_parallel: 2,
        ..Config::new(Batching::Tokens(64))
    };
    let padded = err(padded);
    assert!(matches!(
        padded.kind(),
        ErrorKind::ContextParallelSetting {
            context_parallel: 2,
            ..
        }
    ));
    assert!(
        padded.to_string().contains("pass mode='packed'"),
        "{padded}"
    );
    let zero = err(config(64, 0, 1, false, false));
    assert!(matches!(
        zero.kind(),
        ErrorKind::InvalidSetting {
            name: "context_parallel",
            ..
        }
    ));
}

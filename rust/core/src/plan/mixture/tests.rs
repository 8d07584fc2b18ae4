use super::*;
use crate::error::ErrorKind;
use crate::plan::config::{Batching, Config};
use crate::plan::planner::Planner;
use proptest::prelude::*;
use std::collections::HashMap;

fn mixture(sources: &[(&str, u32, f64)], unit: Unit) -> Mixture {
    Mixture::new(sources.iter().map(|&(n, r, w)| (n.to_string(), r, w)), unit)
}

fn kind(result: Result<impl std::fmt::Debug>) -> ErrorKind {
    result.expect_err("refused").kind().clone()
}

#[test]
fn largest_remainder_adds_up_exactly_and_breaks_ties_to_the_earlier() {
    assert_eq!(largest_remainder(10, &[0.5, 0.5]), [5, 5]);
    assert_eq!(largest_remainder(10, &[1.0 / 3.0; 3]), [4, 3, 3]);
    assert_eq!(largest_remainder(7, &[0.6, 0.3, 0.1]), [4, 2, 1]);
    assert_eq!(largest_remainder(0, &[0.6, 0.4]), [0, 0]);
    assert_eq!(largest_remainder(3, &[0.0, 1.0]), [0, 3]);
    // 0.1 + 0.2 + 0.7 is not 1 in floats; the shares still add up.
    assert_eq!(largest_remainder(1000, &[0.1, 0.2, 0.7]), [100, 200, 700]);
}

#[test]
fn each_bad_mixture_is_its_own_kind() {
    let ok = |m: &Mixture, rows| m.validate(rows);
    let m = mixture(&[("a", 2, 0.5), ("b", 2, 0.4)], Unit::Samples);
    assert!(matches!(kind(ok(&m, 4)), ErrorKind::MixtureWeights { .. }));
    let m = mixture(&[("a", 2, 1.5), ("b", 2, -0.5)], Unit::Samples);
    assert!(matches!(kind(ok(&m, 4)), ErrorKind::MixtureWeight { source, .. } if source == "b"));
    let m = mixture(&[("a", 2, f64::NAN), ("b", 2, 1.0)], Unit::Samples);
    assert!(matches!(kind(ok(&m, 4)), ErrorKind::MixtureWeight { source, .. } if source == "a"));
    let m = mixture(&[("a", 0, 0.5), ("b", 4, 0.5)], Unit::Samples);
    assert!(matches!(kind(ok(&m, 4)), ErrorKind::EmptySource { source } if source == "a"));
    let m = mixture(&[("a", 2, 0.5), ("a", 2, 0.5)], Unit::Samples);
    assert!(matches!(
        kind(ok(&m, 4)),
        ErrorKind::MixtureSetting {
            setting: "sources",
            ..
        }
    ));
    let m = mixture(&[("a", 2, 0.5), ("b", 2, 0.5)], Unit::Samples);
    assert!(matches!(
        kind(ok(&m, 5)),
        ErrorKind::MixtureSetting {
            setting: "sources",
            ..
        }
    ));
    assert!(matches!(
        kind(ok(&mixture(&[], Unit::Samples), 0)),
        ErrorKind::MixtureSetting { .. }
    ));
    let capped = Mixture {
        max_repeat: 0.5,
        ..m.clone()
    };
    assert!(matches!(
        kind(ok(&capped, 4)),
        ErrorKind::MixtureSetting {
            setting: "max_repeat",
            ..
        }
    ));
    let sized = Mixture {
        epoch_size: Some(0),
        ..m.clone()
    };
    assert!(matches!(
        kind(ok(&sized, 4)),
        ErrorKind::MixtureSetting {
            setting: "epoch_size",
            ..
        }
    ));
    assert!(ok(&m, 4).is_ok());
}

#[test]
fn a_source_too_small_for_its_weight_is_named() {
    // b holds 2 of 12 rows but asks for 0.9 of 12: 10.8 → 11 samples, 5.5 copies > 4.
    let m = mixture(&[("a", 10, 0.1), ("b", 2, 0.9)], Unit::Samples);
    let lengths = vec![5u32; 12];
    let error = Mix::new(m.clone(), &lengths, |_| true).unwrap_err();
    assert!(
        matches!(error.kind(), ErrorKind::SourceTooSmall { source, share: 11, total: 2, .. } if source == "b")
    );
    assert!(error.to_string().contains("max_repeat=4.0"), "{error}");
    let raised = Mixture {
        max_repeat: 6.0,
        ..m
    };
    let mix = Mix::new(raised, &lengths, |_| true).unwrap();
    assert_eq!(mix.quotas[1], Quota { copies: 5, rest: 1 });
}

#[test]
fn planner_settings_a_mixture_does_not_take_are_refused() {
    let m = mixture(&[("a", 3, 0.5), ("b", 3, 0.5)], Unit::Samples);
    let config = Config {
        shuffle: false,
        ..Config::new(Batching::Rows(2))
    };
    let refused = Planner::with_mixture(vec![4u32; 6], config, m.clone());
    assert!(matches!(
        kind(refused),
        ErrorKind::MixtureSetting {
            setting: "shuffle",
            ..
        }
    ));
    let config = Config {
        oversize: crate::plan::config::Oversize::Truncate,
        mode: crate::plan::config::Mode::Packed { bucketed: false },
        ..Config::new(Batching::Tokens(8))
    };
    let refused = Planner::with_mixture(vec![4u32; 6], config, m);
    assert!(matches!(
        kind(refused),
        ErrorKind::MixtureSetting {
            setting: "oversize",
            ..
        }
    ));
}

/// How many times each row appears in `rows`.
fn counts(rows: &[u32]) -> HashMap<u32, u32> {
    let mut counts = HashMap::new();
    for &r in rows {
        *counts.entry(r).or_insert(0) += 1;
    }
    counts
}

#[test]
fn a_down_sampled_source_walks_through_its_rows_before_repeating_any() {
    // Epochs of 10: a, 10 rows, at 3 an epoch (a cycle of 3 epochs holds 9 of them); b, 2 rows, 3.5
    // copies.
    let m = Mixture {
        epoch_size: Some(10),
        ..mixture(
            &[("a", 10, 3.0 / 10.0), ("b", 2, 7.0 / 10.0)],
            Unit::Samples,
        )
    };
    let lengths = vec![1u32; 12];
    let mix = Mix::new(m, &lengths, |_| true).unwrap();
    let epochs: Vec<Vec<u32>> = (0..6)
        .map(|e| mix.population(&lengths, 3, e, None).rows)
        .collect();
    for rows in &epochs {
        assert_eq!(rows.len(), 10, "the epoch's size");
        let a: Vec<u32> = rows.iter().copied().filter(|&r| r < 10).collect();
        assert_eq!(a.len(), 3, "a's share exactly");
        assert!(counts(&a).values().all(|&c| c == 1), "once per epoch");
        let b = counts(
            &rows
                .iter()
                .copied()
                .filter(|&r| r >= 10)
                .collect::<Vec<_>>(),
        );
        assert_eq!(b.values().sum::<u32>(), 7);
        assert!(
            b.values().all(|&c| c == 3 || c == 4),
            "repeats as even as can be: {b:?}"
        );
    }
    for cycle in [&epochs[..3], &epochs[3..]] {
        let a: Vec<u32> = cycle.concat().into_iter().filter(|&r| r < 10).collect();
        assert!(
            counts(&a).values().all(|&c| c == 1),
            "a cycle repeats no row: {cycle:?}"
        );
    }
    assert_ne!(epochs[0], epochs[3], "another cycle, another draw");
}

#[test]
fn token_shares_are_within_one_sample() {
    let lengths: Vec<u32> = (0..200).map(|i| 10 + (i * 37) % 90).collect();
    let m = mixture(&[("a", 120, 0.25), ("b", 80, 0.75)], Unit::Tokens);
    let mix = Mix::new(m, &lengths, |_| true).unwrap();
    let total: u64 = lengths.iter().map(|&l| u64::from(l)).sum();
    let want = largest_remainder(total, &[0.25, 0.75]);
    for epoch in 0..8 {
        let rows = mix.population(&lengths, 1, epoch, None).rows;
        let tokens = |range: std::ops::Range<u32>| -> u64 {
            rows.iter()
                .filter(|r| range.contains(r))
                .map(|&r| u64::from(lengths[r as usize]))
                .sum()
        };
        assert!(
            tokens(0..120).abs_diff(want[0]) <= 99,
            "{} vs {}",
            tokens(0..120),
            want[0]
        );
        assert!(tokens(120..200).abs_diff(want[1]) <= 99);
    }
}

fn config(world_size: u32, accumulation: u32) -> Config {
    Config {
        world_size,
        accumulation,
        seed: 11,
        ..Config::new(Batching::Tokens(64))
    }
}

/// Every row of `plan` with its multiplicity, sorted.
fn sorted(mut rows: Vec<u32>) -> Vec<u32> {
    rows.sort_unstable();
    rows
}

#[test]
fn a_plan_trains_the_epochs_selection_and_is_the_same_for_any_thread_count() {
    let lengths: Vec<u32> = (0..300).map(|i| 1 + (i * 13) % 31).collect();
    let m = mixture(
        &[("a", 100, 0.2), ("b", 150, 0.5), ("c", 50, 0.3)],
        Unit::Samples,
    );
    let planner = Planner::with_mixture(lengths.clone(), config(2, 2), m.clone()).unwrap();
    let single = Planner::with_mixture(lengths.clone(), config(2, 2), m)
        .unwrap()
        .with_threads(1);
    let steps = planner.steps();
    for epoch in 0..4 {
        let plan = planner.plan(epoch).unwrap();
        assert_eq!(
            plan,
            single.plan(epoch).unwrap(),
            "thread-count independent"
        );
        assert_eq!(plan.len() as u64, steps * 2, "every epoch the same steps");
        let mix = planner.mix.as_ref().unwrap();
        let chosen = mix.population(&lengths, 11, plan_key(&plan), None).rows;
        assert_eq!(
            sorted(plan.indices().to_vec()),
            sorted(chosen),
            "the selection, once each"
        );
        let per_source = |s: usize| {
            plan.indices()
                .iter()
                .filter(|&&r| mix.source_of(r) == s)
                .count()
        };
        assert_eq!((per_source(0), per_source(1), per_source(2)), (60, 150, 90));
        for i in 0..plan.len() {
            let batch = plan.batch(i).unwrap();
            let longest = batch.iter().map(|&r| lengths[r as usize]).max().unwrap();
            assert!(
                batch.len() as u64 * u64::from(longest) <= 64,
                "within the budget"
            );
        }
    }
}

/// The key a plan's epoch was formed with (its own, in these small cases: no epoch is formed again).
fn plan_key(plan: &crate::Plan) -> u64 {
    assert_eq!(plan.stats().reformed, 0);
    plan.epoch()
}

#[test]
fn interleaving_keeps_every_slots_length_and_every_row() {
    let lengths: Vec<u32> = (0..2000).map(|i| 1 + (i * 7919) % 40).collect();
    let m = mixture(&[("a", 1200, 0.6), ("b", 800, 0.4)], Unit::Tokens);
    let mix = Mix::new(m, &lengths, |_| true).unwrap();
    let mut order: Vec<u32> = (0..2000).chain(0..300).collect();
    crate::rng::shuffle(
        &mut crate::rng::Pcg64::new(1, 2, crate::rng::Stream::Workload),
        &mut order,
    );
    let before = order.clone();
    interleave(&mut order, &lengths, &mix, None);
    assert_ne!(order, before, "sources moved");
    assert_eq!(
        sorted(order.clone()),
        sorted(before.clone()),
        "the same rows, as often"
    );
    for (a, b) in before.iter().zip(&order) {
        assert_eq!(
            lengths[*a as usize], lengths[*b as usize],
            "each slot keeps its length"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Shares exact in samples, repeats within the cap and as even as can be, a down-sampled source's
    /// rows at most once an epoch — for any weights, sizes and cap.
    #[test]
    fn selections_hold_their_shares(
        sizes in prop::collection::vec(1u32..40, 1..5),
        raw in prop::collection::vec(0.0f64..1.0, 5),
        cap in 1.0f64..6.0,
        size in prop::option::of(1u64..200),
        key in 0u64..50,
    ) {
        let weights: Vec<f64> = raw[..sizes.len()].iter().map(|w| w + 0.01).collect();
        let sum: f64 = weights.iter().sum();
        let sources: Vec<(String, u32, f64)> = sizes.iter().zip(&weights).enumerate()
            .map(|(i, (&n, &w))| (format!("s{i}"), n, w / sum)).collect();
        let m = Mixture { max_repeat: cap, epoch_size: size, ..Mixture::new(sources, Unit::Samples) };
        let rows: u32 = sizes.iter().sum();
        let lengths = vec![3u32; rows as usize];
        let mix = match Mix::new(m.clone(), &lengths, |_| true) {
            Ok(mix) => mix,
            Err(error) => {
                let too_small = matches!(error.kind(), ErrorKind::SourceTooSmall { .. });
                prop_assert!(too_small, "{}", error);
                return Ok(());
            }
        };
        let shares = largest_remainder(size.unwrap_or(u64::from(rows)), &m.sources.iter().map(|s| s.weight).collect::<Vec<_>>());
        let chosen = mix.population(&lengths, 5, key, None).rows;
        let count = counts(&chosen);
        for (s, &share) in shares.iter().enumerate() {
            let (lo, hi) = (mix.bounds[s], mix.bounds[s + 1]);
            let mine: u64 = (lo..hi).map(|r| u64::from(count.get(&r).copied().unwrap_or(0))).sum();
            prop_assert_eq!(mine, share);
            let n = u64::from(hi - lo);
            for r in lo..hi {
                let c = u64::from(count.get(&r).copied().unwrap_or(0));
                prop_assert!(c == share / n || c == share / n + 1, "row {} {} times of {}", r, c, share);
                prop_assert!(c as f64 <= cap.ceil());
            }
        }
    }
}

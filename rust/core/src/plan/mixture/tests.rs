use super::quotas::largest_remainder;
use super::slices::Quota;
use super::testing::{counts, mixture};
use super::*;
use crate::error::ErrorKind;
use crate::plan::config::{Batching, Config};
use crate::plan::planner::Planner;
use proptest::prelude::*;

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
    let error = Mix::new(m.clone(), &lengths, |_| true, 0, None).unwrap_err();
    assert!(
        matches!(error.kind(), ErrorKind::SourceTooSmall { source, share: 11, total: 2, .. } if source == "b")
    );
    assert!(error.to_string().contains("max_repeat=4.0"), "{error}");
    let raised = Mixture {
        max_repeat: 6.0,
        ..m
    };
    let mix = Mix::new(raised, &lengths, |_| true, 0, None).unwrap();
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
    let mix = Mix::new(m, &lengths, |_| true, 3, None).unwrap();
    let epochs: Vec<Vec<u32>> = (0..6).map(|e| mix.population(e)).collect();
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
    let mut mix = Mix::new(m, &lengths, |_| true, 1, None).unwrap();
    let total: u64 = lengths.iter().map(|&l| u64::from(l)).sum();
    let want = largest_remainder(total, &[0.25, 0.75]);
    let per_source: Vec<Vec<u32>> = (0..8).map(|e| mix.population(e)).collect();
    // Grouped by bucket (lengths in tens), as a planner groups them: the shares hold as well.
    mix.regroup(10, |l| (l / 10) as usize);
    let by_bucket: Vec<Vec<u32>> = (0..8).map(|e| mix.population(e)).collect();
    for rows in per_source.iter().chain(&by_bucket) {
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// In tokens, grouped by bucket or not, each source's tokens are within one of its samples of
    /// its share, and a down-sampled source's rows appear at most once.
    #[test]
    fn token_selections_are_within_one_sample(
        sizes in prop::collection::vec(1u32..60, 1..5),
        raw in prop::collection::vec(0.0f64..1.0, 5),
        buckets in 1usize..6,
        key in 0u64..40,
        seed in 0u64..1000,
    ) {
        let weights: Vec<f64> = raw[..sizes.len()].iter().map(|w| w + 0.01).collect();
        let sum: f64 = weights.iter().sum();
        let sources: Vec<(String, u32, f64)> = sizes.iter().zip(&weights).enumerate()
            .map(|(i, (&n, &w))| (format!("s{i}"), n, w / sum)).collect();
        let m = Mixture { max_repeat: 1000.0, ..Mixture::new(sources, Unit::Tokens) };
        let rows: u32 = sizes.iter().sum();
        let lengths: Vec<u32> = (0..rows).map(|r| 1 + (r * 7919 + u32::try_from(seed).unwrap()) % 50).collect();
        let mut mix = Mix::new(m.clone(), &lengths, |_| true, seed, None).unwrap();
        if buckets > 1 {
            mix.regroup(buckets, |l| l as usize % buckets);
        }
        let total: u64 = lengths.iter().map(|&l| u64::from(l)).sum();
        let shares = largest_remainder(total, &m.sources.iter().map(|s| s.weight).collect::<Vec<_>>());
        let chosen = mix.population(key);
        let count = counts(&chosen);
        for (s, &share) in shares.iter().enumerate() {
            let (lo, hi) = (mix.bounds[s], mix.bounds[s + 1]);
            let tokens: u64 = chosen.iter().filter(|&&r| (lo..hi).contains(&r)).map(|&r| u64::from(lengths[r as usize])).sum();
            let longest = (lo..hi).map(|r| u64::from(lengths[r as usize])).max().unwrap();
            prop_assert!(tokens.abs_diff(share) <= longest, "source {}: {} tokens for {}", s, tokens, share);
            let source_total: u64 = (lo..hi).map(|r| u64::from(lengths[r as usize])).sum();
            if share < source_total {
                prop_assert!((lo..hi).all(|r| count.get(&r).copied().unwrap_or(0) <= 1));
            }
        }
    }

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
        let mix = match Mix::new(m.clone(), &lengths, |_| true, 5, None) {
            Ok(mix) => mix,
            Err(error) => {
                let too_small = matches!(error.kind(), ErrorKind::SourceTooSmall { .. });
                prop_assert!(too_small, "{}", error);
                return Ok(());
            }
        };
        let shares = largest_remainder(size.unwrap_or(u64::from(rows)), &m.sources.iter().map(|s| s.weight).collect::<Vec<_>>());
        let chosen = mix.population(key);
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

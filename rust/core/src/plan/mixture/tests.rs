use super::*;
use crate::error::ErrorKind;
use crate::plan::config::{Batching, Config, Mode};
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
        let chosen = mix.population(plan_key(&plan));
        assert_eq!(
            sorted(plan.indices().to_vec()),
            sorted(chosen),
            "the selection, once each"
        );
        let per_source = |s: usize| {
            plan.indices()
                .iter()
                .filter(|&&r| mix.labels().source_of(r) == s)
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

#[test]
fn epochs_too_large_to_arrange_train_the_selection_too_for_any_thread_count() {
    let lengths: Vec<u32> = (0..300).map(|i| 1 + (i * 13) % 31).collect();
    let m = mixture(
        &[("a", 100, 0.2), ("b", 150, 0.5), ("c", 50, 0.3)],
        Unit::Tokens,
    );
    for mode in [Mode::Padded, Mode::Packed { bucketed: false }] {
        let config = Config {
            mode,
            ..config(2, 2)
        };
        let planner = Planner::with_mixture(lengths.clone(), config.clone(), m.clone())
            .unwrap()
            .with_arrange_limit(0);
        let single = Planner::with_mixture(lengths.clone(), config, m.clone())
            .unwrap()
            .with_arrange_limit(0)
            .with_threads(1);
        for epoch in 0..3 {
            let plan = planner.plan(epoch).unwrap();
            assert_eq!(
                plan,
                single.plan(epoch).unwrap(),
                "thread-count independent"
            );
            let mix = planner.mix.as_ref().unwrap();
            let chosen = mix.population(plan.epoch());
            assert_eq!(sorted(plan.indices().to_vec()), sorted(chosen), "{mode:?}");
        }
    }
}

/// The key a plan's epoch was formed with (its own, in these small cases: no epoch is formed again).
fn plan_key(plan: &crate::Plan) -> u64 {
    assert_eq!(plan.stats().reformed, 0);
    plan.epoch()
}

#[test]
fn grouped_by_bucket_a_cycle_still_repeats_no_row_and_holds_every_bucket_in_proportion() {
    // a: 400 rows of four lengths (buckets), down-sampled to 100 an epoch: a cycle of 4 epochs
    // holds every row once, and each epoch ~25 rows of each bucket.
    let m = Mixture {
        epoch_size: Some(200),
        ..mixture(&[("a", 400, 0.5), ("b", 100, 0.5)], Unit::Samples)
    };
    let lengths: Vec<u32> = (0..500).map(|r| 1 + r % 4).collect();
    let mut mix = Mix::new(m, &lengths, |_| true, 7, None).unwrap();
    mix.regroup(4, |l| (l - 1) as usize);
    let epochs: Vec<Vec<u32>> = (0..8).map(|e| mix.population(e)).collect();
    for cycle in [&epochs[..4], &epochs[4..]] {
        let a: Vec<u32> = cycle.concat().into_iter().filter(|&r| r < 400).collect();
        assert_eq!(a.len(), 400);
        assert!(
            counts(&a).values().all(|&c| c == 1),
            "a cycle repeats no row"
        );
    }
    for rows in &epochs {
        for bucket in 1..=4 {
            let n = rows
                .iter()
                .filter(|&&r| r < 400 && lengths[r as usize] == bucket)
                .count();
            assert!((24..=26).contains(&n), "bucket {bucket}: {n} of 25");
        }
        let b = counts(
            &rows
                .iter()
                .copied()
                .filter(|&r| r >= 400)
                .collect::<Vec<_>>(),
        );
        assert!(b.values().all(|&c| c == 1) && b.len() == 100, "b once each");
    }
    assert_ne!(epochs[0], epochs[4], "another cycle, other offsets");
}

#[test]
fn merging_by_time_spreads_each_source_evenly() {
    let counts = [60usize, 30, 10, 0];
    let sorted: Vec<u64> = (0..100u64).collect();
    let mut out = vec![0u64; 100];
    let mut rng = crate::rng::Pcg64::new(1, 2, crate::rng::Stream::Workload);
    super::spread::merge_by_time(&sorted, &counts, &mut rng, &mut out);
    assert_eq!(sorted, {
        let mut o = out.clone();
        o.sort_unstable();
        o
    });
    let source = |v: u64| usize::from(v >= 60) + usize::from(v >= 90);
    for s in 0..3 {
        let mine: Vec<u64> = out.iter().copied().filter(|&v| source(v) == s).collect();
        let start = [0, 60, 90][s];
        assert!(
            mine.windows(2).all(|w| w[0] < w[1]),
            "each source keeps its order"
        );
        assert_eq!(mine.first(), Some(&start));
        for prefix in 1..=100 {
            let seen = out[..prefix].iter().filter(|&&v| source(v) == s).count() as f64;
            let due = prefix as f64 * counts[s] as f64 / 100.0;
            assert!(
                (seen - due).abs() <= 1.0,
                "source {s} at {prefix}: {seen} vs {due}"
            );
        }
    }
}

#[test]
fn choosing_moves_batches_among_neighbours_only_and_evens_the_sources_out() {
    // 128 batches of one mean length (ranked by place), two rows each of one source: ids below 64
    // are source 0's. Each block of BLOCK places holds 16 of each source, source 0's first: in
    // that order every stretch of 16 is one source; chosen, every stretch holds both.
    let labels = Labels {
        bounds: vec![0, 64, 128],
        tokens: false,
    };
    let mut parts = labels.parts(128);
    for b in 0..128u32 {
        parts.add_batch(b as usize, [(b, 1), (b, 1)].into_iter());
    }
    let mean = vec![5u32; 128];
    let block = u32::try_from(BLOCK_USIZE).unwrap();
    let mut sequence: Vec<u32> = (0..128u32)
        .map(|p| {
            let (k, i) = (p / block, p % block);
            if i < 16 {
                k * 16 + i
            } else {
                64 + k * 16 + i - 16
            }
        })
        .collect();
    let before = sequence.clone();
    parts.choose(&mut sequence, &mean);
    let mut kept = sequence.clone();
    kept.sort_unstable();
    assert_eq!(kept, (0..128).collect::<Vec<_>>(), "the same batches");
    let mut deficit = 0i64;
    for &id in &sequence {
        deficit += if id < 64 { 1 } else { -1 };
        assert!(deficit.abs() <= 1, "{sequence:?}");
    }
    // A batch only moves inside its block of BLOCK neighbouring ranks.
    for (place, &id) in sequence.iter().enumerate() {
        let from = before.iter().position(|&b| b == id).unwrap();
        assert_eq!(place / BLOCK_USIZE, from / BLOCK_USIZE);
    }
}

const BLOCK_USIZE: usize = super::choose::BLOCK;

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

use super::*;
use crate::plan::mixture::quotas::largest_remainder;
use crate::plan::mixture::testing::{config, counts, mixture};
use crate::plan::mixture::{Mix, Mixture, Unit};
use crate::plan::planner::Planner;
use proptest::prelude::*;
use std::collections::HashMap;

fn schedule(points: &[(u64, &[f64])], interpolation: Interpolation) -> Schedule {
    Schedule {
        points: points
            .iter()
            .map(|&(epoch, w)| Point {
                epoch,
                weights: w.to_vec(),
            })
            .collect(),
        interpolation,
    }
}

fn scheduled(m: Mixture, s: Schedule) -> Mixture {
    Mixture {
        schedule: Some(s),
        ..m
    }
}

#[test]
fn weights_hold_or_move_in_a_line_between_points() {
    let points: &[(u64, &[f64])] = &[(2, &[0.5, 0.5]), (6, &[0.1, 0.9])];
    let first = [0.9, 0.1];
    let constant = schedule(points, Interpolation::Constant);
    let at = |s: &Schedule, e| s.weights_at(&first, e);
    assert_eq!(at(&constant, 0), [0.9, 0.1]);
    assert_eq!(at(&constant, 1), [0.9, 0.1]);
    assert_eq!(at(&constant, 2), [0.5, 0.5]);
    assert_eq!(at(&constant, 5), [0.5, 0.5]);
    assert_eq!(at(&constant, 6), [0.1, 0.9]);
    assert_eq!(at(&constant, 1000), [0.1, 0.9]);
    let linear = schedule(points, Interpolation::Linear);
    let close = |a: Vec<f64>, b: [f64; 2]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
    assert!(close(at(&linear, 1), [0.7, 0.3]));
    assert!(close(at(&linear, 2), [0.5, 0.5]));
    assert!(close(at(&linear, 3), [0.4, 0.6]));
    assert!(close(at(&linear, 6), [0.1, 0.9]));
    assert!(close(at(&linear, 9), [0.1, 0.9]));
}

#[test]
fn each_bad_schedule_names_the_point() {
    let m = mixture(&[("a", 4, 0.5), ("b", 4, 0.5)], Unit::Samples);
    let refused = |points: &[(u64, &[f64])]| {
        let m = scheduled(m.clone(), schedule(points, Interpolation::Linear));
        let error = m.validate(8).expect_err("refused");
        assert!(
            matches!(
                error.kind(),
                crate::error::ErrorKind::MixtureSetting {
                    setting: "schedule",
                    ..
                }
            ),
            "{error}"
        );
        error.to_string()
    };
    assert!(refused(&[(0, &[0.5, 0.5])]).contains("epoch 0"));
    assert!(refused(&[(3, &[0.5, 0.5]), (3, &[0.5, 0.5])]).contains("epoch 3"));
    assert!(refused(&[(4, &[0.5, 0.5]), (2, &[0.5, 0.5])]).contains("increasing"));
    assert!(refused(&[(MAX_SCHEDULE_EPOCH + 1, &[0.5, 0.5])]).contains("past the last"));
    assert!(refused(&[(2, &[1.0])]).contains("1 weights for 2 sources"));
    assert!(refused(&[(2, &[-0.5, 1.5])]).contains("source 'a' has weight -0.5 at epoch 2"));
    assert!(refused(&[(2, &[f64::NAN, 1.0])]).contains("source 'a'"));
    assert!(refused(&[(2, &[0.5, 0.4])]).contains("sum to"));
    let many: Vec<(u64, &[f64])> = (1..=65).map(|e| (e, &[0.5, 0.5][..])).collect();
    assert!(refused(&many).contains("65 points"));
    let fine = scheduled(m, schedule(&[(2, &[0.2, 0.8])], Interpolation::Linear));
    assert!(fine.validate(8).is_ok());
}

#[test]
fn a_point_too_heavy_for_a_source_is_refused_naming_its_epoch() {
    // b holds 2 of 12 rows: 0.5 of 12 is 3 copies (fine), 0.9 is 5.4 (past the cap of 4).
    let m = mixture(&[("a", 10, 0.5), ("b", 2, 0.5)], Unit::Samples);
    let lengths = vec![5u32; 12];
    let heavy = scheduled(
        m,
        schedule(&[(2, &[0.5, 0.5]), (6, &[0.1, 0.9])], Interpolation::Linear),
    );
    let error = Mix::new(heavy, &lengths, |_| true, 0, None).unwrap_err();
    // Linear: 0.5 + 0.4·(e − 2)/4 is 0.7 at epoch 4 (8 of 12: 4 copies), 0.8 at epoch 5 (10: 5).
    assert!(
        error.to_string().contains("weight 0.8 at epoch 5"),
        "{error}"
    );
}

#[test]
fn a_schedule_and_its_fingerprint_show_in_the_plan_key() {
    let lengths: Vec<u32> = (0..60).map(|i| 4 + i % 13).collect();
    let m = mixture(&[("a", 40, 0.5), ("b", 20, 0.5)], Unit::Samples);
    let fixed = Planner::with_mixture(lengths.clone(), config(2, 1), m.clone()).unwrap();
    let points: &[(u64, &[f64])] = &[(2, &[0.8, 0.2])];
    let plan = |i| {
        let s = schedule(points, i);
        Planner::with_mixture(lengths.clone(), config(2, 1), scheduled(m.clone(), s)).unwrap()
    };
    let (constant, linear) = (plan(Interpolation::Constant), plan(Interpolation::Linear));
    let prints = [
        fixed.fingerprint(),
        constant.fingerprint(),
        linear.fingerprint(),
    ];
    assert!(prints[0] != prints[1] && prints[1] != prints[2] && prints[0] != prints[2]);
    // Epoch 0 is the sources' own weights under every schedule.
    let rows = |p: &Planner, e| p.plan(e).unwrap().indices().to_vec();
    assert_eq!(rows(&fixed, 0), rows(&constant, 0));
    assert_eq!(rows(&fixed, 0), rows(&linear, 0));
    assert_ne!(rows(&fixed, 2), rows(&constant, 2));
}

/// A mixture of `sizes` rows (samples) with random weights at epoch 0 and at each point.
fn random_mixture(sizes: &[u32], raw: &[f64]) -> Vec<f64> {
    let weights: Vec<f64> = raw[..sizes.len()].iter().map(|w| w + 0.01).collect();
    let sum: f64 = weights.iter().sum();
    weights.iter().map(|w| w / sum).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Under any schedule, in samples: every epoch's shares are exact for its weights; the rows a
    /// source takes beyond its whole copies appear once within a cycle, however the weights change;
    /// a cycle is left only when the next slice does not fit what is left of it.
    #[test]
    fn every_epoch_holds_its_shares_and_no_cycle_repeats_a_row(
        sizes in prop::collection::vec(1u32..30, 1..4),
        raw in prop::collection::vec(prop::collection::vec(0.0f64..1.0, 4), 1..4),
        gaps in prop::collection::vec(1u64..4, 3),
        linear in any::<bool>(),
        size in prop::option::of(1u64..60),
        seed in 0u64..1000,
    ) {
        let first = random_mixture(&sizes, &raw[0]);
        let mut epoch = 0;
        let points: Vec<Point> = raw[1..].iter().zip(&gaps).map(|(r, g)| {
            epoch += g;
            Point { epoch, weights: random_mixture(&sizes, r) }
        }).collect();
        let interpolation = if linear { Interpolation::Linear } else { Interpolation::Constant };
        let sources: Vec<(String, u32, f64)> = sizes.iter().zip(&first).enumerate()
            .map(|(i, (&rows, &w))| (format!("s{i}"), rows, w)).collect();
        let m = Mixture {
            max_repeat: 1000.0,
            epoch_size: size,
            schedule: Some(Schedule { points, interpolation }),
            ..Mixture::new(sources, Unit::Samples)
        };
        let rows: u32 = sizes.iter().sum();
        let lengths = vec![3u32; rows as usize];
        let mix = Mix::new(m.clone(), &lengths, |_| true, seed, None).unwrap();
        // (source, cycle) → rows its slices took, and the slices' sizes in order.
        let mut cycles: HashMap<(usize, u64), (Vec<u32>, u64)> = HashMap::new();
        let epochs = epoch + 4;
        for e in 0..epochs {
            let weights = m.weights_at(e);
            let shares = largest_remainder(size.unwrap_or(u64::from(rows)), &weights);
            let count = counts(&mix.population(e));
            for (s, slice) in mix.slices(e).into_iter().enumerate() {
                let (lo, hi) = (mix.bounds[s], mix.bounds[s + 1]);
                let mine: u64 = (lo..hi).map(|r| u64::from(count.get(&r).copied().unwrap_or(0))).sum();
                prop_assert_eq!(mine, shares[s], "epoch {} source {}", e, s);
                let taken: Vec<u32> = (lo..hi)
                    .filter(|r| u64::from(count.get(r).copied().unwrap_or(0)) > slice.copies)
                    .collect();
                prop_assert_eq!(taken.len() as u64, slice.rest);
                if slice.rest > 0 {
                    let left = slice.cycle.checked_sub(1).and_then(|c| cycles.get(&(s, c)));
                    if let (Some((_, end)), false) = (left, cycles.contains_key(&(s, slice.cycle))) {
                        prop_assert_eq!(slice.from, 0);
                        prop_assert!(end + slice.rest > u64::from(sizes[s]), "a cycle left early");
                    }
                    let entry = cycles.entry((s, slice.cycle)).or_default();
                    prop_assert!(entry.0.is_empty() || entry.1 == slice.from, "slices follow each other");
                    entry.0.extend(&taken);
                    entry.1 = slice.from + slice.rest;
                }
            }
        }
        for ((s, c), (taken, _)) in &cycles {
            prop_assert!(counts(taken).values().all(|&k| k == 1), "source {} cycle {} repeats a row", s, c);
        }
    }

    /// A schedule whose points repeat epoch 0's weights selects what fixed weights select, in
    /// samples and in tokens: the walk's closed form is the rule of every planner before schedules.
    #[test]
    fn a_schedule_of_the_same_weights_selects_as_fixed_weights(
        sizes in prop::collection::vec(1u32..40, 1..4),
        raw in prop::collection::vec(0.0f64..1.0, 4),
        tokens in any::<bool>(),
        size in prop::option::of(1u64..300),
        key in 0u64..600,
    ) {
        let weights = random_mixture(&sizes, &raw);
        let sources: Vec<(String, u32, f64)> = sizes.iter().zip(&weights).enumerate()
            .map(|(i, (&rows, &w))| (format!("s{i}"), rows, w)).collect();
        let unit = if tokens { Unit::Tokens } else { Unit::Samples };
        let fixed = Mixture { max_repeat: 1000.0, epoch_size: size, ..Mixture::new(sources, unit) };
        let points = vec![Point { epoch: 3, weights: weights.clone() }, Point { epoch: 300, weights }];
        let same = Mixture {
            schedule: Some(Schedule { points, interpolation: Interpolation::Linear }),
            ..fixed.clone()
        };
        let rows: u32 = sizes.iter().sum();
        let lengths: Vec<u32> = (0..rows).map(|r| 1 + r * 7919 % 50).collect();
        let a = Mix::new(fixed, &lengths, |_| true, 9, None).unwrap();
        let b = Mix::new(same, &lengths, |_| true, 9, None).unwrap();
        prop_assert_eq!(a.slices(key), b.slices(key));
        prop_assert_eq!(a.population(key), b.population(key));
    }
}

#[test]
fn a_scheduled_plan_is_the_same_for_any_thread_count_and_keeps_its_steps() {
    let lengths: Vec<u32> = (0..3000).map(|i| 8 + (i * 7919) % 200).collect();
    let m = Mixture {
        epoch_size: Some(1500),
        ..mixture(
            &[
                ("short", 1000, 0.6),
                ("mid", 1000, 0.3),
                ("long", 1000, 0.1),
            ],
            Unit::Samples,
        )
    };
    let s = schedule(
        &[(2, &[0.2, 0.3, 0.5]), (5, &[0.1, 0.1, 0.8])],
        Interpolation::Linear,
    );
    let m = scheduled(m, s);
    let config = crate::plan::config::Config {
        seed: 4,
        world_size: 4,
        ..crate::plan::config::Config::new(crate::plan::config::Batching::Tokens(1024))
    };
    let one = Planner::with_mixture(lengths.clone(), config.clone(), m.clone())
        .unwrap()
        .with_threads(1);
    let two = Planner::with_mixture(lengths, config, m)
        .unwrap()
        .with_threads(2);
    let steps = one.steps();
    for e in 0..8 {
        let (a, b) = (one.plan(e).unwrap(), two.plan(e).unwrap());
        assert_eq!(a.indices(), b.indices(), "epoch {e}");
        assert_eq!(a.offsets(), b.offsets(), "epoch {e}");
        assert_eq!(
            a.len() as u64,
            steps * 4,
            "epoch {e} keeps the shared step count"
        );
    }
}

/// Past the first kept place of the walk (every 256 epochs) and past the last point, every epoch's
/// slices are those of the rule taken one epoch at a time from epoch 0 (a long linear schedule: the
/// rests change every epoch).
#[test]
fn slices_far_into_a_long_schedule_follow_the_rule_from_epoch_zero() {
    let m = Mixture {
        schedule: Some(schedule(
            &[(700, &[0.3, 0.3, 0.4]), (1100, &[0.1, 0.6, 0.3])],
            Interpolation::Linear,
        )),
        max_repeat: 10.0,
        ..mixture(
            &[("a", 997, 0.05), ("b", 1500, 0.55), ("c", 503, 0.4)],
            Unit::Samples,
        )
    };
    let mix = Mix::new(m.clone(), &[2u32; 3000], |_| true, 1, None).unwrap();
    let rows = [997u64, 1500, 503];
    // (cycle, position) of each source where its last slice ended.
    let mut place = [(0u64, 0u64); 3];
    for epoch in 0..1400u64 {
        let shares = largest_remainder(3000, &m.weights_at(epoch));
        let slices = mix.slices(epoch);
        for s in 0..3 {
            let (copies, rest) = (shares[s] / rows[s], shares[s] % rows[s]);
            let (mut cycle, mut at) = place[s];
            if rest > 0 && at + rest > rows[s] {
                (cycle, at) = (cycle + 1, 0);
            }
            let slice = slices[s];
            assert_eq!((slice.copies, slice.rest), (copies, rest), "epoch {epoch}");
            if rest > 0 {
                assert_eq!(
                    (slice.cycle, slice.from),
                    (cycle, at),
                    "epoch {epoch} source {s}"
                );
                place[s] = (cycle, at + rest);
            }
        }
    }
}

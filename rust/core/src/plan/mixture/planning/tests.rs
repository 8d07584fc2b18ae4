use crate::plan::config::{Config, Mode};
use crate::plan::mixture::testing::{config, counts, mixture};
use crate::plan::mixture::*;
use crate::plan::planner::Planner;

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
    crate::plan::mixture::spread::merge_by_time(&sorted, &counts, &mut rng, &mut out);
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

const BLOCK_USIZE: usize = crate::plan::form::choose::BLOCK;

use super::*;

#[test]
fn is_a_permutation_for_many_sizes() {
    for n in [0, 1, 2, 17, TARGET_CHUNK * 3 + 5, 100_000] {
        let mut p = random_permutation(n, 1, 2, None);
        p.sort_unstable();
        assert!(
            p.iter().enumerate().all(|(i, &v)| v as usize == i),
            "n = {n}"
        );
    }
}

#[test]
fn same_for_any_thread_count() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    let n = TARGET_CHUNK * 5 + 3;
    assert_eq!(
        random_permutation(n, 9, 1, None),
        random_permutation(n, 9, 1, Some(&pool))
    );
    assert_ne!(
        random_permutation(n, 9, 1, None),
        random_permutation(n, 9, 2, None)
    );
}

const TRIALS: u32 = 400;

/// Every watched element lands in each eighth of the output about equally often: chi-square with
/// 7 degrees of freedom below its 99.9% quantile (24.32), for a size that uses several chunks.
#[test]
fn positions_are_uniform() {
    let n = 4 * TARGET_CHUNK;
    let watched = [0usize, n / 2, n - 1];
    // counts[w][bin]: where watched element w landed, in 8 position bins.
    let mut counts = [[0u32; 8]; 3];
    for epoch in 0..u64::from(TRIALS) {
        let p = random_permutation(n, 5, epoch, None);
        for (pos, &v) in p.iter().enumerate() {
            if let Some(w) = watched.iter().position(|&x| x == v as usize) {
                counts[w][pos * 8 / n] += 1;
            }
        }
    }
    let expected = f64::from(TRIALS) / 8.0;
    for row in counts {
        let chi2: f64 = row
            .iter()
            .map(|&c| (f64::from(c) - expected).powi(2) / expected)
            .sum();
        assert!(chi2 < 24.32, "chi2 {chi2:.1} for {row:?}");
    }
}

#[test]
fn chunk_bits_follow_size() {
    assert_eq!(chunk_bits(10), 0);
    assert_eq!(chunk_bits(902_087), 6);
    assert_eq!(chunk_bits(usize::MAX / 2), 8);
}

#[test]
fn segments_cover_and_depend_on_size_only() {
    assert_eq!(segments(10).first(), Some(&(0..10)));
    let s = segments(902_087);
    assert_eq!(s.len(), 13);
    assert_eq!((s[0].start, s[12].end), (0, 902_087));
    assert!(s.windows(2).all(|w| w[0].end == w[1].start));
    assert_eq!(segments(1 << 30).len(), MAX_SEGMENTS);
}

#[test]
fn runs_scatter_as_their_listed_rows_do() {
    // Pairs of 100,000 rows; runs that repeat some, skip some, and hold ~300K elements, so the
    // scatter's segments (2^16 elements each) start inside runs.
    let lengths: Vec<u32> = (0..100_000u32).map(|r| 1 + (r * 7919) % 300).collect();
    let pairs: Vec<u64> = (0..100_000u32)
        .map(|r| u64::from(r) << 32 | u64::from(lengths[r as usize]))
        .collect();
    let runs = [
        (0, 61_200),
        (1_000, 100_000),
        (99_990, 100_000),
        (0, 100_000),
        (33_333, 33_334),
        (5, 40_005),
    ];
    let listed: Vec<u32> = runs
        .iter()
        .flat_map(|&(a, b)| u32::try_from(a).unwrap()..u32::try_from(b).unwrap())
        .collect();
    assert!(segments(listed.len()).len() > 2);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for (seed, epoch) in [(1, 0), (9, 4)] {
        let runs = Runs {
            pairs: &pairs,
            runs: &runs,
        };
        let by_runs: Scattered<u32> = scatter_runs(runs, seed, epoch, Some(&pool));
        let by_rows = scatter_into_chunks(
            listed.len(),
            Some(&listed),
            Some(&lengths[..]),
            seed,
            epoch,
            None,
        );
        assert_eq!(by_runs.rows, by_rows.rows);
        assert_eq!(by_runs.companion, by_rows.companion);
        assert_eq!(by_runs.starts, by_rows.starts);
    }
}

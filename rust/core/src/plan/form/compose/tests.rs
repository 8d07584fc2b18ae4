use super::*;
use crate::plan::config::Batching;

/// `max_docs_per_row` unset.
const NO_CAP: u32 = u32::MAX;

fn rows(capacity: u32) -> Rows {
    Rows {
        capacity,
        room: Vec::new(),
        attention: Vec::new(),
        samples: Vec::new(),
        longest: Vec::new(),
    }
}

/// 28 tokens open 3 rows of 10: the 8s take one row each, the 4s the empty one, and the 2s go
/// to the least attention with room (the 4s' row, then the row opened last of the 8s').
#[test]
fn each_length_goes_to_the_least_attention_with_room() {
    let sorted = [8, 8, 4, 4, 2, 2];
    let mut built = rows(10);
    let row_of = place_all(&sorted, &mut built, (28, 2, NO_CAP));
    assert_eq!(row_of, [2, 1, 0, 0, 0, 1]);
    assert_eq!(built.room, [0, 0, 2]);
    assert_eq!(built.attention, [36, 68, 64]);
    assert_eq!(built.longest, [4, 8, 8]);
}

/// A length that fills the tightest room it fits to within the slack (4 tokens in rows of 1,024)
/// goes there before the least attention: the 502 closes row 1 (room 504) although row 0 is empty;
/// the 420 would leave row 2 exactly 4 (not below the slack) and goes to the least attention.
#[test]
fn a_closing_fit_comes_before_the_least_attention() {
    assert_eq!(close_slack(0, 1024), 4);
    let sorted = [600, 520, 502, 420, 98];
    let mut built = rows(1024);
    let row_of = place_all(&sorted, &mut built, (2140, 98, NO_CAP));
    assert_eq!(row_of, [2, 1, 1, 0, 0]);
    assert_eq!(built.room, [506, 2, 424]);
    assert_eq!(built.attention, [186_004, 522_404, 360_000]);
}

/// The slack: four room classes, at least 16 tokens, at most 1/256 of a row, so rows under 256
/// tokens have none (and are composed by attention alone).
#[test]
fn the_slack_scales_with_the_room_classes_and_the_row() {
    // Room classes: the least shift that puts `capacity >> shift` below 4,096 (`place_all`).
    assert_eq!(close_slack(3, 16_384), 32);
    assert_eq!(close_slack(4, 32_768), 64);
    assert_eq!(close_slack(2, 8_192), 16);
    assert_eq!(close_slack(0, 2_048), 8);
    assert_eq!(close_slack(0, 255), 0);
    assert_eq!(close_slack(9, 1 << 20), 2048);
}

/// A row with `max_docs_per_row` samples takes no more, whatever its room: six samples of 3 tokens
/// need one row of 100 but open three at a cap of 2, and the 4s of the first case no longer share a
/// row with a 2.
#[test]
fn a_row_at_the_cap_takes_no_more_samples() {
    let sorted = [3, 3, 3, 3, 3, 3];
    let mut built = rows(100);
    place_all(&sorted, &mut built, (18, 3, 2));
    assert_eq!(built.samples, [2, 2, 2]);
    let sorted = [8, 8, 4, 4, 2, 2];
    let mut built = rows(10);
    let row_of = place_all(&sorted, &mut built, (28, 2, 2));
    assert_eq!(built.samples, [2, 2, 2]);
    assert_eq!(row_of[2], row_of[3]);
    assert_eq!(built.room, [2, 0, 0]);
}

/// When no row has room a new one opens; a row too full for one length takes a shorter one later.
#[test]
fn rows_open_when_none_has_room_and_wait_until_lengths_fit() {
    // 6 + 6 + 5 + 3 = 20 tokens: 2 rows of 10; the 5 fits neither (rooms 4 and 4) and opens a
    // third; the 3 then goes to the least attention with room: the new row (25).
    let sorted = [6, 6, 5, 3];
    let mut built = rows(10);
    let row_of = place_all(&sorted, &mut built, (20, 3, NO_CAP));
    assert_eq!(row_of, [1, 0, 2, 2]);
    assert_eq!(built.room, [4, 4, 2]);
    // The 3s fill row 0 to room 1 with less attention (27) than row 1's 6 (36): the last 3 passes
    // row 0 by, which waits by room and takes the 1 once lengths fall to its room.
    let sorted = [6, 3, 3, 3, 3, 1];
    let mut built = rows(10);
    let row_of = place_all(&sorted, &mut built, (19, 1, NO_CAP));
    assert_eq!(row_of, [1, 0, 0, 0, 1, 0]);
    assert_eq!((built.room, built.attention), (vec![0, 1], vec![28, 45]));
}

/// Strata: every whole window takes one row of each stratum of the ranking by key.
#[test]
fn every_window_takes_one_row_of_each_stratum() {
    let key: Vec<u32> = (0..23).map(|k| (k * 7) % 23).collect();
    let mut rng = Pcg64::new(3, 1, Stream::Order(0));
    let sequence = strata(&key, 4, &mut rng);
    let mut all = sequence.clone();
    all.sort_unstable();
    assert_eq!(all, (0..23).collect::<Vec<u32>>());
    let ranked = rank_by_key(&key);
    let stratum = |row: u32| {
        let rank = ranked.iter().position(|&r| r == row).unwrap();
        (0..4).find(|&s| rank < (s + 1) * 23 / 4).unwrap()
    };
    for window in sequence[..20].chunks(4) {
        let mut seen: Vec<usize> = window.iter().map(|&r| stratum(r)).collect();
        seen.sort_unstable();
        assert_eq!(seen, [0, 1, 2, 3]);
    }
    // 23 = 5 × 4 + 3: the three strata of 6 rows give one extra each, after the windows.
    let mut extra: Vec<usize> = sequence[20..].iter().map(|&r| stratum(r)).collect();
    extra.sort_unstable();
    assert_eq!(extra, [1, 2, 3]);
}

/// Samples over the capacity are left out; the rows written hold every other sample once, in
/// the order of the sequence, each recorded with its capacity and its cost.
#[test]
fn compose_writes_every_admitted_sample_once() {
    let lengths: Vec<u32> = vec![9, 30, 2, 7, 5, 5, 1, 8, 3, 6];
    let mut piece: Vec<u32> = (0..10).collect();
    let config = Config {
        cost: crate::plan::config::CostModel {
            linear: 1.0,
            quadratic: 0.5,
        },
        ..Config::new(Batching::Tokens(12))
    };
    let mut formed = Formed::new(true);
    compose::<u32>(
        &mut piece,
        None,
        &lengths,
        (&config, 12),
        (0, 0),
        &mut formed,
    );
    let rows: Vec<&[u32]> = formed
        .offsets
        .windows(2)
        .map(|w| &piece[w[0] as usize..w[1] as usize])
        .collect();
    let mut seen: Vec<u32> = rows.concat();
    seen.sort_unstable();
    assert_eq!(seen, [0, 2, 3, 4, 5, 6, 7, 8, 9]);
    for (row, &cost) in rows.iter().zip(&formed.cost) {
        let used: u32 = row.iter().map(|&s| lengths[s as usize]).sum();
        let squares: u32 = row.iter().map(|&s| lengths[s as usize].pow(2)).sum();
        assert!(used <= 12);
        assert!((f64::from(cost) - (12.0 + 0.5 * f64::from(squares))).abs() < 1e-3);
    }
}

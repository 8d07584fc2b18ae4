//! Packed collation: an exact small case, a naive oracle on random batches, and every error.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    missing_docs
)]

mod common;

use common::{batch, tokens_column, write_ipc};
use dflash_batch_core::collate::packed::{
    collate_packed, collate_packed_windows, Packed, PackedBuffers, Windows,
};
use dflash_batch_core::collate::Padding;
use dflash_batch_core::{ErrorKind, TokenStore};
use proptest::prelude::*;

fn store_of(rows: &[Vec<i32>]) -> TokenStore {
    let path = write_ipc(&[batch(vec![("ids", tokens_column(rows))])], false);
    TokenStore::open(&[&path], "ids", None, |_| {}).unwrap()
}

/// Collates `indices` into fresh buffers of `capacity`: (input_ids, labels, positions, seq_idx,
/// cu_seqlens, result).
#[allow(clippy::type_complexity)]
fn packed(
    store: &TokenStore,
    indices: &[i64],
    capacity: usize,
) -> dflash_batch_core::Result<(Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>, Vec<i32>, Packed)> {
    packed_windows(store, indices, None, capacity)
}

/// [`packed`] with token windows.
#[allow(clippy::type_complexity)]
fn packed_windows(
    store: &TokenStore,
    indices: &[i64],
    windows: Option<Windows<'_>>,
    capacity: usize,
) -> dflash_batch_core::Result<(Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>, Vec<i32>, Packed)> {
    packed_with(store, indices, windows, capacity, &Padding::default())
}

/// [`packed_windows`] with `padding`.
#[allow(clippy::type_complexity)]
fn packed_with(
    store: &TokenStore,
    indices: &[i64],
    windows: Option<Windows<'_>>,
    capacity: usize,
    padding: &Padding,
) -> dflash_batch_core::Result<(Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>, Vec<i32>, Packed)> {
    let (mut ids, mut labels, mut positions, mut seq) = (
        vec![7; capacity],
        vec![7; capacity],
        vec![7; capacity],
        vec![7; capacity],
    );
    let mut cu = vec![99; indices.len() + 1];
    let out = PackedBuffers {
        input_ids: &mut ids,
        labels: &mut labels,
        position_ids: &mut positions,
        cu_seqlens: &mut cu,
        seq_idx: Some(&mut seq),
    };
    let got = collate_packed_windows(store, indices, windows, capacity, padding, out)?;
    Ok((ids, labels, positions, seq, cu, got))
}

#[test]
fn pieces_padded_to_the_multiple_for_context_parallelism() {
    let store = store_of(&[vec![5, 6, 7], vec![8], vec![9, 10, 11, 12]]);
    let padding = Padding {
        pad_id: -1,
        label_pad_id: -100,
        pad_to_multiple_of: 4,
    };
    let (ids, labels, positions, seq, cu, got) =
        packed_with(&store, &[0, 1, 2], None, 16, &padding).unwrap();
    assert_eq!(
        ids,
        [5, 6, 7, -1, 8, -1, -1, -1, 9, 10, 11, 12, -1, -1, -1, -1]
    );
    let p = -100;
    assert_eq!(labels, [p, 6, 7, p, p, p, p, p, p, 10, 11, 12, p, p, p, p]);
    assert_eq!(positions, [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 0, 0, 0]);
    assert_eq!(seq, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, -1, -1, -1, -1]);
    // Real lengths summed (Megatron's cu_seqlens); the row positions are 0, 4, 8, 12.
    assert_eq!(cu, [0, 3, 4, 8]);
    let expected = Packed {
        samples: 3,
        tokens: 8,
        max_seqlen: 4,
    };
    assert_eq!(got, expected);
    // 3 + 1 + 4 tokens take 12 once padded: a row of 8 no longer holds them.
    let err = packed_with(&store, &[0, 1, 2], None, 8, &padding).unwrap_err();
    assert!(matches!(
        err.kind(),
        ErrorKind::PackedRowTooLong {
            tokens: 12,
            capacity: 8
        }
    ));
}

#[test]
fn exact_small_row() {
    let store = store_of(&[vec![5, 6, 7], vec![8], vec![9, 10]]);
    let (ids, labels, positions, seq, cu, got) = packed(&store, &[2, 0, 1], 8).unwrap();
    assert_eq!(ids, [9, 10, 5, 6, 7, 8, 0, 0]);
    assert_eq!(labels, [-100, 10, -100, 6, 7, -100, -100, -100]);
    assert_eq!(positions, [0, 1, 0, 1, 2, 0, 0, 0]);
    assert_eq!(seq, [0, 0, 1, 1, 1, 2, -1, -1]);
    assert_eq!(cu, [0, 2, 5, 6]);
    assert_eq!(
        got,
        Packed {
            samples: 3,
            tokens: 6,
            max_seqlen: 3
        }
    );
}

/// Pieces of long samples (`oversize="truncate"`): windows of their tokens, each its own sequence.
#[test]
fn windows_take_pieces_of_samples() {
    let store = store_of(&[vec![1, 2, 3, 4, 5, 6, 7], vec![8, 9]]);
    // Tokens 3.. of row 0 (cut at its end: 3 of the 4 asked), all of row 1, tokens 0..2 of row 0.
    let windows = Windows {
        starts: &[4, 0, 0],
        lengths: &[4, 2, 2],
    };
    let (ids, labels, positions, seq, cu, got) =
        packed_windows(&store, &[0, 1, 0], Some(windows), 8).unwrap();
    assert_eq!(ids, [5, 6, 7, 8, 9, 1, 2, 0]);
    assert_eq!(labels, [-100, 6, 7, -100, 9, -100, 2, -100]);
    assert_eq!(positions, [0, 1, 2, 0, 1, 0, 1, 0]);
    assert_eq!(seq, [0, 0, 0, 1, 1, 2, 2, -1]);
    assert_eq!(cu, [0, 3, 5, 7]);
    assert_eq!(
        got,
        Packed {
            samples: 3,
            tokens: 7,
            max_seqlen: 3
        }
    );
}

#[test]
fn windows_must_start_inside_their_sample_and_match_the_indices() {
    let store = store_of(&[vec![1, 2, 3], vec![8, 9]]);
    let run = |starts: &[u32], lengths: &[u32]| {
        packed_windows(&store, &[0, 1], Some(Windows { starts, lengths }), 8)
    };
    let e = run(&[0, 2], &[1, 1]).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::BadWindow { .. })
            && e.to_string()
                .starts_with("entry 1 starts at token 2, past the end of its sample (2 tokens)"),
        "{e}"
    );
    let e = run(&[0], &[1, 1]).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("2 indices but 1 starts and 2 lengths"),
        "{e}"
    );
    assert!(
        run(&[2, 1], &[9, 9]).is_ok(),
        "a window may run past the end: it is cut there"
    );
}

#[test]
fn errors_name_the_buffer_and_the_capacity() {
    let store = store_of(&[vec![1, 2, 3], vec![4, 5]]);
    let err = packed(&store, &[0, 1], 4).unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::PackedRowTooLong {
            tokens: 5,
            capacity: 4
        }
    );
    assert!(err.to_string().contains("capacity 4"), "{err}");
    // Buffers of 8 except `position_ids` and `cu_seqlens` as given: the short one is named.
    let too_small = |positions: usize, cu: usize| {
        let (mut ids, mut labels, mut positions) =
            (vec![0i64; 8], vec![0i64; 8], vec![0i64; positions]);
        let mut cu = vec![0i32; cu];
        let out = PackedBuffers {
            input_ids: &mut ids,
            labels: &mut labels,
            position_ids: &mut positions,
            cu_seqlens: &mut cu,
            seq_idx: None,
        };
        collate_packed(&store, &[0i64, 1], 8, &Padding::default(), out).unwrap_err()
    };
    let err = too_small(3, 3);
    assert!(
        matches!(
            err.kind(),
            ErrorKind::BufferTooSmall {
                name: "position_ids",
                needed: 8,
                got: 3
            }
        ),
        "{err}"
    );
    let err = too_small(8, 2);
    assert!(
        matches!(
            err.kind(),
            ErrorKind::BufferTooSmall {
                name: "cu_seqlens",
                ..
            }
        ),
        "{err}"
    );
    assert!(matches!(
        packed(&store, &[2], 8).unwrap_err().kind(),
        ErrorKind::RowOutOfRange { .. }
    ));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]

    #[test]
    fn matches_the_oracle(
        rows in prop::collection::vec(prop::collection::vec(-50i32..50, 1..20), 1..12),
        pick in prop::collection::vec(0usize..1000, 0..8),
        spare in 0usize..10,
    ) {
        let store = store_of(&rows);
        let mut indices: Vec<i64> = pick.iter().map(|&p| (p % rows.len()) as i64).collect();
        indices.dedup();
        let tokens: usize = indices.iter().map(|&i| rows[i as usize].len()).sum();
        let capacity = tokens + spare;
        let (ids, labels, positions, seq, cu, got) = packed(&store, &indices, capacity).unwrap();
        let mut at = 0;
        for (s, &i) in indices.iter().enumerate() {
            let row = &rows[i as usize];
            prop_assert_eq!(cu[s] as usize, at);
            for (j, &t) in row.iter().enumerate() {
                prop_assert_eq!(ids[at + j], i64::from(t));
                prop_assert_eq!(labels[at + j], if j == 0 { -100 } else { i64::from(t) });
                prop_assert_eq!(positions[at + j], j as i64);
                prop_assert_eq!(seq[at + j], s as i64);
            }
            at += row.len();
        }
        prop_assert_eq!(cu[indices.len()] as usize, tokens);
        prop_assert!(ids[tokens..].iter().all(|&t| t == 0));
        prop_assert!(labels[tokens..].iter().all(|&t| t == -100));
        prop_assert!(seq[tokens..].iter().all(|&t| t == -1));
        prop_assert_eq!(got.tokens, tokens);
        prop_assert_eq!(got.max_seqlen, indices.iter().map(|&i| rows[i as usize].len()).max().unwrap_or(0));
    }
}

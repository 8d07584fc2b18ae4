//! Padded collation against a naive oracle, exact small cases, and every error.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    clippy::cast_possible_truncation,
    missing_docs
)]

mod common;

use std::sync::Arc;

use arrow_array::builder::{ListBuilder, UInt32Builder};
use arrow_array::{ArrayRef, Int64Array};
use common::{batch, tokens_column, write_ipc};
use dflash_batch_core::collate::{
    collate_padded, collate_padded_block, padded_shape, Buffers, Padding,
};
use dflash_batch_core::pool::PrivatePool;
use dflash_batch_core::{ErrorKind, TokenStore};
use proptest::prelude::*;

fn store_of(rows: &[Vec<i32>]) -> TokenStore {
    let path = write_ipc(&[batch(vec![("ids", tokens_column(rows))])], true);
    TokenStore::open(&[&path], "ids", None, |_| {}).unwrap()
}

/// The four arrays of `bufs` as collation buffers.
fn buffers<T>(bufs: &mut [Vec<T>; 4]) -> Buffers<'_, T> {
    let [input_ids, attention_mask, labels, position_ids] = bufs;
    Buffers {
        input_ids,
        attention_mask,
        labels,
        position_ids,
    }
}

/// The four arrays, collated one element at a time the obvious way.
fn oracle(rows: &[&Vec<i32>], padding: &Padding) -> (usize, [Vec<i64>; 4]) {
    let pad = padding.pad_to_multiple_of as usize;
    let width = rows
        .iter()
        .map(|r| r.len())
        .max()
        .unwrap_or(0)
        .div_ceil(pad)
        * pad;
    let mut out: [Vec<i64>; 4] = Default::default();
    for row in rows {
        for j in 0..width {
            let real = j < row.len();
            out[0].push(if real {
                i64::from(row[j])
            } else {
                padding.pad_id
            });
            out[1].push(i64::from(real));
            out[2].push(if real {
                i64::from(row[j])
            } else {
                padding.label_pad_id
            });
            out[3].push(if real { j as i64 } else { 0 });
        }
    }
    (width, out)
}

fn collate_i64(
    store: &TokenStore,
    picks: &[i64],
    padding: &Padding,
    pool: Option<&PrivatePool>,
) -> (usize, usize, [Vec<i64>; 4]) {
    let (rows, width) = padded_shape(store, picks, padding.pad_to_multiple_of).unwrap();
    let mut bufs: [Vec<i64>; 4] = std::array::from_fn(|_| vec![7; rows * width + 3]);
    let out = buffers(&mut bufs);
    assert_eq!(
        collate_padded(store, picks, padding, out, pool).unwrap(),
        (rows, width)
    );
    for buf in &mut bufs {
        assert_eq!(&buf[rows * width..], &[7, 7, 7], "wrote past rows × L");
        buf.truncate(rows * width);
    }
    (rows, width, bufs)
}

/// The block form: the four arrays back to back, nothing written past `4 × rows × L`.
fn collate_block_i64(
    store: &TokenStore,
    picks: &[i64],
    padding: &Padding,
    pool: Option<&PrivatePool>,
) -> (usize, usize, [Vec<i64>; 4]) {
    let (rows, width) = padded_shape(store, picks, padding.pad_to_multiple_of).unwrap();
    let n = rows * width;
    let mut block = vec![7i64; 4 * n + 3];
    assert_eq!(
        collate_padded_block(store, picks, padding, &mut block, pool).unwrap(),
        (rows, width)
    );
    assert_eq!(&block[4 * n..], &[7, 7, 7], "wrote past 4 × rows × L");
    let arrays = std::array::from_fn(|k| block[k * n..(k + 1) * n].to_vec());
    (rows, width, arrays)
}

#[test]
fn exact_small_batch_in_one_block() {
    let store = store_of(&[vec![5, 6, 7], vec![8]]);
    let padding = Padding {
        pad_id: 0,
        label_pad_id: -100,
        pad_to_multiple_of: 4,
    };
    let mut block = vec![9i32; 33];
    let shape = collate_padded_block(&store, &[1i64, 0], &padding, &mut block, None).unwrap();
    assert_eq!(shape, (2, 4));
    #[rustfmt::skip]
    let expected = [
        8, 0, 0, 0, 5, 6, 7, 0, // input_ids
        1, 0, 0, 0, 1, 1, 1, 0, // attention_mask
        8, -100, -100, -100, 5, 6, 7, -100, // labels
        0, 0, 0, 0, 0, 1, 2, 0, // position_ids
        9, // untouched
    ];
    assert_eq!(block, expected);
}

#[test]
fn a_block_too_small_names_the_slot_and_its_need() {
    let store = store_of(&[vec![1, 2, 3]]);
    let mut block = vec![0i64; 11];
    let err =
        collate_padded_block(&store, &[0i64], &Padding::default(), &mut block, None).unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::BufferTooSmall {
            name: "slot",
            needed: 12,
            got: 11
        }
    );
    assert_eq!(
        block,
        vec![0; 11],
        "nothing is written when the block is too small"
    );
    let (rows, width, _) = collate_block_i64(&store, &[], &Padding::default(), None);
    assert_eq!((rows, width), (0, 0));
}

#[test]
fn exact_small_batch() {
    let store = store_of(&[vec![5, 6, 7], vec![8]]);
    let padding = Padding {
        pad_id: 0,
        label_pad_id: -100,
        pad_to_multiple_of: 4,
    };
    let (rows, width, [ids, mask, labels, positions]) =
        collate_i64(&store, &[1, 0], &padding, None);
    assert_eq!((rows, width), (2, 4));
    assert_eq!(ids, [8, 0, 0, 0, 5, 6, 7, 0]);
    assert_eq!(mask, [1, 0, 0, 0, 1, 1, 1, 0]);
    assert_eq!(labels, [8, -100, -100, -100, 5, 6, 7, -100]);
    assert_eq!(positions, [0, 0, 0, 0, 0, 1, 2, 0]);
}

#[test]
fn int32_output_and_uint32_tokens() {
    let mut b = ListBuilder::new(UInt32Builder::new());
    b.values().append_slice(&[1, u32::MAX]);
    b.append(true);
    b.values().append_slice(&[2]);
    b.append(true);
    let column: ArrayRef = Arc::new(b.finish());
    let path = write_ipc(&[batch(vec![("ids", column)])], false);
    let store = TokenStore::open(&[&path], "ids", None, |_| {}).unwrap();
    let mut bufs: [Vec<i32>; 4] = std::array::from_fn(|_| vec![0; 4]);
    let out = buffers(&mut bufs);
    assert_eq!(
        collate_padded(&store, &[1u32], &Padding::default(), out, None).unwrap(),
        (1, 1)
    );
    assert_eq!(bufs[0][0], 2);
    let out = buffers(&mut bufs);
    let err = collate_padded(&store, &[0u32], &Padding::default(), out, None).unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::TokenOutOfRange {
            value: i64::from(u32::MAX),
            dtype: "int32"
        }
    );
    let mut wide: [Vec<i64>; 4] = std::array::from_fn(|_| vec![0; 2]);
    let out = buffers(&mut wide);
    collate_padded(&store, &[0u32], &Padding::default(), out, None).unwrap();
    assert_eq!(wide[0], [1, i64::from(u32::MAX)]);
}

#[test]
fn errors_name_the_buffer_and_setting() {
    let store = store_of(&[vec![1, 2, 3]]);
    let mut bufs: [Vec<i64>; 4] = [vec![0; 3], vec![0; 3], vec![0; 2], vec![0; 3]];
    let out = buffers(&mut bufs);
    let err = collate_padded(&store, &[0i64], &Padding::default(), out, None).unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::BufferTooSmall {
            name: "labels",
            needed: 3,
            got: 2
        }
    );
    let mut small: [Vec<i32>; 4] = std::array::from_fn(|_| vec![0; 3]);
    let out = buffers(&mut small);
    let padding = Padding {
        pad_id: i64::from(i32::MAX) + 1,
        ..Padding::default()
    };
    let err = collate_padded(&store, &[0i64], &padding, out, None).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::InvalidSetting { name: "pad_id", .. }),
        "{err}"
    );
    let err = padded_shape(&store, &[0i64], 0).unwrap_err();
    assert!(matches!(
        err.kind(),
        ErrorKind::InvalidSetting {
            name: "pad_to_multiple_of",
            ..
        }
    ));
    let err = padded_shape(&store, &[1i64], 1).unwrap_err();
    assert!(matches!(
        err.kind(),
        ErrorKind::RowOutOfRange { row: 1, rows: 1 }
    ));
}

#[test]
fn lengths_column_is_not_needed_and_empty_batches_are_empty() {
    let path = write_ipc(
        &[batch(vec![
            ("n", Arc::new(Int64Array::from(vec![1])) as ArrayRef),
            ("ids", tokens_column(&[vec![4]])),
        ])],
        true,
    );
    let store = TokenStore::open(&[&path], "ids", None, |_| {}).unwrap();
    let (rows, width, _) = collate_i64(&store, &[], &Padding::default(), None);
    assert_eq!((rows, width), (0, 0));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn matches_the_oracle_with_and_without_threads(
        rows in prop::collection::vec(prop::collection::vec(-5i32..50_000, 0..40), 1..60),
        picks in prop::collection::vec(any::<usize>(), 0..80),
        pad in 1u32..9,
        pad_id in -3i64..3,
    ) {
        let store = store_of(&rows);
        let picks: Vec<i64> = picks.iter().map(|p| (p % rows.len()) as i64).collect();
        let padding = Padding { pad_id, label_pad_id: -100, pad_to_multiple_of: pad };
        let chosen: Vec<&Vec<i32>> = picks.iter().map(|&p| &rows[p as usize]).collect();
        let (width, expected) = oracle(&chosen, &padding);
        let (n, w, got) = collate_i64(&store, &picks, &padding, None);
        prop_assert_eq!((n, w), (picks.len(), width));
        prop_assert_eq!(&got, &expected);
        let pool = PrivatePool::new(3);
        let (_, _, threaded) = collate_i64(&store, &picks, &padding, Some(&pool));
        prop_assert_eq!(&threaded, &expected);
        let (_, _, block) = collate_block_i64(&store, &picks, &padding, None);
        prop_assert_eq!(&block, &expected);
    }
}

#[test]
fn large_batches_split_over_the_pool_match_the_oracle() {
    let rows: Vec<Vec<i32>> = (0..300)
        .map(|r| (0..(r * 7 % 900 + 1)).map(|t| r * 1000 + t).collect())
        .collect();
    let store = store_of(&rows);
    let picks: Vec<i64> = (0..300).rev().collect();
    let padding = Padding {
        pad_id: 3,
        label_pad_id: -100,
        pad_to_multiple_of: 8,
    };
    let chosen: Vec<&Vec<i32>> = picks.iter().map(|&p| &rows[p as usize]).collect();
    let (width, expected) = oracle(&chosen, &padding);
    assert!(
        picks.len() * width >= 1 << 15,
        "the batch must be large enough to be split"
    );
    let pool = PrivatePool::new(4);
    let (_, w, got) = collate_i64(&store, &picks, &padding, Some(&pool));
    assert_eq!(w, width);
    assert_eq!(got, expected);
    let (_, _, block) = collate_block_i64(&store, &picks, &padding, Some(&pool));
    assert_eq!(block, expected);
}

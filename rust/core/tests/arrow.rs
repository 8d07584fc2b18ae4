//! Reading lengths and tokens from Arrow IPC files and streams written by arrow-rs's own writer.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    clippy::cast_possible_truncation,
    missing_docs
)]

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::{
    ArrayRef, Float32Array, Int16Array, Int64Array, RecordBatch, StringArray, UInt64Array,
};
use common::{batch, temp_path, tokens_column, write_ipc};
use dflash_batch_core::{read_lengths, ErrorKind, Gathered, ReadProblem, TokenStore, Tokens};
use proptest::prelude::*;

/// Three rows per batch, two batches: `seq_len` (int64) and `input_ids` (list<int32>).
fn sample(stream: bool) -> (PathBuf, Vec<Vec<i32>>) {
    let rows: Vec<Vec<i32>> = (0..6)
        .map(|r| (0..(r * 3 + 1)).map(|t| r * 100 + t).collect())
        .collect();
    let batches: Vec<RecordBatch> = rows
        .chunks(3)
        .map(|chunk| {
            let lens: Vec<i64> = chunk.iter().map(|r| r.len() as i64).collect();
            batch(vec![
                ("seq_len", Arc::new(Int64Array::from(lens)) as ArrayRef),
                ("input_ids", tokens_column(chunk)),
            ])
        })
        .collect();
    (write_ipc(&batches, stream), rows)
}

fn problem(e: &dflash_batch_core::Error) -> &ReadProblem {
    match e.kind() {
        ErrorKind::Read { problem, .. } => problem,
        other => panic!("expected a read error, got {other:?}"),
    }
}

#[test]
fn lengths_from_integers_and_offsets_in_both_formats() {
    for stream in [true, false] {
        let (path, rows) = sample(stream);
        let expected: Vec<u32> = rows.iter().map(|r| r.len() as u32).collect();
        assert_eq!(
            read_lengths(&[&path], "seq_len", None, |_| {}).unwrap(),
            expected
        );
        assert_eq!(
            read_lengths(&[&path], "input_ids", None, |_| {}).unwrap(),
            expected
        );
    }
}

#[test]
fn files_form_one_row_space_in_order_with_progress() {
    let (a, rows_a) = sample(true);
    let (b, rows_b) = sample(false);
    let mut seen = Vec::new();
    let lengths = read_lengths(&[&b, &a], "seq_len", None, |done| seen.push(done)).unwrap();
    let expected: Vec<u32> = rows_b
        .iter()
        .chain(&rows_a)
        .map(|r| r.len() as u32)
        .collect();
    assert_eq!(lengths, expected);
    assert_eq!(seen, vec![1, 2]);
}

#[test]
fn token_store_rows_and_gather_match_what_was_written() {
    let (path, rows) = sample(true);
    let store = TokenStore::open(&[&path, &path], "input_ids", None, |_| {}).unwrap();
    assert_eq!(store.len(), 12);
    for (i, row) in rows.iter().chain(&rows).enumerate() {
        assert_eq!(store.get(i as i64).unwrap(), Tokens::I32(row));
    }
    assert_eq!(store.get(-1).unwrap(), Tokens::I32(&rows[5]));
    let (flat, offsets) = store.gather(&[4, 0, 4]).unwrap();
    let expected: Vec<i32> = [&rows[4], &rows[0], &rows[4]]
        .into_iter()
        .flatten()
        .copied()
        .collect();
    assert_eq!(flat, Gathered::I32(expected));
    assert_eq!(offsets, vec![0, 13, 14, 27]);
}

#[test]
fn token_store_follows_a_row_mapping() {
    let (path, rows) = sample(false);
    let store = TokenStore::open(&[&path], "input_ids", Some(vec![5, 1, 1]), |_| {}).unwrap();
    assert_eq!(store.lengths(), &[16, 4, 4]);
    assert_eq!(store.get(0).unwrap(), Tokens::I32(&rows[5]));
    let err = TokenStore::open(&[&path], "input_ids", Some(vec![6]), |_| {}).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::RowOutOfRange { row: 6, rows: 6 }),
        "{err}"
    );
}

#[test]
fn out_of_range_rows_are_errors() {
    let (path, _) = sample(true);
    let store = TokenStore::open(&[&path], "input_ids", None, |_| {}).unwrap();
    for bad in [6, -7, i64::MIN, i64::MAX] {
        let err = store.get(bad).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::RowOutOfRange { rows: 6, .. }),
            "{err}"
        );
        assert!(store.gather(&[0, bad]).is_err());
    }
}

#[test]
fn each_bad_input_has_its_own_error() {
    let (good, _) = sample(true);
    let missing = temp_path("missing.arrow");
    let err = read_lengths(&[&missing], "seq_len", None, |_| {}).unwrap_err();
    assert!(matches!(
        problem(&err),
        ReadProblem::Io {
            kind: std::io::ErrorKind::NotFound,
            ..
        }
    ));

    let text = temp_path("notes.txt");
    std::fs::write(&text, b"hello, world").unwrap();
    let err = read_lengths(&[&text], "seq_len", None, |_| {}).unwrap_err();
    assert!(
        matches!(problem(&err), ReadProblem::NotArrow { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("b'hello, w'"), "{err}");

    let err = read_lengths(&[&good], "num_tokens", None, |_| {}).unwrap_err();
    match problem(&err) {
        ReadProblem::ColumnMissing {
            available,
            suggestion,
            ..
        } => {
            assert_eq!(available, &["seq_len", "input_ids"]);
            assert_eq!(suggestion.as_deref(), Some("input_ids"));
        }
        other => panic!("{other:?}"),
    }

    let err = TokenStore::open(&[&good], "seq_len", None, |_| {}).unwrap_err();
    assert!(
        matches!(problem(&err), ReadProblem::ColumnType { .. }),
        "{err}"
    );

    let other = write_ipc(
        &[batch(vec![(
            "seq_len",
            Arc::new(Int16Array::from(vec![3])) as ArrayRef,
        )])],
        true,
    );
    let err = read_lengths(&[&good, &other], "seq_len", None, |_| {}).unwrap_err();
    assert!(
        matches!(problem(&err), ReadProblem::SchemaMismatch { .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains(&good.display().to_string()),
        "{err}"
    );
}

#[test]
fn wrong_types_nulls_negatives_and_empty_datasets_are_refused() {
    let floats = write_ipc(
        &[batch(vec![(
            "n",
            Arc::new(Float32Array::from(vec![1.0])) as ArrayRef,
        )])],
        true,
    );
    let strings = write_ipc(
        &[batch(vec![(
            "n",
            Arc::new(StringArray::from(vec!["a"])) as ArrayRef,
        )])],
        false,
    );
    for path in [&floats, &strings] {
        let err = read_lengths(&[path], "n", None, |_| {}).unwrap_err();
        assert!(
            matches!(problem(&err), ReadProblem::ColumnType { .. }),
            "{err}"
        );
    }
    let nulls = write_ipc(
        &[batch(vec![(
            "n",
            Arc::new(Int64Array::from(vec![Some(1), None])) as ArrayRef,
        )])],
        true,
    );
    let err = read_lengths(&[&nulls], "n", None, |_| {}).unwrap_err();
    assert_eq!(
        problem(&err),
        &ReadProblem::Null {
            column: "n".into(),
            row: 1
        }
    );
    let negative = write_ipc(
        &[batch(vec![(
            "n",
            Arc::new(Int64Array::from(vec![4, -2])) as ArrayRef,
        )])],
        true,
    );
    let err = read_lengths(&[&negative], "n", None, |_| {}).unwrap_err();
    assert_eq!(
        problem(&err),
        &ReadProblem::Negative {
            column: "n".into(),
            row: 1,
            value: -2
        }
    );
    let huge = write_ipc(
        &[batch(vec![(
            "n",
            Arc::new(UInt64Array::from(vec![1 << 40])) as ArrayRef,
        )])],
        false,
    );
    let err = read_lengths(&[&huge], "n", None, |_| {}).unwrap_err();
    assert!(
        matches!(problem(&err), ReadProblem::TooLarge { row: 0, .. }),
        "{err}"
    );
    let empty = write_ipc(
        &[batch(vec![(
            "n",
            Arc::new(Int64Array::from(Vec::<i64>::new())) as ArrayRef,
        )])],
        true,
    );
    let err = read_lengths(&[&empty], "n", None, |_| {}).unwrap_err();
    assert_eq!(problem(&err), &ReadProblem::Empty);
    let none: [&PathBuf; 0] = [];
    assert!(read_lengths(&none, "n", None, |_| {}).is_err());
}

#[test]
fn every_truncation_is_an_error() {
    for stream in [true, false] {
        let (path, _) = sample(stream);
        let bytes = std::fs::read(&path).unwrap();
        let cut = temp_path("cut.arrow");
        for len in 0..bytes.len() {
            std::fs::write(&cut, &bytes[..len]).unwrap();
            assert!(
                read_lengths(&[&cut], "input_ids", None, |_| {}).is_err(),
                "stream={stream}, {len} bytes"
            );
            assert!(TokenStore::open(&[&cut], "input_ids", None, |_| {}).is_err());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    /// Flipped bits give an error or (when they hit padding or unread columns) a result; never a panic.
    #[test]
    fn corrupted_files_never_panic(stream in any::<bool>(), flips in prop::collection::vec(any::<usize>(), 1..8)) {
        let (path, _) = sample(stream);
        let mut bytes = std::fs::read(&path).unwrap();
        for f in flips {
            let bit = f % (bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
        }
        let broken = temp_path("flipped.arrow");
        std::fs::write(&broken, &bytes).unwrap();
        if let Ok(store) = TokenStore::open(&[&broken], "input_ids", None, |_| {}) {
            let all: Vec<i64> = (0..store.len() as i64).collect();
            let (_, offsets) = store.gather(&all).unwrap();
            prop_assert_eq!(offsets.len(), store.len() + 1);
        }
        let _ = read_lengths(&[&broken], "seq_len", None, |_| {});
        std::fs::remove_file(&broken).unwrap();
    }
}

//! A mapped file that changes under the store is an error naming it, never a signal; a loss mask holds
//! what a loss can apply (0/1 values or integer labels), the same from a file as from a table.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    clippy::cast_possible_truncation,
    missing_docs
)]

mod common;

use std::fs::OpenOptions;
use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, Float32Builder, Int8Builder, ListBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use common::{batch, tokens_column, write_ipc};
use dflash_batch_core::lengths::{Borrowed, Lengths};
use dflash_batch_core::{Batching, Config, ErrorKind, MaskKind, Planner, ReadProblem, TokenStore};

fn rows() -> Vec<Vec<i32>> {
    (0..40)
        .map(|r| (0..(r % 7 + 2)).map(|t| r * 10 + t).collect())
        .collect()
}

fn store_file() -> std::path::PathBuf {
    let batches: Vec<RecordBatch> = rows()
        .chunks(10)
        .map(|chunk| batch(vec![("input_ids", tokens_column(chunk))]))
        .collect();
    write_ipc(&batches, false)
}

fn changed(e: &dflash_batch_core::Error) -> String {
    match e.kind() {
        ErrorKind::Read {
            problem: ReadProblem::Changed { detail },
            path,
        } => format!("{path}: {detail}"),
        other => panic!("expected a changed file, got {other:?}"),
    }
}

#[test]
fn a_truncated_file_fails_every_read_naming_it() {
    let path = store_file();
    let store = TokenStore::open(&[&path], "input_ids", None, |_| {}).unwrap();
    assert!(store.gather(&[0i64, 5, 39]).is_ok());
    let len = std::fs::metadata(&path).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    // Row 39 lies in the last record batch: its offsets, not only its tokens, are past the new end.
    let message = changed(&store.gather(&[0i64, 39]).unwrap_err());
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(
        message.contains(&format!(
            "was {len} bytes when mapped and is {} now",
            len / 2
        )),
        "{message}"
    );
    assert!(store.get(3).is_err(), "a row view is refused too");
    assert!(
        store.label_counts(&[0i64], None).is_err(),
        "and counting labels"
    );
}

#[test]
fn a_file_rewritten_in_place_with_the_same_size_fails_too() {
    let path = store_file();
    let store = TokenStore::open(&[&path], "input_ids", None, |_| {}).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    // Another modification time (file systems keep at least microseconds; wait past a coarse clock).
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&path, &bytes).unwrap();
    let message = changed(&store.gather(&[1i64]).unwrap_err());
    assert!(
        message.contains("rewritten after it was mapped"),
        "{message}"
    );
}

fn mask_file(column: ArrayRef) -> std::path::PathBuf {
    let tokens = tokens_column(&rows()[..2]);
    write_ipc(
        &[batch(vec![("input_ids", tokens), ("mask", column)])],
        true,
    )
}

fn mask_store(path: &std::path::Path) -> dflash_batch_core::Result<TokenStore> {
    let tokens = TokenStore::open(&[path], "input_ids", None, |_| {})?;
    let mask = TokenStore::open_mask(&[path], "mask", None, |_| {})?;
    tokens.with_mask(mask, MaskKind::Binary)
}

#[test]
fn a_binary_mask_of_bools_reads_as_zeros_and_ones() {
    let mut b = ListBuilder::new(BooleanBuilder::new());
    for row in &rows()[..2] {
        b.append_value((0..row.len()).map(|j| Some(j > 0)));
    }
    let store = mask_store(&mask_file(Arc::new(b.finish()))).unwrap();
    // Every position but the first counts; the first is never a label anyway.
    let counts = store.label_counts(&[0i64, 1], None).unwrap();
    assert_eq!(
        counts,
        vec![rows()[0].len() as u32 - 1, rows()[1].len() as u32 - 1]
    );
}

#[test]
fn a_binary_mask_holding_another_value_names_it() {
    let mut b = ListBuilder::new(Int8Builder::new());
    b.append_value(rows()[0].iter().map(|_| Some(1)));
    b.append_value((0..rows()[1].len()).map(|j| Some(if j == 2 { -1 } else { 0 })));
    let error = mask_store(&mask_file(Arc::new(b.finish()))).unwrap_err();
    match error.kind() {
        ErrorKind::MaskValue {
            row: Some(1),
            position: 2,
            found,
        } => assert_eq!(found, "-1"),
        other => panic!("{other:?}"),
    }
    assert!(
        error.to_string().contains("holds -1 at row 1, position 2"),
        "{error}"
    );
}

#[test]
fn a_float_mask_is_refused() {
    let mut b = ListBuilder::new(Float32Builder::new());
    for row in &rows()[..2] {
        b.append_value(row.iter().map(|_| Some(0.5)));
    }
    let path = mask_file(Arc::new(b.finish()));
    let error = TokenStore::open_mask(&[&path], "mask", None, |_| {}).unwrap_err();
    assert!(
        error.to_string().contains("0/1 values (bools or integers)"),
        "{error}"
    );
}

/// A caller's lengths, as a binding's map would hand them over; `changed` makes `check` fail.
#[derive(Debug)]
struct Held {
    values: Vec<u16>,
    changed: std::sync::atomic::AtomicBool,
}

impl Borrowed<u16> for Held {
    fn values(&self) -> &[u16] {
        &self.values
    }
    fn check(&self) -> dflash_batch_core::Result<()> {
        if self.changed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(ErrorKind::EmptyLengths.into());
        }
        Ok(())
    }
}

#[test]
fn borrowed_lengths_are_checked_like_a_copy_and_before_each_use() {
    let held = |values: Vec<u16>| {
        Arc::new(Held {
            values,
            changed: false.into(),
        })
    };
    let err = Lengths::borrow_u16(held(vec![3, 0, 2])).unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::NonPositiveLength { row: 1, value: 0 }
    );
    let source = held(vec![3, 9, 2]);
    let borrowed = Lengths::borrow_u16(source.clone()).unwrap();
    assert!(borrowed.is_borrowed() && !Lengths::from(vec![3u16]).is_borrowed());
    assert_eq!(borrowed, Lengths::from(vec![3u16, 9, 2]));
    assert_eq!(borrowed.to_u32_vec().unwrap(), [3, 9, 2]);
    let planner = Planner::new(borrowed, Config::new(Batching::Tokens(16))).unwrap();
    let owned = Planner::new(vec![3u32, 9, 2], Config::new(Batching::Tokens(16))).unwrap();
    assert_eq!(planner.fingerprint(), owned.fingerprint());
    assert_eq!(
        planner.plan(2).unwrap().indices(),
        owned.plan(2).unwrap().indices()
    );
    source
        .changed
        .store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        planner.plan(2).unwrap_err().kind(),
        &ErrorKind::EmptyLengths
    );
    assert!(planner.dataset_lengths().is_err() && planner.locate(&[0]).is_err());
}

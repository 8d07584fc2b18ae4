//! Arrow files for the integration tests, written with arrow-rs's own writer.
#![allow(dead_code, clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arrow_array::builder::{Int32Builder, ListBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_ipc::writer::{FileWriter, StreamWriter};

/// A fresh path in the temp dir (removed by the OS; names never collide within a run).
pub fn temp_path(name: &str) -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("dflash-arrow-{}-{n}-{name}", std::process::id()))
}

pub fn tokens_column(rows: &[Vec<i32>]) -> ArrayRef {
    let mut b = ListBuilder::new(Int32Builder::new());
    for r in rows {
        b.values().append_slice(r);
        b.append(true);
    }
    Arc::new(b.finish())
}

pub fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
    RecordBatch::try_from_iter(columns).unwrap()
}

pub fn write_ipc(batches: &[RecordBatch], stream: bool) -> PathBuf {
    let path = temp_path(if stream { "s.arrow" } else { "f.arrow" });
    let file = std::fs::File::create(&path).unwrap();
    let schema = batches[0].schema();
    if stream {
        let mut w = StreamWriter::try_new(file, &schema).unwrap();
        batches.iter().for_each(|b| w.write(b).unwrap());
        w.finish().unwrap();
    } else {
        let mut w = FileWriter::try_new(file, &schema).unwrap();
        batches.iter().for_each(|b| w.write(b).unwrap());
        w.finish().unwrap();
    }
    path
}

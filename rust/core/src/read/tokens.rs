//! A token column kept memory-mapped: random access to any row's tokens without reading the rest.
//!
//! Rows are found through the record batches' own offsets (`starts` locates the batch by binary
//! search over ~1000-row batches), so opening a store costs one pass over the offsets and nothing
//! over the values; a row's tokens are a slice of the mapped file. With a row mapping (`datasets`'
//! indices after `select`/`shuffle`/`filter`) row `i` of the store is file row `rows[i]`.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, GenericListArray, OffsetSizeTrait, UInt8Array};
use arrow_buffer::{ArrowNativeType, OffsetBuffer};
use arrow_schema::{DataType, Field};

use crate::error::read::ReadProblem;
use crate::error::{ErrorKind, Result};
use crate::memory;
use crate::read::arrow::Column;
use crate::read::column::{append_lengths, first_null};
use crate::read::dataset::{check_rows, for_each_file};
use crate::read::guard::FileGuard;
pub(crate) use crate::read::values::{accept_mask, accept_tokens};
use crate::read::values::{values_for, Values};
pub use crate::read::values::{Gathered, Tokens};

pub(crate) use crate::read::values::Located;

mod concat;

/// One record batch's offsets, in the width the file stores.
#[derive(Debug, Clone)]
enum Offsets {
    Small(OffsetBuffer<i32>),
    Large(OffsetBuffer<i64>),
}

impl Offsets {
    fn range(&self, i: usize) -> Range<usize> {
        match self {
            Offsets::Small(o) => o[i].as_usize()..o[i + 1].as_usize(),
            Offsets::Large(o) => o[i].as_usize()..o[i + 1].as_usize(),
        }
    }
}

/// What a loss-mask column holds (see `mask.rs`, where its logic lives).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskKind {
    /// The label of every position; `-100` is ignored.
    Labels,
    /// Non-zero where the loss counts, 0 where it does not.
    Binary,
}

/// A loss-mask column and its kind, attached to a token store by [`TokenStore::with_mask`].
#[derive(Debug, Clone)]
pub struct Mask {
    pub(crate) column: TokenStore,
    pub(crate) kind: MaskKind,
    /// A 0/1 mask's masked runs, `[start, end)` pairs in row coordinates: row `r`'s are
    /// `runs[run_starts[r]..run_starts[r + 1]]` (built once, so collation need not read the mask).
    pub(crate) runs: Vec<u32>,
    pub(crate) run_starts: Vec<usize>,
}

/// A mapped token column over one or more files (see the module docs).
#[derive(Debug, Clone)]
pub struct TokenStore {
    offsets: Vec<Offsets>,
    values: Values,
    /// File rows before each record batch, and the total at the end.
    starts: Vec<usize>,
    lengths: Vec<u32>,
    /// File row of each store row, when the store has a mapping (checked in range on open).
    rows: Option<Vec<usize>>,
    /// What one value of the column is, for messages: `token`, or `loss-mask value`.
    what: &'static str,
    /// The mapped files of each column added (one per file, or the pair's `.bin`), and the column of each
    /// record batch: what a read of rows checks first (`guard.rs`).
    files: Vec<Vec<Arc<FileGuard>>>,
    batch_files: Vec<u32>,
    /// The loss mask beside the tokens, applied by every collation (see `mask.rs`).
    pub(crate) mask: Option<Box<Mask>>,
}

impl TokenStore {
    /// Maps column `name` of `paths` (in order, one row space). With `rows`, row `i` of the store is
    /// file row `rows[i]`. `progress(done)` is called after each file.
    pub fn open<P: AsRef<Path>>(
        paths: &[P],
        name: &str,
        rows: Option<Vec<u64>>,
        progress: impl FnMut(usize),
    ) -> Result<Self> {
        Self::open_as(paths, name, rows, progress, accept_tokens, "token")
    }

    /// Maps the loss-mask column `name` of `paths`, as [`TokenStore::open`] maps tokens but with the
    /// mask's type rule ([`accept_mask`]: bools are read as 0/1 bytes, floats refused); attach it with
    /// [`TokenStore::with_mask`], which checks its values.
    pub fn open_mask<P: AsRef<Path>>(
        paths: &[P],
        name: &str,
        rows: Option<Vec<u64>>,
        progress: impl FnMut(usize),
    ) -> Result<Self> {
        Self::open_as(paths, name, rows, progress, accept_mask, "loss-mask value")
    }

    fn open_as<P: AsRef<Path>>(
        paths: &[P],
        name: &str,
        rows: Option<Vec<u64>>,
        progress: impl FnMut(usize),
        accept: fn(&Field) -> Result<(), ReadProblem>,
        what: &'static str,
    ) -> Result<Self> {
        let mut store = Self::empty();
        store.what = what;
        for_each_file(paths, name, accept, progress, |_, column| {
            store.add(name, &column)
        })?;
        store.map(rows)
    }

    /// An empty store whose values are `what` (`token`, `loss-mask value`), for messages.
    pub(crate) fn empty_of(what: &'static str) -> Self {
        Self {
            what,
            ..Self::empty()
        }
    }

    pub(crate) fn empty() -> Self {
        Self {
            offsets: Vec::new(),
            values: Values::I32(Vec::new()),
            starts: vec![0],
            lengths: Vec::new(),
            rows: None,
            what: "token",
            files: Vec::new(),
            batch_files: Vec::new(),
            mask: None,
        }
    }

    /// Appends one file's (or table's) column; the first one sets the token type, which
    /// `accept_tokens` and the schema check keep the same for the rest.
    pub(crate) fn add(&mut self, name: &str, column: &Column) -> Result<(), ReadProblem> {
        if self.offsets.is_empty() {
            if let DataType::List(item) | DataType::LargeList(item) = column.field.data_type() {
                let stored = match item.data_type() {
                    DataType::Boolean => &DataType::UInt8, // a mask's bools, as 0/1 bytes
                    other => other,
                };
                self.values = values_for(stored).unwrap_or(Values::I32(Vec::new()));
            }
        }
        append_lengths(name, &column.chunks, &mut self.lengths)?;
        // Files are far fewer than 2^32.
        #[allow(clippy::cast_possible_truncation)]
        let file = self.files.len() as u32;
        self.files.push(column.guards.clone());
        column.chunks.iter().try_for_each(|chunk| {
            self.batch_files.push(file);
            self.push(name, chunk)
        })
    }

    /// Fails naming the file when a file that record batches `batches` read changed since it was mapped.
    /// Each file is checked once a call (a batch's rows come from a few files, in runs).
    fn check_files(&self, batches: impl Iterator<Item = usize>) -> Result<()> {
        if self.files.iter().all(Vec::is_empty) {
            return Ok(()); // a table in memory
        }
        let mut checked: Vec<u32> = Vec::new();
        for batch in batches {
            let file = self.batch_files[batch];
            if checked.last() == Some(&file) || checked.contains(&file) {
                continue;
            }
            checked.push(file);
            self.files[file as usize]
                .iter()
                .try_for_each(|guard| guard.check())?;
        }
        Ok(())
    }

    /// Applies a row mapping: row `i` of the store becomes file row `rows[i]`.
    pub(crate) fn map(mut self, rows: Option<Vec<u64>>) -> Result<Self> {
        if let Some(rows) = rows {
            let rows = check_rows(&rows, self.file_rows())?;
            self.lengths = rows.iter().map(|&r| self.lengths[r]).collect();
            self.rows = Some(rows);
        }
        Ok(self)
    }

    fn push(&mut self, name: &str, chunk: &ArrayRef) -> Result<(), ReadProblem> {
        let (offsets, values) = match chunk.data_type() {
            DataType::List(_) => split(chunk.as_list::<i32>(), Offsets::Small),
            _ => split(chunk.as_list::<i64>(), Offsets::Large),
        };
        if let Some(null) = first_null(values.as_ref()) {
            let batch_row = (0..chunk.len()).find(|&i| offsets.range(i).contains(&null));
            return Err(ReadProblem::NullValue {
                column: name.to_string(),
                row: (self.file_rows() + batch_row.unwrap_or(0)) as u64,
                what: self.what,
            });
        }
        if let Some(bools) = values.as_boolean_opt() {
            // Bit-packed on disk: the mask's 0/1 bytes are made once (a byte a token, in memory).
            let bytes: UInt8Array = bools.values().iter().map(|b| Some(u8::from(b))).collect();
            self.values.push(&(std::sync::Arc::new(bytes) as ArrayRef));
        } else {
            self.values.push(&values);
        }
        self.offsets.push(offsets);
        self.starts.push(self.file_rows() + chunk.len());
        Ok(())
    }

    fn file_rows(&self) -> usize {
        self.starts.last().copied().unwrap_or(0)
    }

    /// The numpy name of the token type, e.g. `int32` or `uint16`.
    pub fn dtype(&self) -> &'static str {
        self.values.dtype()
    }

    /// Rows in the store.
    pub fn len(&self) -> usize {
        self.lengths.len()
    }

    /// Whether the store has no rows (never true for an opened store: empty datasets are refused).
    pub fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }

    /// Tokens per row, in store order.
    pub fn lengths(&self) -> &[u32] {
        &self.lengths
    }

    /// The row mapping (file row of each store row), if the store has one.
    pub fn rows(&self) -> Option<&[usize]> {
        self.rows.as_deref()
    }

    /// The store row `index` names, Python-style: negative counts from the end. Takes any integer
    /// type (as `i128`) so that `u64` and `i64` indices are both checked without wrapping.
    pub fn resolve(&self, index: impl Into<i128>) -> Result<usize> {
        let index = index.into();
        let len = self.len() as i128;
        let resolved = if index < 0 { index + len } else { index };
        match usize::try_from(resolved) {
            Ok(row) if resolved < len => Ok(row),
            _ => Err(ErrorKind::RowOutOfRange {
                row: index,
                rows: self.len() as u64,
            }
            .into()),
        }
    }

    /// The tokens of store row `index` (negative counts from the end), borrowed from the map.
    pub fn get(&self, index: i64) -> Result<Tokens<'_>> {
        let row = self.resolve(index)?;
        self.check_files(std::iter::once(self.batch_of(row).0))?;
        let (batch, range) = self.locate(row);
        Ok(self.values.tokens(batch, range))
    }

    /// Record batch and file row of store row `row` (already resolved), from the store's own arrays:
    /// nothing mapped is read, so the files can be checked before anything is.
    fn batch_of(&self, row: usize) -> (usize, usize) {
        let file_row = match &self.rows {
            // Mapped rows were checked against the file rows when the store was opened.
            Some(rows) => rows[row],
            None => row,
        };
        (
            self.starts.partition_point(|&s| s <= file_row) - 1,
            file_row,
        )
    }

    /// Record batch and value range of store row `row` (already resolved); reads the batch's offsets,
    /// which lie in the mapped file.
    fn locate(&self, row: usize) -> (usize, Range<usize>) {
        let (batch, file_row) = self.batch_of(row);
        (
            batch,
            self.offsets[batch].range(file_row - self.starts[batch]),
        )
    }

    /// Where the rows `indices` lie: record batch and value range of each, in order. Every file they
    /// read (offsets and values) is checked first: a changed one fails, naming it (`guard.rs`).
    pub(crate) fn locate_all<I: Copy + Into<i128>>(&self, indices: &[I]) -> Result<Vec<Located>> {
        let places = indices
            .iter()
            .map(|&i| Ok(self.batch_of(self.resolve(i)?)))
            .collect::<Result<Vec<_>>>()?;
        self.check_files(places.iter().map(|&(batch, _)| batch))?;
        Ok(places
            .into_iter()
            .map(|(batch, file_row)| {
                (
                    batch,
                    self.offsets[batch].range(file_row - self.starts[batch]),
                )
            })
            .collect())
    }

    /// The tokens at a location from [`TokenStore::locate_all`].
    pub(crate) fn tokens_at(&self, (batch, range): &Located) -> Tokens<'_> {
        self.values.tokens(*batch, range.clone())
    }

    /// The tokens of `indices` (negative counts from the end) concatenated, and the `len + 1` offsets
    /// that delimit each row in them.
    pub fn gather<I: Copy + Into<i128>>(&self, indices: &[I]) -> Result<(Gathered, Vec<i64>)> {
        memory::reserve(
            "gathering rows",
            indices.len() as u64 * (std::mem::size_of::<Located>() as u64 + 8),
        )?;
        let located = self.locate_all(indices)?;
        let mut offsets = memory::vec_with_capacity("gathering rows", located.len() + 1)?;
        offsets.push(0i64);
        for (_, range) in &located {
            offsets.push(offsets[offsets.len() - 1] + range.len() as i64);
        }
        Ok((self.values.concat(&located)?, offsets))
    }
}

fn split<O: OffsetSizeTrait>(
    list: &GenericListArray<O>,
    wrap: fn(OffsetBuffer<O>) -> Offsets,
) -> (Offsets, ArrayRef) {
    (wrap(list.offsets().clone()), list.values().clone())
}

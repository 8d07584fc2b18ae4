//! A dataset: files in order, one global row space (`datasets.save_to_disk` shards, any list of IPC
//! files, or Megatron `.bin`/`.idx` pairs named by either half). Every file must have the schema of
//! the first, so rows mean the same thing throughout.

use std::path::Path;

use arrow_schema::{Field, Schema};

use crate::error::read::ReadProblem;
use crate::error::{ErrorKind, Result};
use crate::memory;
use crate::read::arrow::Column;
use crate::read::column::{accept_lengths, append_lengths, type_name};
use crate::read::megatron;

/// Calls `each(file_index, column)` for column `name` of every file in order, checking the files
/// agree on their schema; `progress(done)` after each file. Fails with [`ReadProblem::Empty`] when
/// there are no rows at all.
pub fn for_each_file<P: AsRef<Path>>(
    paths: &[P],
    name: &str,
    accept: impl Fn(&Field) -> Result<(), ReadProblem>,
    mut progress: impl FnMut(usize),
    mut each: impl FnMut(usize, Column) -> Result<(), ReadProblem>,
) -> Result<()> {
    let mut first: Option<(String, std::sync::Arc<Schema>)> = None;
    let mut rows = 0;
    for (i, path) in paths.iter().enumerate() {
        let path = path.as_ref();
        let fail = |problem| read_failure(path, problem);
        let read = if megatron::is_megatron(path) {
            megatron::read_column(path, name, &accept)
        } else {
            crate::read::arrow::read_column(path, name, &accept)
        };
        let column = match (read, &first) {
            (Ok(column), _) => column,
            // The first file had the column: this one's schema differs, which says more.
            (Err(ReadProblem::ColumnMissing { available, .. }), Some((first_path, _))) => {
                return Err(fail(ReadProblem::SchemaMismatch {
                    first: first_path.clone(),
                    detail: format!("no column {name:?} here, only {available:?}"),
                }))
            }
            (Err(problem), _) => return Err(fail(problem)),
        };
        match &first {
            None => first = Some((path.display().to_string(), column.schema.clone())),
            Some((first_path, schema)) => {
                if let Some(detail) = schema_difference(schema, &column.schema) {
                    return Err(fail(ReadProblem::SchemaMismatch {
                        first: first_path.clone(),
                        detail,
                    }));
                }
            }
        }
        rows += column.rows();
        // What a reader keeps per row (a length, an offset) with room for its vectors to grow.
        memory::reserve("reading a column", rows as u64 * READ_BYTES_PER_ROW)?;
        each(i, column).map_err(fail)?;
        progress(i + 1);
    }
    if rows == 0 {
        return Err(empty(paths));
    }
    Ok(())
}

/// Bytes a reader keeps per row of the files read so far, at the peak of its vectors' growth.
pub(crate) const READ_BYTES_PER_ROW: u64 = 16;

/// The length of every row of `paths`, from column `name`: an integer column, or a list column whose
/// offsets give the lengths. The result is copied out of the maps, which are closed on return: a
/// file changed later cannot affect it.
/// With `rows` (a `datasets` indices mapping), the lengths of those file rows, in that order.
pub fn read_lengths<P: AsRef<Path>>(
    paths: &[P],
    name: &str,
    rows: Option<&[u64]>,
    progress: impl FnMut(usize),
) -> Result<Vec<u32>> {
    let mut lengths = Vec::new();
    for_each_file(paths, name, accept_lengths, progress, |_, column| {
        append_lengths(name, &column.chunks, &mut lengths)
    })?;
    map_rows(lengths, rows)
}

/// The document boundaries of Megatron pairs `paths` (each named by either half), in one row space:
/// sequence numbers rising from 0, each file's boundaries shifted by the sequences before it. A file
/// whose last document is left open (no closing boundary) is closed at its end, so documents never
/// span files.
pub fn read_documents<P: AsRef<Path>>(paths: &[P]) -> Result<Vec<u64>> {
    let mut boundaries = vec![0u64];
    let mut before = 0u64;
    for path in paths {
        let path = path.as_ref();
        if !megatron::is_megatron(path) {
            return Err(read_failure(path, ReadProblem::NoDocuments));
        }
        let (documents, sequences) =
            megatron::read_documents(path).map_err(|p| read_failure(path, p))?;
        boundaries
            .try_reserve(documents.len() + 1)
            .map_err(|_| ErrorKind::OutOfMemory {
                what: "reading document boundaries",
                bytes: (boundaries.len() + documents.len() + 1) as u64 * 8,
            })?;
        boundaries.extend(documents.iter().skip(1).map(|&b| before + b));
        before += sequences as u64;
        if boundaries.last() != Some(&before) {
            boundaries.push(before);
        }
    }
    if before == 0 {
        return Err(empty(paths));
    }
    Ok(boundaries)
}

/// [`check_rows`], after reserving its memory and that of a `u32` a row.
fn checked_rows(rows: &[u64], file_rows: usize) -> Result<Vec<usize>> {
    memory::reserve("mapping rows", rows.len() as u64 * 12)?;
    check_rows(rows, file_rows)
}

/// `rows` as positions among `file_rows` rows, each checked to exist.
pub(crate) fn check_rows(rows: &[u64], file_rows: usize) -> Result<Vec<usize>> {
    rows.iter()
        .map(|&r| {
            usize::try_from(r)
                .ok()
                .filter(|&r| r < file_rows)
                .ok_or_else(|| {
                    ErrorKind::RowOutOfRange {
                        row: i128::from(r),
                        rows: file_rows as u64,
                    }
                    .into()
                })
        })
        .collect()
}

/// The lengths of `rows` (all of them without a mapping).
pub(crate) fn map_rows(lengths: Vec<u32>, rows: Option<&[u64]>) -> Result<Vec<u32>> {
    match rows {
        None => Ok(lengths),
        Some(rows) => Ok(checked_rows(rows, lengths.len())?
            .into_iter()
            .map(|r| lengths[r])
            .collect()),
    }
}

/// [`ReadProblem::Empty`] for a dataset of no rows, named by its first file.
fn empty<P: AsRef<Path>>(paths: &[P]) -> crate::error::Error {
    let source = paths.first().map_or_else(
        || "the list of files".to_owned(),
        |p| p.as_ref().display().to_string(),
    );
    read_failure(Path::new(&source), ReadProblem::Empty)
}

/// The error of `problem` in `path`, or in the file it names ([`ReadProblem::InFile`]).
pub(crate) fn read_failure(path: &Path, problem: ReadProblem) -> crate::error::Error {
    let (path, problem) = match problem {
        ReadProblem::InFile { path, problem } => (path, *problem),
        ReadProblem::OutOfMemory { what, bytes } => {
            return ErrorKind::OutOfMemory { what, bytes }.into()
        }
        problem => (path.display().to_string(), problem),
    };
    ErrorKind::Read { path, problem }.into()
}

/// The first difference between two schemas, ignoring metadata and nullability (shards written by
/// one dataset agree on names and types; nullability flags may differ harmlessly).
fn schema_difference(first: &Schema, other: &Schema) -> Option<String> {
    let names = |s: &Schema| {
        s.fields()
            .iter()
            .map(|f| f.name().clone())
            .collect::<Vec<_>>()
    };
    if names(first) != names(other) {
        return Some(format!(
            "columns {:?} here, {:?} there",
            names(other),
            names(first)
        ));
    }
    first
        .fields()
        .iter()
        .zip(other.fields())
        .find(|(a, b)| !a.data_type().equals_datatype(b.data_type()))
        .map(|(a, b)| {
            let (here, there) = (type_name(b.data_type()), type_name(a.data_type()));
            format!("column {:?} is {here} here, {there} there", a.name())
        })
}

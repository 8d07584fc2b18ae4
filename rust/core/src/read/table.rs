//! A table that lives in memory: record batches a caller already holds (a pyarrow table handed over
//! through the Arrow C data interface), read by the rules a file is read by, so an in-memory dataset
//! and its files give the same lengths, tokens and errors.
//!
//! Arrays imported through the C data interface arrive unvalidated (the importer trusts the
//! producer), so every chunk of the column asked for is validated in full here — offsets monotonic
//! and inside the values — before anything indexes into it: a producer's bad offsets become a
//! `DataError`, never a read out of bounds. Only that column is validated; the others are never
//! looked at, as with files.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, LargeListArray, RecordBatch};
use arrow_buffer::{OffsetBuffer, ScalarBuffer};
use arrow_schema::{Field, SchemaRef};

use crate::error::read::ReadProblem;
use crate::error::Result;
use crate::read::arrow::{missing_column, Column};
use crate::read::column::{accept_lengths, append_lengths};
use crate::read::dataset::{map_rows, read_failure, READ_BYTES_PER_ROW};
use crate::read::tokens::{accept_mask, accept_tokens, Gathered, TokenStore};

/// How messages name a table that has no path.
pub const IN_MEMORY: &str = "the in-memory table";

/// Column `name` of `batches` (which share `schema`), checked by `accept` and validated.
pub(crate) fn table_column(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    name: &str,
    accept: impl Fn(&Field) -> Result<(), ReadProblem>,
) -> Result<Column> {
    let fail = |problem| read_failure(Path::new(IN_MEMORY), problem);
    let index = schema
        .index_of(name)
        .map_err(|_| fail(missing_column(schema, name)))?;
    let field = Arc::new(schema.field(index).clone());
    accept(&field).map_err(fail)?;
    let chunks: Vec<_> = batches.iter().map(|b| b.column(index).clone()).collect();
    for chunk in &chunks {
        chunk.to_data().validate_full().map_err(|e| {
            fail(ReadProblem::Corrupt {
                detail: e.to_string(),
            })
        })?;
    }
    let column = Column {
        schema: schema.clone(),
        field,
        chunks,
        guards: Vec::new(), // a table in memory: nothing mapped to change under it
    };
    if column.rows() == 0 {
        return Err(fail(ReadProblem::Empty));
    }
    Ok(column)
}

/// The length of every row of the in-memory table, from column `name` (an integer column, or a
/// list column whose offsets give the lengths); with `rows`, the lengths of those table rows.
pub fn table_lengths(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    name: &str,
    rows: Option<&[u64]>,
) -> Result<Vec<u32>> {
    let column = table_column(schema, batches, name, accept_lengths)?;
    let mut lengths = crate::memory::vec_with_capacity("reading a column", column.rows())?;
    append_lengths(name, &column.chunks, &mut lengths)
        .map_err(|problem| read_failure(Path::new(IN_MEMORY), problem))?;
    map_rows(lengths, rows)
}

impl TokenStore {
    /// The store over column `name` of record batches already in memory (a pyarrow table handed
    /// over through the Arrow C data interface): the same rules and messages as [`TokenStore::open`],
    /// with the table named "the in-memory table". The store shares the batches' buffers.
    pub fn from_table(
        schema: &SchemaRef,
        batches: &[RecordBatch],
        name: &str,
        rows: Option<Vec<u64>>,
    ) -> Result<Self> {
        Self::from_table_as(schema, batches, name, rows, accept_tokens, "token")
    }

    /// The loss-mask column `name` of a table, with the mask's type rule (as [`TokenStore::open_mask`]),
    /// so a table in memory and the same table in a file read the same.
    pub fn mask_from_table(
        schema: &SchemaRef,
        batches: &[RecordBatch],
        name: &str,
        rows: Option<Vec<u64>>,
    ) -> Result<Self> {
        Self::from_table_as(schema, batches, name, rows, accept_mask, "loss-mask value")
    }

    fn from_table_as(
        schema: &SchemaRef,
        batches: &[RecordBatch],
        name: &str,
        rows: Option<Vec<u64>>,
        accept: fn(&Field) -> std::result::Result<(), ReadProblem>,
        what: &'static str,
    ) -> Result<Self> {
        let column = table_column(schema, batches, name, accept)?;
        crate::memory::reserve(
            "reading a column",
            column.rows() as u64 * READ_BYTES_PER_ROW,
        )?;
        let mut store = Self::empty_of(what);
        store
            .add(name, &column)
            .map_err(|problem| read_failure(Path::new(IN_MEMORY), problem))?;
        store.map(rows)
    }

    /// The store over rows given as one flat token buffer and the `rows + 1` offsets that delimit
    /// them (what a `collate_fn` holds after a DataLoader fetched a batch), as a one-column table
    /// named `input_ids`.
    pub fn from_rows(tokens: Gathered, offsets: Vec<i64>) -> Result<Self> {
        let values = tokens.into_array();
        let fail =
            |detail: String| read_failure(Path::new(IN_MEMORY), ReadProblem::Corrupt { detail });
        let rising = offsets.first() == Some(&0) && offsets.windows(2).all(|w| w[0] <= w[1]);
        if !rising || offsets.last().copied() != i64::try_from(values.len()).ok() {
            return Err(fail(format!(
                "offsets must rise from 0 to the {} tokens",
                values.len()
            )));
        }
        let item = Arc::new(Field::new("item", values.data_type().clone(), false));
        let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
        let list = LargeListArray::try_new(item, offsets, values, None)
            .map_err(|e| fail(e.to_string()))?;
        let batch = RecordBatch::try_from_iter([("input_ids", Arc::new(list) as ArrayRef)])
            .map_err(|e| fail(e.to_string()))?;
        Self::from_table(&batch.schema(), &[batch], "input_ids", None)
    }
}

#[cfg(test)]
mod tests {
    use arrow_array::{Int64Array, ListArray};
    use arrow_schema::DataType;

    use super::*;
    use crate::error::ErrorKind;

    fn lists(rows: &[&[i32]]) -> ArrayRef {
        let values: Vec<i32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        let offsets = OffsetBuffer::from_lengths(rows.iter().map(|r| r.len()));
        let item = Arc::new(Field::new("item", DataType::Int32, true));
        Arc::new(ListArray::new(
            item,
            offsets,
            Arc::new(arrow_array::Int32Array::from(values)),
            None,
        ))
    }

    fn table(columns: Vec<(&str, ArrayRef)>) -> (SchemaRef, Vec<RecordBatch>) {
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let middle = batch.slice(batch.num_rows() / 2, 1);
        (batch.schema(), vec![batch, middle])
    }

    #[test]
    fn lengths_come_from_list_offsets_and_integer_columns() {
        let (schema, batches) = table(vec![
            ("input_ids", lists(&[&[1, 2, 3], &[4], &[]])),
            (
                "seq_len",
                Arc::new(Int64Array::from(vec![3, 1, 0])) as ArrayRef,
            ),
        ]);
        let ids = table_lengths(&schema, &batches, "input_ids", None).unwrap();
        assert_eq!(ids, [3, 1, 0, 1]);
        let ints = table_lengths(&schema, &batches, "seq_len", Some(&[3, 0])).unwrap();
        assert_eq!(ints, [1, 3]);
    }

    #[test]
    fn a_missing_column_names_the_table_and_the_list_column() {
        let (schema, batches) = table(vec![("input_ids", lists(&[&[1]]))]);
        let err = table_lengths(&schema, &batches, "seq_len", None).unwrap_err();
        let message = err.to_string();
        assert!(message.starts_with("the in-memory table has no column \"seq_len\""));
        assert!(message.contains("pass column=\"input_ids\""), "{message}");
    }

    #[test]
    fn an_empty_table_is_refused() {
        let (schema, _) = table(vec![("input_ids", lists(&[&[1]]))]);
        let err = table_lengths(&schema, &[], "input_ids", None).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Read { .. }));
        assert!(err.to_string().contains("holds no rows"));
    }

    #[test]
    fn a_mapping_past_the_rows_is_an_index_error() {
        let (schema, batches) = table(vec![("input_ids", lists(&[&[1]]))]);
        let err = table_lengths(&schema, &batches, "input_ids", Some(&[5])).unwrap_err();
        assert!(matches!(
            err.kind(),
            ErrorKind::RowOutOfRange { row: 5, rows: 2 }
        ));
    }

    #[test]
    fn a_store_over_the_table_reads_sliced_batches_through_their_offsets() {
        let (schema, batches) = table(vec![("input_ids", lists(&[&[1, 2, 3], &[4], &[]]))]);
        let store = crate::read::tokens::TokenStore::from_table(
            &schema,
            &batches,
            "input_ids",
            Some(vec![3, 0]),
        )
        .unwrap();
        assert_eq!(store.lengths(), [1, 3]);
        assert_eq!(
            store.get(0).unwrap(),
            crate::read::tokens::Tokens::I32(&[4])
        );
        assert_eq!(
            store.get(1).unwrap(),
            crate::read::tokens::Tokens::I32(&[1, 2, 3])
        );
        let err = crate::read::tokens::TokenStore::from_table(&schema, &batches, "seq_len", None)
            .unwrap_err();
        assert!(err.to_string().starts_with(IN_MEMORY), "{err}");
    }

    #[test]
    fn rows_given_flat_become_a_store_and_bad_offsets_an_error() {
        let store = TokenStore::from_rows(Gathered::U32(vec![7, 8, 9]), vec![0, 2, 2, 3]).unwrap();
        assert_eq!(store.lengths(), [2, 0, 1]);
        assert_eq!(
            store.get(2).unwrap(),
            crate::read::tokens::Tokens::U32(&[9])
        );
        for offsets in [vec![0, 2, 1, 3], vec![1, 3], vec![0, 4], vec![]] {
            let err = TokenStore::from_rows(Gathered::U32(vec![7, 8, 9]), offsets).unwrap_err();
            assert!(err.to_string().contains("offsets must rise"), "{err}");
        }
    }
}

//! What a column means: per-row lengths from an integer column or from a list column's offsets, and
//! the type rules for each use.
//!
//! Lengths from a list column come from its offsets alone (`offsets[i + 1] - offsets[i]`): the token
//! values are never read, so a 8 GB token column yields its lengths from ~4 MB of offsets.

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef, ArrowPrimitiveType, OffsetSizeTrait};
use arrow_schema::{DataType, Field};

use crate::error::read::ReadProblem;

/// Whether `data_type` is a list (or large list) of numbers: a token column (Megatron defines float
/// token dtypes too).
pub fn list_of_numbers(data_type: &DataType) -> bool {
    match data_type {
        DataType::List(item) | DataType::LargeList(item) => {
            item.data_type().is_integer() || item.data_type().is_floating()
        }
        _ => false,
    }
}

/// An Arrow type as Python users read it (pyarrow spells types in lowercase: `int64`, `list<...>`).
pub fn type_name(data_type: &DataType) -> String {
    data_type.to_string().to_lowercase()
}

/// The type rule for a lengths column: an integer column, or a list of integers.
pub fn accept_lengths(field: &Field) -> Result<(), ReadProblem> {
    let data_type = field.data_type();
    if data_type.is_integer() || list_of_numbers(data_type) {
        return Ok(());
    }
    Err(ReadProblem::ColumnType {
        column: field.name().clone(),
        found: type_name(data_type),
        expected: "an integer column (lengths) or a list of integers (lengths from its offsets)",
    })
}

/// Appends the length of every row of `chunks` (column `name`) to `out`. `first_row` is the file row
/// of the first chunk's first row, for messages.
pub fn append_lengths(
    name: &str,
    chunks: &[ArrayRef],
    out: &mut Vec<u32>,
) -> Result<(), ReadProblem> {
    let mut row = 0u64;
    for chunk in chunks {
        if let Some(null) = first_null(chunk.as_ref()) {
            return Err(ReadProblem::Null {
                column: name.to_owned(),
                row: row + null as u64,
            });
        }
        let values = Values {
            name,
            row,
            out: &mut *out,
        };
        match chunk.data_type() {
            DataType::List(_) => values.push_offsets(chunk.as_list::<i32>().value_offsets()),
            DataType::LargeList(_) => values.push_offsets(chunk.as_list::<i64>().value_offsets()),
            DataType::Int8 => values.push_ints::<Int8Type>(chunk),
            DataType::Int16 => values.push_ints::<Int16Type>(chunk),
            DataType::Int32 => values.push_ints::<Int32Type>(chunk),
            DataType::Int64 => values.push_ints::<Int64Type>(chunk),
            DataType::UInt8 => values.push_ints::<UInt8Type>(chunk),
            DataType::UInt16 => values.push_ints::<UInt16Type>(chunk),
            DataType::UInt32 => values.push_ints::<UInt32Type>(chunk),
            DataType::UInt64 => values.push_ints::<UInt64Type>(chunk),
            other => Err(ReadProblem::ColumnType {
                column: name.to_owned(),
                found: type_name(other),
                expected: "an integer column or a list of integers",
            }),
        }?;
        row += chunk.len() as u64;
    }
    Ok(())
}

/// Position of the first null of `array`, if any.
pub fn first_null(array: &dyn Array) -> Option<usize> {
    let nulls = array.logical_nulls()?;
    if nulls.null_count() == 0 {
        return None;
    }
    nulls.iter().position(|valid| !valid)
}

/// The destination of one chunk's lengths, with what messages need.
struct Values<'a> {
    name: &'a str,
    row: u64,
    out: &'a mut Vec<u32>,
}

impl Values<'_> {
    fn push_ints<T: ArrowPrimitiveType>(self, chunk: &ArrayRef) -> Result<(), ReadProblem>
    where
        T::Native: TryInto<u32> + Into<i128>,
    {
        let values = chunk.as_primitive::<T>().values();
        self.out.reserve(values.len());
        for (i, &v) in values.iter().enumerate() {
            match v.try_into() {
                Ok(length) => self.out.push(length),
                Err(_) => return Err(self.out_of_range(i as u64, v.into())),
            }
        }
        Ok(())
    }

    fn push_offsets<O: OffsetSizeTrait>(self, offsets: &[O]) -> Result<(), ReadProblem> {
        self.out.reserve(offsets.len().saturating_sub(1));
        for (i, w) in offsets.windows(2).enumerate() {
            let length = w[1].as_usize() - w[0].as_usize(); // offsets are validated monotonic
            match u32::try_from(length) {
                Ok(length) => self.out.push(length),
                Err(_) => return Err(self.out_of_range(i as u64, length as i128)),
            }
        }
        Ok(())
    }

    fn out_of_range(&self, i: u64, value: i128) -> ReadProblem {
        let (column, row) = (self.name.to_owned(), self.row + i);
        match i64::try_from(value) {
            Ok(value) if value < 0 => ReadProblem::Negative { column, row, value },
            _ => ReadProblem::TooLarge {
                column,
                row,
                value: u64::try_from(value).unwrap_or(u64::MAX),
            },
        }
    }
}

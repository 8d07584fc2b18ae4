//! The typed values of a token column: which Arrow item types a token (or loss-mask) column may hold,
//! and their buffers — one list of types (`token_types!`) from which the enums over them and every match
//! on them are generated. A row's values are a slice of the mapped file in its stored type; a mask's
//! bools are the one exception, made into 0/1 bytes when the column is read (`tokens.rs`).

use std::ops::Range;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt8Type,
};
use arrow_array::{ArrayRef, ArrowPrimitiveType, PrimitiveArray};
use arrow_buffer::{ArrowNativeType, ScalarBuffer};
use arrow_schema::{DataType, Field};

use crate::error::read::ReadProblem;
use crate::error::Result;
use crate::memory;
/// A row's record batch and value range.
pub(crate) type Located = (usize, Range<usize>);

/// Calls `$m!` with every stored token type as `Variant rust_type ArrowType "numpy name"`: the
/// integer widths Arrow lists and Megatron indexed datasets hold, and Megatron's two float codes.
/// The enums below and every match over them are generated from this one list.
#[macro_export]
macro_rules! token_types {
    ($m:ident) => {
        $crate::token_types! { [$m] }
    };
    // A macro by path (`[$crate::each_token]`) and leading arguments for it, before a `;`.
    ([$($m:tt)*] $(, $($prefix:tt)*)?) => {
        $($m)*! {
            $($($prefix)*;)?
            I32 i32 Int32Type "int32",
            I64 i64 Int64Type "int64",
            U32 u32 UInt32Type "uint32",
            U16 u16 UInt16Type "uint16",
            I16 i16 Int16Type "int16",
            U8 u8 UInt8Type "uint8",
            I8 i8 Int8Type "int8",
            F32 f32 Float32Type "float32",
            F64 f64 Float64Type "float64"
        }
    };
}

/// `match $value { Enum::V($t) => $body, ... }` over every token type, for an enum of this module
/// (`Tokens`, `Gathered`) named in scope as `$enum`.
#[macro_export]
macro_rules! each_token {
    ($enum:ident, $value:expr, $t:ident => $body:expr) => {
        $crate::token_types!([$crate::each_token], @arms $enum, $value, $t => $body)
    };
    (@arms $enum:ident, $value:expr, $t:ident => $body:expr;
        $($v:ident $ty:ident $arrow:ident $name:literal),*) => {
        match $value {
            $($enum::$v($t) => $body,)*
        }
    };
}

macro_rules! token_enums {
    ($($v:ident $t:ident $arrow:ident $name:literal),*) => {
        /// The token values of every record batch, in their stored type.
        #[derive(Debug, Clone)]
        pub(crate) enum Values {
            $($v(Vec<ScalarBuffer<$t>>),)*
        }

        /// One row's tokens, borrowed from the map.
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub enum Tokens<'a> {
            $(#[doc = concat!("`", $name, "` tokens.")] $v(&'a [$t]),)*
        }

        /// Rows gathered into one flat buffer, in the column's type.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Gathered {
            $(#[doc = concat!("`", $name, "` tokens.")] $v(Vec<$t>),)*
        }

        /// The store's values for an Arrow list's item type (`None`: not a token type).
        pub(crate) fn values_for(item: &DataType) -> Option<Values> {
            $(if *item == <$arrow as ArrowPrimitiveType>::DATA_TYPE {
                return Some(Values::$v(Vec::new()));
            })*
            None
        }

        impl Values {
            pub(crate) fn push(&mut self, values: &ArrayRef) {
                match self {
                    $(Values::$v(v) => v.push(values.as_primitive::<$arrow>().values().clone()),)*
                }
            }

            pub(crate) fn dtype(&self) -> &'static str {
                match self {
                    $(Values::$v(_) => $name,)*
                }
            }

            /// Appends `other`'s record batches; `false` (nothing appended) when its type differs.
            pub(crate) fn extend(&mut self, other: &Values) -> bool {
                match (self, other) {
                    $((Values::$v(mine), Values::$v(theirs)) => {
                        mine.extend(theirs.iter().cloned());
                        true
                    })*
                    #[allow(unreachable_patterns)]
                    _ => false,
                }
            }

            pub(crate) fn tokens(&self, batch: usize, range: Range<usize>) -> Tokens<'_> {
                match self {
                    $(Values::$v(v) => Tokens::$v(&v[batch][range]),)*
                }
            }

            pub(crate) fn concat(&self, located: &[Located]) -> Result<Gathered> {
                Ok(match self {
                    $(Values::$v(v) => Gathered::$v(concat(v, located)?),)*
                })
            }
        }

        impl Gathered {
            /// The tokens as an Arrow array (copied into Arrow's buffer).
            pub fn into_array(self) -> ArrayRef {
                match self {
                    $(Gathered::$v(t) => std::sync::Arc::new(PrimitiveArray::<$arrow>::from(t)),)*
                }
            }
        }
    };
}

token_types!(token_enums);

/// The type rule for a loss-mask column: integers (labels, or a 0/1 mask) or bools (read as 0/1
/// bytes). Floats are refused: a mask of 0.5 says nothing a loss can apply.
pub(crate) fn accept_mask(field: &Field) -> Result<(), ReadProblem> {
    match field.data_type() {
        DataType::List(item) | DataType::LargeList(item)
            if *item.data_type() == DataType::Boolean
                || (values_for(item.data_type()).is_some() && !item.data_type().is_floating()) =>
        {
            Ok(())
        }
        _ => Err(ReadProblem::ColumnType {
            column: field.name().clone(),
            found: crate::read::column::type_name(field.data_type()),
            expected:
                "a list (or large list) of 0/1 values (bools or integers), or of integer labels \
                       (-100 where the loss ignores a position) — a loss mask",
        }),
    }
}

/// The type rule for a token column.
pub(crate) fn accept_tokens(field: &Field) -> Result<(), ReadProblem> {
    match field.data_type() {
        DataType::List(item) | DataType::LargeList(item)
            if values_for(item.data_type()).is_some() =>
        {
            Ok(())
        }
        _ => Err(ReadProblem::ColumnType {
            column: field.name().clone(),
            found: crate::read::column::type_name(field.data_type()),
            expected: "a list (or large list) of token ids (any integer width, or floats holding \
                       whole numbers)",
        }),
    }
}

fn concat<T: ArrowNativeType>(
    values: &[ScalarBuffer<T>],
    located: &[(usize, Range<usize>)],
) -> Result<Vec<T>> {
    let total = located.iter().map(|(_, r)| r.len()).sum();
    let mut out = memory::vec_with_capacity("gathering rows' tokens", total)?;
    for (batch, range) in located {
        out.extend_from_slice(&values[*batch][range.clone()]);
    }
    Ok(out)
}

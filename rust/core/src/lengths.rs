//! Checked conversion of caller-supplied integer lengths (any width, signed or not) to `u32`.
//!
//! Bindings receive lengths as numpy or Arrow arrays of whatever integer type the dataset used. This
//! converts them in one pass, naming the first bad row, instead of a silent `as` cast that would turn
//! `-1` into 4294967295 tokens.

use crate::error::{ErrorKind, Result};

/// Appends `values` to `out` as `u32`; `first_row` is the row number of `values[0]` (for messages).
pub fn extend_checked<T: Copy + Into<i128>>(
    values: &[T],
    first_row: usize,
    out: &mut Vec<u32>,
) -> Result<()> {
    out.reserve(values.len());
    for (i, &v) in values.iter().enumerate() {
        let value: i128 = v.into();
        match u32::try_from(value) {
            Ok(l) if l > 0 => out.push(l),
            Ok(_) | Err(_) if value <= 0 => {
                return Err(ErrorKind::NonPositiveLength {
                    row: first_row + i,
                    value,
                }
                .into())
            }
            _ => {
                return Err(ErrorKind::LengthTooLarge {
                    row: first_row + i,
                    value,
                }
                .into())
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_and_names_bad_rows() {
        let mut out = vec![7];
        extend_checked(&[1i64, 2, 3], 1, &mut out).unwrap();
        assert_eq!(out, [7, 1, 2, 3]);
        let err = extend_checked(&[4i8, -1], 10, &mut out).unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::NonPositiveLength { row: 11, value: -1 }
        );
        let err = extend_checked(&[0u16], 0, &mut out).unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::NonPositiveLength { row: 0, value: 0 }
        );
        let err = extend_checked(&[1u64 << 40], 5, &mut out).unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::LengthTooLarge {
                row: 5,
                value: 1 << 40
            }
        );
    }
}

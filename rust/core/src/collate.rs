//! Padded collation: one batch's rows written into caller-provided buffers.
//!
//! For rows `r` of a batch and `L` = longest row rounded up to `pad_to_multiple_of`, four `[rows, L]`
//! row-major arrays are written (right padding):
//!
//! | array            | real token `j` of row `r` | padding            |
//! |------------------|---------------------------|--------------------|
//! | `input_ids`      | the token                 | `pad_id`           |
//! | `attention_mask` | 1                         | 0                  |
//! | `labels`         | the token                 | `label_pad_id`     |
//! | `position_ids`   | `j`                       | 0                  |
//!
//! Buffers belong to the caller (pinned host memory reused batch after batch), so nothing is
//! allocated per batch; they only need to hold `rows × L` elements. Work is split by rows over the
//! caller's pool when a batch is large enough to pay for it. Tokens are converted to the output type:
//! into `int64` always exactly; into `int32` with a check, since a `uint32` or `int64` id may not fit.

use rayon::prelude::*;

use crate::error::{ErrorKind, Result};
use crate::tokens::{Located, TokenStore, Tokens};

/// Elements (`rows × L`) from which a batch is split over the pool: below, the split costs more
/// than the copying it shares.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 15;

/// Padding values and the length multiple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Padding {
    /// Written into `input_ids` past each row's end.
    pub pad_id: i64,
    /// Written into `labels` past each row's end (-100 is ignored by torch's cross-entropy).
    pub label_pad_id: i64,
    /// `L` is the longest row rounded up to a multiple of this (≥ 1).
    pub pad_to_multiple_of: u32,
}

impl Default for Padding {
    fn default() -> Self {
        Self {
            pad_id: 0,
            label_pad_id: -100,
            pad_to_multiple_of: 1,
        }
    }
}

/// An output element type: `i32` or `i64`.
pub trait OutputToken: Copy + Send + Sync + TryFrom<i64> + From<i32> + 'static {
    /// The numpy name, for messages.
    const NAME: &'static str;
}

impl OutputToken for i32 {
    const NAME: &'static str = "int32";
}

impl OutputToken for i64 {
    const NAME: &'static str = "int64";
}

/// The four output arrays, each at least `rows × L` long (row-major, row stride `L`).
#[derive(Debug)]
pub struct Buffers<'a, T> {
    /// Token ids, padded with `pad_id`.
    pub input_ids: &'a mut [T],
    /// 1 on real tokens, 0 on padding.
    pub attention_mask: &'a mut [T],
    /// Token ids, padded with `label_pad_id`.
    pub labels: &'a mut [T],
    /// Position of each token in its row, 0 on padding.
    pub position_ids: &'a mut [T],
}

/// `(rows, L)` of the padded batch `indices` (negative counts from the end).
pub fn padded_shape<I: Copy + Into<i128>>(
    store: &TokenStore,
    indices: &[I],
    pad_to_multiple_of: u32,
) -> Result<(usize, usize)> {
    let located = store.locate_all(indices)?;
    Ok((located.len(), padded_length(&located, pad_to_multiple_of)?))
}

fn padded_length(located: &[Located], pad_to_multiple_of: u32) -> Result<usize> {
    if pad_to_multiple_of == 0 {
        return Err(ErrorKind::InvalidSetting {
            name: "pad_to_multiple_of",
            value: 0,
            expected: "≥ 1",
        }
        .into());
    }
    let longest = located.iter().map(|(_, r)| r.len()).max().unwrap_or(0);
    Ok(longest.div_ceil(pad_to_multiple_of as usize) * pad_to_multiple_of as usize)
}

/// Writes the padded batch `indices` of `store` into `out`; returns `(rows, L)`.
pub fn collate_padded<T: OutputToken, I: Copy + Into<i128>>(
    store: &TokenStore,
    indices: &[I],
    padding: &Padding,
    out: Buffers<'_, T>,
    pool: Option<&rayon::ThreadPool>,
) -> Result<(usize, usize)> {
    let located = store.locate_all(indices)?;
    let (rows, width) = (
        located.len(),
        padded_length(&located, padding.pad_to_multiple_of)?,
    );
    let needed = rows * width;
    for (name, got) in [
        ("input_ids", out.input_ids.len()),
        ("attention_mask", out.attention_mask.len()),
        ("labels", out.labels.len()),
        ("position_ids", out.position_ids.len()),
    ] {
        if got < needed {
            return Err(ErrorKind::BufferTooSmall { name, needed, got }.into());
        }
    }
    let fill = Fill {
        pad_id: output_value::<T>("pad_id", padding.pad_id)?,
        label_pad_id: output_value::<T>("label_pad_id", padding.label_pad_id)?,
    };
    if width == 0 {
        return Ok((rows, 0));
    }
    let rows_out = out.input_ids[..needed]
        .chunks_mut(width)
        .zip(out.attention_mask[..needed].chunks_mut(width))
        .zip(out.labels[..needed].chunks_mut(width))
        .zip(out.position_ids[..needed].chunks_mut(width))
        .zip(&located);
    let write = |((((ids, mask), labels), positions), at): RowOut<'_, T>| {
        fill.row(store.tokens_at(at), ids, mask, labels, positions)
    };
    match pool {
        Some(pool) if needed >= PARALLEL_MIN_ELEMENTS => {
            let rows_out: Vec<_> = rows_out.collect();
            pool.install(|| rows_out.into_par_iter().try_for_each(write))?;
        }
        _ => rows_out.into_iter().try_for_each(write)?,
    }
    Ok((rows, width))
}

type RowOut<'a, T> = (
    (((&'a mut [T], &'a mut [T]), &'a mut [T]), &'a mut [T]),
    &'a Located,
);

/// `value` as an output element, or an error naming the setting.
fn output_value<T: OutputToken>(name: &'static str, value: i64) -> Result<T> {
    T::try_from(value).map_err(|_| {
        ErrorKind::InvalidSetting {
            name,
            value: i128::from(value),
            expected: "representable in the output dtype (int32 holds -2^31..2^31-1)",
        }
        .into()
    })
}

/// The padding values, converted once per batch.
#[derive(Debug, Clone, Copy)]
struct Fill<T> {
    pad_id: T,
    label_pad_id: T,
}

impl<T: OutputToken> Fill<T> {
    fn row(
        &self,
        tokens: Tokens<'_>,
        ids: &mut [T],
        mask: &mut [T],
        labels: &mut [T],
        positions: &mut [T],
    ) -> Result<()> {
        let len = match tokens {
            Tokens::I32(t) => convert(t, ids)?,
            Tokens::I64(t) => convert(t, ids)?,
            Tokens::U32(t) => convert(t, ids)?,
        };
        let (real, pad) = labels.split_at_mut(len);
        real.copy_from_slice(&ids[..len]);
        pad.fill(self.label_pad_id);
        ids[len..].fill(self.pad_id);
        mask[..len].fill(T::from(1));
        mask[len..].fill(T::from(0));
        for (j, p) in positions[..len].iter_mut().enumerate() {
            // Rows are shorter than 2^31 tokens: arrow offsets of a row fit in i32 for lists, and a
            // large-list row that long could not be padded into memory anyway.
            #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
            let j = j as i32;
            *p = T::from(j);
        }
        positions[len..].fill(T::from(0));
        Ok(())
    }
}

/// Converts `tokens` into the front of `out`; returns how many were written.
fn convert<S: Copy + Into<i64>, T: OutputToken>(tokens: &[S], out: &mut [T]) -> Result<usize> {
    for (o, &t) in out.iter_mut().zip(tokens) {
        let value: i64 = t.into();
        *o = T::try_from(value).map_err(|_| ErrorKind::TokenOutOfRange {
            value,
            dtype: T::NAME,
        })?;
    }
    Ok(tokens.len())
}

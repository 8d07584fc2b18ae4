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
//! With a loss mask on the store, masked positions' labels are `label_pad_id` too (`read/mask.rs`).
//!
//! Buffers belong to the caller (pinned host memory reused batch after batch), so nothing is
//! allocated per batch; they only need to hold `rows × L` elements. Work is split by rows over the
//! caller's pool when a batch is large enough to pay for it. Tokens are converted to the output type:
//! into `int64` always exactly; into `int32` with a check, since a `uint32` or `int64` id may not fit.

mod convert;
mod masked;
pub mod packed;

pub use convert::Convert;

use std::cell::RefCell;

use rayon::prelude::*;

use crate::error::{ErrorKind, Result};
use crate::pool::PrivatePool;
use crate::read::tokens::{Located, Mask, TokenStore, Tokens};

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

/// An output element type: `i32` or `i64`, convertible from every stored token type.
pub trait OutputToken:
    Copy
    + Send
    + Sync
    + TryFrom<i64>
    + From<i32>
    + Convert<i32>
    + Convert<i64>
    + Convert<u32>
    + Convert<u16>
    + Convert<i16>
    + Convert<u8>
    + Convert<i8>
    + Convert<f32>
    + Convert<f64>
    + 'static
{
    /// The numpy name, for messages.
    const NAME: &'static str;

    /// Writes `0, 1, …` over `out` by copying from this thread's cached `0..n` (a copy runs at memory
    /// speed; an element-by-element counter did not vectorize and cost a quarter of the batch,
    /// measured).
    fn write_positions(out: &mut [Self]);
}

thread_local! {
    static POSITIONS_I32: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
    static POSITIONS_I64: RefCell<Vec<i64>> = const { RefCell::new(Vec::new()) };
}

/// Copies `0..out.len()` from `cache`, growing it first if needed. Rows are shorter than 2^31
/// tokens (a list row's offsets are i32; a large-list row that long could not be padded in memory).
fn copy_positions<T: Copy + From<i32>>(cache: &RefCell<Vec<T>>, out: &mut [T]) {
    let mut cache = cache.borrow_mut();
    if cache.len() < out.len() {
        let start = i32::try_from(cache.len()).unwrap_or(i32::MAX);
        let end = i32::try_from(out.len()).unwrap_or(i32::MAX);
        cache.extend((start..end).map(T::from));
    }
    let n = out.len().min(cache.len());
    out[..n].copy_from_slice(&cache[..n]);
}

impl OutputToken for i32 {
    const NAME: &'static str = "int32";

    fn write_positions(out: &mut [Self]) {
        POSITIONS_I32.with(|cache| copy_positions(cache, out));
    }
}

impl OutputToken for i64 {
    const NAME: &'static str = "int64";

    fn write_positions(out: &mut [Self]) {
        POSITIONS_I64.with(|cache| copy_positions(cache, out));
    }
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
    let (located, width) = located_width(store, indices, pad_to_multiple_of)?;
    Ok((located.len(), width))
}

/// Where the rows of `indices` are, and their padded length `L`.
fn located_width<I: Copy + Into<i128>>(
    store: &TokenStore,
    indices: &[I],
    pad_to_multiple_of: u32,
) -> Result<(Vec<Located>, usize)> {
    let located = store.locate_all(indices)?;
    let width = padded_length(&located, pad_to_multiple_of)?;
    Ok((located, width))
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
    pool: Option<&PrivatePool>,
) -> Result<(usize, usize)> {
    let (located, width) = located_width(store, indices, padding.pad_to_multiple_of)?;
    let rows = located.len();
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
    write_rows(store, (indices, &located), width, padding, out, pool)?;
    Ok((rows, width))
}

/// [`collate_padded`] into one block: for `n = rows × L`, `input_ids` are its elements `[0, n)`,
/// `attention_mask` `[n, 2n)`, `labels` `[2n, 3n)` and `position_ids` `[3n, 4n)`. The four arrays of
/// a batch are then one contiguous run of memory, which goes to a GPU in a single copy (the Loader's
/// slots). The block must hold at least `4n` elements.
pub fn collate_padded_block<T: OutputToken, I: Copy + Into<i128>>(
    store: &TokenStore,
    indices: &[I],
    padding: &Padding,
    block: &mut [T],
    pool: Option<&PrivatePool>,
) -> Result<(usize, usize)> {
    let (located, width) = located_width(store, indices, padding.pad_to_multiple_of)?;
    let rows = located.len();
    let n = rows * width;
    let got = block.len();
    let needed =
        n.checked_mul(4)
            .filter(|&needed| needed <= got)
            .ok_or(ErrorKind::BufferTooSmall {
                name: "slot",
                needed: n.saturating_mul(4),
                got,
            })?;
    let (input_ids, rest) = block[..needed].split_at_mut(n);
    let (attention_mask, rest) = rest.split_at_mut(n);
    let (labels, position_ids) = rest.split_at_mut(n);
    let out = Buffers {
        input_ids,
        attention_mask,
        labels,
        position_ids,
    };
    write_rows(store, (indices, &located), width, padding, out, pool)?;
    Ok((rows, width))
}

/// Writes the rows `indices`, found at `located`, `width` long, into the fronts of `out` (checked to be
/// long enough); with the store's mask, masked positions get `label_pad_id`.
fn write_rows<T: OutputToken, I: Copy + Into<i128>>(
    store: &TokenStore,
    (indices, located): (&[I], &[Located]),
    width: usize,
    padding: &Padding,
    out: Buffers<'_, T>,
    pool: Option<&PrivatePool>,
) -> Result<()> {
    let fill = Fill {
        pad_id: output_value::<T>("pad_id", padding.pad_id)?,
        label_pad_id: output_value::<T>("label_pad_id", padding.label_pad_id)?,
    };
    if width == 0 {
        return Ok(());
    }
    let needed = located.len() * width;
    let rows_out = out.input_ids[..needed]
        .chunks_mut(width)
        .zip(out.attention_mask[..needed].chunks_mut(width))
        .zip(out.labels[..needed].chunks_mut(width))
        .zip(out.position_ids[..needed].chunks_mut(width))
        .zip(located)
        .enumerate();
    let masks = store.locate_masks(indices)?;
    let loss_mask = store.mask().zip(masks.as_ref());
    let write = |(row, ((((ids, mask), labels), positions), at)): RowOut<'_, T>| {
        let loss = loss_mask.map(|(m, (rows, places))| (m, rows[row], m.at(&places[row])));
        fill.row(store.tokens_at(at), loss, ids, mask, labels, positions)
    };
    // The pool is only looked up (a lock) for batches worth splitting.
    match pool
        .filter(|_| needed >= PARALLEL_MIN_ELEMENTS)
        .and_then(PrivatePool::get)
    {
        Some(pool) => {
            let rows_out: Vec<_> = rows_out.collect();
            pool.install(|| rows_out.into_par_iter().try_for_each(write))
        }
        _ => rows_out.into_iter().try_for_each(write),
    }
}

type RowOut<'a, T> = (
    usize,
    (
        (((&'a mut [T], &'a mut [T]), &'a mut [T]), &'a mut [T]),
        &'a Located,
    ),
);

/// `value` as an output element, or an error naming the setting.
pub(crate) fn output_value<T: OutputToken>(name: &'static str, value: i64) -> Result<T> {
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
    /// One row: every write is a copy or a fill, so the row moves at memory speed.
    fn row(
        &self,
        tokens: Tokens<'_>,
        loss: Option<(&Mask, usize, Tokens<'_>)>,
        ids: &mut [T],
        mask: &mut [T],
        labels: &mut [T],
        positions: &mut [T],
    ) -> Result<()> {
        let len = crate::each_token!(Tokens, tokens, t => T::convert(t, ids).map(|()| t.len())?);
        ids[len..].fill(self.pad_id);
        match loss {
            None => labels[..len].copy_from_slice(&ids[..len]),
            Some((m, row, values)) => m.label(
                (row, 0),
                values,
                &ids[..len],
                &mut labels[..len],
                self.label_pad_id,
            )?,
        }
        labels[len..].fill(self.label_pad_id);
        mask[..len].fill(T::from(1));
        mask[len..].fill(T::from(0));
        T::write_positions(&mut positions[..len]);
        positions[len..].fill(T::from(0));
        Ok(())
    }
}

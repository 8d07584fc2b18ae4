//! The packed-row binding: `collate_packed_slot` writes one packed batch into a Loader slot.

use dflash_batch_core::collate::packed::{collate_packed_windows, Packed, PackedBuffers, Windows};
use dflash_batch_core::collate::{OutputToken, Padding};
use dflash_batch_core::Result as CoreResult;
use numpy::{Element, PyReadonlyArray1, PyReadwriteArrayDyn};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use super::{slot_rows, wrong_slot_dtype};
use crate::errors::to_py;
use crate::reading::TokenStore;

/// Writes the packed batch `indices` into one row of `slot` — a C-contiguous `[4, capacity]` int64 or
/// int32 array whose rows become `input_ids`, `labels`, `position_ids`, `seq_idx` — and its
/// `cu_seqlens` into the int32 array `cu_seqlens` (at least `samples + 1` long); returns
/// `(samples, real tokens, max_seqlen)`. Runs without the GIL.
///
/// `starts` and `lengths` (uint32, one per index, or both `None`) make entry `s` the token window
/// `starts[s] .. starts[s] + lengths[s]` of its sample: the pieces of `oversize="truncate"`.
/// `piece_multiple` > 1 pads every entry to a multiple of it (context parallelism; `cu_seqlens`
/// then sums the real lengths, see `collate/packed.rs`).
#[pyfunction]
#[pyo3(signature = (store, indices, slot, cu_seqlens, pad_id, label_pad_id, starts=None, lengths=None, piece_multiple=1))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn collate_packed_slot(
    py: Python<'_>,
    store: &TokenStore,
    indices: &Bound<'_, PyAny>,
    slot: &Bound<'_, PyAny>,
    cu_seqlens: &Bound<'_, PyAny>,
    pad_id: i64,
    label_pad_id: i64,
    starts: Option<PyReadonlyArray1<'_, u32>>,
    lengths: Option<PyReadonlyArray1<'_, u32>>,
    piece_multiple: u32,
) -> PyResult<(usize, usize, usize)> {
    let windows = match (&starts, &lengths) {
        (Some(s), Some(l)) => Some(Windows {
            starts: s
                .as_slice()
                .map_err(|_| PyValueError::new_err("starts must be contiguous"))?,
            lengths: l
                .as_slice()
                .map_err(|_| PyValueError::new_err("lengths must be contiguous"))?,
        }),
        (None, None) => None,
        _ => {
            return Err(PyValueError::new_err(
                "pass both starts and lengths (sampler.pieces(batch)), or neither",
            ))
        }
    };
    if piece_multiple == 0 {
        return Err(PyValueError::new_err(
            "piece_multiple must be ≥ 1 (sampler.schedule.config.piece_multiple)",
        ));
    }
    let padding = Padding {
        pad_id,
        label_pad_id,
        pad_to_multiple_of: piece_multiple,
    };
    let mut cu = cu_seqlens
        .extract::<PyReadwriteArrayDyn<'_, i32>>()
        .map_err(|_| PyTypeError::new_err("cu_seqlens must be a writeable int32 numpy array"))?;
    let cu = cu
        .as_slice_mut()
        .map_err(|_| PyValueError::new_err("cu_seqlens must be contiguous"))?;
    if let Some(got) = packed_slot_typed::<i64>(py, store, indices, windows, slot, cu, &padding)? {
        return got.map_err(to_py);
    }
    if let Some(got) = packed_slot_typed::<i32>(py, store, indices, windows, slot, cu, &padding)? {
        return got.map_err(to_py);
    }
    Err(wrong_slot_dtype())
}

fn packed_slot_typed<T: OutputToken + Element>(
    py: Python<'_>,
    store: &TokenStore,
    indices: &Bound<'_, PyAny>,
    windows: Option<Windows<'_>>,
    slot: &Bound<'_, PyAny>,
    cu_seqlens: &mut [i32],
    padding: &Padding,
) -> PyResult<Option<CoreResult<(usize, usize, usize)>>> {
    let Ok(mut array) = slot.extract::<PyReadwriteArrayDyn<'_, T>>() else {
        return Ok(None);
    };
    let [ids, labels, positions, seq_idx] = slot_rows(&mut array)?;
    let capacity = ids.len();
    let out = PackedBuffers {
        input_ids: ids,
        labels,
        position_ids: positions,
        cu_seqlens,
        seq_idx: Some(seq_idx),
    };
    let got = packed_any(py, store, indices, windows, capacity, padding, out)?;
    Ok(Some(got.map(|p| (p.samples, p.tokens, p.max_seqlen))))
}

/// Runs the core packed collation for indices of any supported dtype (the outer error is a wrong
/// dtype).
fn packed_any<T: OutputToken>(
    py: Python<'_>,
    store: &TokenStore,
    indices: &Bound<'_, PyAny>,
    windows: Option<Windows<'_>>,
    capacity: usize,
    padding: &Padding,
    out: PackedBuffers<'_, T>,
) -> PyResult<CoreResult<Packed>> {
    with_index_slice!(indices, rows => py.detach(|| {
        collate_packed_windows(&store.store, rows, windows, capacity, padding, out)
    }))
}

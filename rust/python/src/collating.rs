//! The collation binding: `collate_into` (caller-provided buffers, as the Loader uses) and
//! `collate_new` (new arrays owned by Rust); packed rows in `packed.rs`.

use dflash_batch_core::collate::{
    collate_padded, collate_padded_block, Buffers, OutputToken, Padding,
};
use dflash_batch_core::Result as CoreResult;
use numpy::{
    Element, PyArray1, PyArrayDyn, PyArrayMethods, PyReadwriteArrayDyn, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyMemoryError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::to_py;
use crate::reading::TokenStore;

pub(crate) mod packed;

const BUFFER_NAMES: [&str; 4] = ["input_ids", "attention_mask", "labels", "position_ids"];

/// Writes the padded batch `indices` into the four buffers (contiguous, writeable numpy arrays of one
/// dtype, int64 or int32, each holding at least rows × L elements); returns `(rows, L)`. Runs without
/// the GIL, splitting large batches over the store's threads.
#[pyfunction]
#[pyo3(signature = (store, indices, input_ids, attention_mask, labels, position_ids, pad_id, label_pad_id, pad_to_multiple_of))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn collate_into(
    py: Python<'_>,
    store: &TokenStore,
    indices: &Bound<'_, PyAny>,
    input_ids: &Bound<'_, PyAny>,
    attention_mask: &Bound<'_, PyAny>,
    labels: &Bound<'_, PyAny>,
    position_ids: &Bound<'_, PyAny>,
    pad_id: i64,
    label_pad_id: i64,
    pad_to_multiple_of: u32,
) -> PyResult<(usize, usize)> {
    let padding = Padding {
        pad_id,
        label_pad_id,
        pad_to_multiple_of,
    };
    let buffers = [input_ids, attention_mask, labels, position_ids];
    if let Some(shape) = into_typed::<i64>(py, store, indices, buffers, &padding)? {
        return shape.map_err(to_py);
    }
    if let Some(shape) = into_typed::<i32>(py, store, indices, buffers, &padding)? {
        return shape.map_err(to_py);
    }
    Err(PyTypeError::new_err(format!(
        "buffer input_ids must be a writeable int64 or int32 numpy array, got {}",
        input_ids
            .getattr("dtype")
            .map_or_else(|_| input_ids.get_type().to_string(), |d| d.to_string())
    )))
}

/// [`collate_into`] for output type `T`; `None` when `input_ids` is not of that dtype.
fn into_typed<T: OutputToken + Element>(
    py: Python<'_>,
    store: &TokenStore,
    indices: &Bound<'_, PyAny>,
    buffers: [&Bound<'_, PyAny>; 4],
    padding: &Padding,
) -> PyResult<Option<CoreResult<(usize, usize)>>> {
    // A type check only: taking a borrow (numpy's borrow table) costs a lock per array.
    if buffers[0].cast::<PyArrayDyn<T>>().is_err() {
        return Ok(None);
    }
    let mut arrays = Vec::with_capacity(4);
    for (name, buffer) in BUFFER_NAMES.iter().zip(buffers) {
        let array = buffer.extract::<PyReadwriteArrayDyn<'_, T>>().map_err(|_| {
            PyTypeError::new_err(format!(
                "buffer {name} must be a writeable {} numpy array like input_ids, and a different array \
                 from the other buffers",
                T::NAME
            ))
        })?;
        arrays.push(array);
    }
    let mut slices = arrays.iter_mut().zip(BUFFER_NAMES).map(|(a, name)| {
        // Memory order must be row order: a Fortran-ordered buffer is contiguous but transposed.
        let c_order = a.is_c_contiguous();
        a.as_slice_mut().ok().filter(|_| c_order).ok_or_else(|| {
            PyValueError::new_err(format!(
                "buffer {name} must be C-contiguous; pass numpy.ascontiguousarray(...) or a fresh buffer"
            ))
        })
    });
    let (Some(ids), Some(mask), Some(labels), Some(positions)) =
        (slices.next(), slices.next(), slices.next(), slices.next())
    else {
        return Err(PyValueError::new_err("four buffers are required"));
    };
    let out = Buffers {
        input_ids: ids?,
        attention_mask: mask?,
        labels: labels?,
        position_ids: positions?,
    };
    collate_any(py, store, indices, padding, out).map(Some)
}

/// [`collate_into`] into one C-contiguous 1-D array, the Loader's slot: for `n = rows × L`, the four
/// arrays are its elements `[0, n)`, `[n, 2n)`, `[2n, 3n)`, `[3n, 4n)` (input_ids, attention_mask,
/// labels, position_ids). One borrow instead of four (a tenth of a 16K-token batch, measured), and a
/// batch is one contiguous run: a single host-to-device copy.
#[pyfunction]
#[pyo3(signature = (store, indices, slot, pad_id, label_pad_id, pad_to_multiple_of))]
pub(crate) fn collate_slot(
    py: Python<'_>,
    store: &TokenStore,
    indices: &Bound<'_, PyAny>,
    slot: &Bound<'_, PyAny>,
    pad_id: i64,
    label_pad_id: i64,
    pad_to_multiple_of: u32,
) -> PyResult<(usize, usize)> {
    let padding = Padding {
        pad_id,
        label_pad_id,
        pad_to_multiple_of,
    };
    if let Some(shape) = slot_typed::<i64>(py, store, indices, slot, &padding)? {
        return shape.map_err(to_py);
    }
    if let Some(shape) = slot_typed::<i32>(py, store, indices, slot, &padding)? {
        return shape.map_err(to_py);
    }
    Err(wrong_slot_dtype())
}

fn slot_typed<T: OutputToken + Element>(
    py: Python<'_>,
    store: &TokenStore,
    indices: &Bound<'_, PyAny>,
    slot: &Bound<'_, PyAny>,
    padding: &Padding,
) -> PyResult<Option<CoreResult<(usize, usize)>>> {
    let Ok(mut array) = slot.extract::<PyReadwriteArrayDyn<'_, T>>() else {
        return Ok(None);
    };
    if array.ndim() != 1 {
        return Err(PyValueError::new_err(format!(
            "slot must be 1-D (4 × capacity elements), got shape {:?}",
            array.shape()
        )));
    }
    let block = array
        .as_slice_mut()
        .map_err(|_| PyValueError::new_err("slot must be C-contiguous"))?;
    block_any(py, store, indices, padding, block).map(Some)
}

/// Runs the core block collation for indices of any supported dtype (the outer error is a wrong dtype).
fn block_any<T: OutputToken>(
    py: Python<'_>,
    store: &TokenStore,
    indices: &Bound<'_, PyAny>,
    padding: &Padding,
    block: &mut [T],
) -> PyResult<CoreResult<(usize, usize)>> {
    with_index_slice!(indices, rows => py.detach(|| {
        collate_padded_block(&store.store, rows, padding, block, Some(&store.pool))
    }))
}

/// The error of a slot that is neither width the collators write (each tries int64, then int32).
pub(crate) fn wrong_slot_dtype() -> PyErr {
    PyTypeError::new_err("slot must be a writeable int64 or int32 numpy array")
}

/// The four rows of a C-contiguous `[4, capacity]` slot as separate slices (one numpy borrow).
pub(crate) fn slot_rows<'a, T: Element>(
    array: &'a mut PyReadwriteArrayDyn<'_, T>,
) -> PyResult<[&'a mut [T]; 4]> {
    let shape = array.shape().to_vec();
    if shape.len() != 2 || shape[0] != 4 {
        return Err(PyValueError::new_err(format!(
            "slot must have shape (4, capacity), got {shape:?}"
        )));
    }
    let c_order = array.is_c_contiguous();
    let flat = array
        .as_slice_mut()
        .ok()
        .filter(|_| c_order)
        .ok_or_else(|| PyValueError::new_err("slot must be C-contiguous"))?;
    let (first, rest) = flat.split_at_mut(shape[1]);
    let (second, rest) = rest.split_at_mut(shape[1]);
    let (third, fourth) = rest.split_at_mut(shape[1]);
    Ok([first, second, third, fourth])
}

/// Runs the core collation for indices of any supported dtype (the outer error is a wrong dtype).
fn collate_any<T: OutputToken>(
    py: Python<'_>,
    store: &TokenStore,
    indices: &Bound<'_, PyAny>,
    padding: &Padding,
    out: Buffers<'_, T>,
) -> PyResult<CoreResult<(usize, usize)>> {
    with_index_slice!(indices, rows => py.detach(|| {
        collate_padded(&store.store, rows, padding, out, Some(&store.pool))
    }))
}

/// The padded batch `indices` in four new 1-D arrays of `dtype` ("int64" or "int32") owned by Rust,
/// and its `(rows, L)`: reshape each to `[rows, L]`.
#[pyfunction]
#[pyo3(signature = (store, indices, pad_id, label_pad_id, pad_to_multiple_of, dtype))]
pub(crate) fn collate_new<'py>(
    py: Python<'py>,
    store: &TokenStore,
    indices: &Bound<'py, PyAny>,
    pad_id: i64,
    label_pad_id: i64,
    pad_to_multiple_of: u32,
    dtype: &str,
) -> PyResult<Bound<'py, PyTuple>> {
    let padding = Padding {
        pad_id,
        label_pad_id,
        pad_to_multiple_of,
    };
    match dtype {
        "int64" => new_typed::<i64>(py, store, indices, &padding),
        "int32" => new_typed::<i32>(py, store, indices, &padding),
        other => Err(PyValueError::new_err(format!(
            "dtype={other:?} is invalid; use 'int64' or 'int32'"
        ))),
    }
}

fn new_typed<'py, T: OutputToken + Element + Default>(
    py: Python<'py>,
    store: &TokenStore,
    indices: &Bound<'py, PyAny>,
    padding: &Padding,
) -> PyResult<Bound<'py, PyTuple>> {
    let shape = shape_any(store, indices, padding.pad_to_multiple_of)?.map_err(to_py)?;
    let too_large = || {
        PyMemoryError::new_err(format!(
            "a batch of {} rows padded to {} tokens does not fit in memory as four {} arrays; lower \
             pad_to_multiple_of or collate fewer rows",
            shape.0,
            shape.1,
            T::NAME
        ))
    };
    let size = shape.0.checked_mul(shape.1).ok_or_else(too_large)?;
    let total = size.checked_mul(4).ok_or_else(too_large)?;
    // More than the machine has is refused up front: where memory is overcommitted an allocation
    // that size can succeed and then get the process killed as it is filled.
    let bytes = total.saturating_mul(std::mem::size_of::<T>()) as u64;
    if dflash_batch_core::memory::physical().is_some_and(|memory| bytes > memory) {
        return Err(too_large());
    }
    // One block for the four arrays, asked for fallibly: a refused allocation raises instead of
    // aborting the process (a huge pad_to_multiple_of asked for 34 GB once), and one request for
    // all of it is refused where four smaller ones could each pass and then exhaust memory.
    let mut block: Vec<T> = Vec::new();
    block.try_reserve_exact(total).map_err(|_| too_large())?;
    block.resize(total, T::default());
    {
        let (ids, rest) = block.split_at_mut(size);
        let (mask, rest) = rest.split_at_mut(size);
        let (labels, positions) = rest.split_at_mut(size);
        let out = Buffers {
            input_ids: ids,
            attention_mask: mask,
            labels,
            position_ids: positions,
        };
        collate_any(py, store, indices, padding, out)?.map_err(to_py)?;
    }
    // Row views of one `[4, size]` array, which owns the block.
    let block = PyArray1::from_vec(py, block).reshape([4, size])?;
    PyTuple::new(
        py,
        [
            block.get_item(0)?,
            block.get_item(1)?,
            block.get_item(2)?,
            block.get_item(3)?,
            (shape.0, shape.1).into_pyobject(py)?.into_any(),
        ],
    )
}

fn shape_any(
    store: &TokenStore,
    indices: &Bound<'_, PyAny>,
    pad_to_multiple_of: u32,
) -> PyResult<CoreResult<(usize, usize)>> {
    with_index_slice!(indices, rows => dflash_batch_core::collate::padded_shape(&store.store, rows, pad_to_multiple_of))
}

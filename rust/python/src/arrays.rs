//! Arrays handed to numpy.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Marks a freshly created array read-only: plans are values shared by every consumer.
pub(crate) fn read_only<T: numpy::Element>(
    array: Bound<'_, PyArray1<T>>,
) -> PyResult<Py<PyArray1<T>>> {
    let kwargs = PyDict::new(array.py());
    kwargs.set_item("write", false)?;
    array.call_method("setflags", (), Some(&kwargs))?;
    Ok(array.unbind())
}

/// A copy of `values` (a numpy array's, to use without the GIL), or `MemoryError` when it cannot be
/// allocated: Rust aborts on an allocation it did not reserve.
pub(crate) fn copied<T: Copy>(values: impl ExactSizeIterator<Item = T>) -> PyResult<Vec<T>> {
    let mut out =
        dflash_batch_core::memory::vec_with_capacity("copying an input array", values.len())
            .map_err(crate::errors::to_py)?;
    out.extend(values);
    Ok(out)
}

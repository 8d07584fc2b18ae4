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

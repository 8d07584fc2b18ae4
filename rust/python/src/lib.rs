//! `dflash_batch._core`: the PyO3 binding of `dflash-batch-core`.
//!
//! Thin by design: each function checks and extracts its inputs, runs the core with the GIL released
//! (`py.detach`), and wraps the result. Plans reach numpy without a copy: the core's `Vec`s are moved
//! into arrays that numpy then owns (`PyArray::from_vec`), marked read-only because a plan is a value.
//! Tokens reach numpy as read-only views of the mapped files, kept alive by their store.
//! State that changes between calls (the epoch, the step) lives in Python.

#[macro_use]
mod reading;
mod collating;
mod metrics;
mod options;
mod plan;
mod planning;
mod table;
mod truncating;
mod workload;

use dflash_batch_core::ReadProblem;
use dflash_batch_core::{Error, ErrorKind};
use numpy::PyArray1;
use pyo3::exceptions::{PyIndexError, PyMemoryError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

pyo3::create_exception!(
    dflash_batch,
    PlanError,
    PyValueError,
    "Invalid lengths or configuration for planning. The message names the value and the fix."
);

pyo3::create_exception!(
    dflash_batch,
    DataError,
    PyValueError,
    "A dataset file that cannot be read as asked: not Arrow, truncated, compressed, a missing column \
     or one of the wrong type, nulls or negative lengths. The message names the file and the fix."
);

/// The one mapping from core errors to Python exceptions: I/O failures become the matching `OSError`
/// subclass (`FileNotFoundError`, `PermissionError`, ...), unreadable data `DataError`, rows past the
/// end `IndexError`, small buffers `ValueError`, memory that cannot be reserved `MemoryError`, and
/// everything else `PlanError`.
pub(crate) fn to_py(err: Error) -> PyErr {
    match err.kind() {
        ErrorKind::Read {
            problem: ReadProblem::Io { kind, .. },
            ..
        } => std::io::Error::new(*kind, err.to_string()).into(),
        ErrorKind::Read { .. } | ErrorKind::TokenOutOfRange { .. } => {
            DataError::new_err(err.to_string())
        }
        ErrorKind::BufferTooSmall { .. } | ErrorKind::PackedRowTooLong { .. } => {
            PyValueError::new_err(err.to_string())
        }
        ErrorKind::RowOutOfRange { .. } => PyIndexError::new_err(err.to_string()),
        ErrorKind::OutOfMemory { .. } => PyMemoryError::new_err(err.to_string()),
        _ => PlanError::new_err(err.to_string()),
    }
}

/// Marks a freshly created array read-only: plans are values shared by every consumer.
pub(crate) fn read_only<T: numpy::Element>(
    array: Bound<'_, PyArray1<T>>,
) -> PyResult<Py<PyArray1<T>>> {
    let kwargs = PyDict::new(array.py());
    kwargs.set_item("write", false)?;
    array.call_method("setflags", (), Some(&kwargs))?;
    Ok(array.unbind())
}

/// Bytes of physical memory, where the system says (`None` elsewhere): what a buffer larger than the
/// machine is refused against.
#[pyfunction]
pub(crate) fn physical_memory() -> Option<u64> {
    dflash_batch_core::memory::physical()
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<planning::Planner>()?;
    m.add_class::<plan::Plan>()?;
    m.add_class::<reading::TokenStore>()?;
    m.add_function(wrap_pyfunction!(reading::read_lengths, m)?)?;
    m.add_function(wrap_pyfunction!(reading::read_table_lengths, m)?)?;
    m.add_function(wrap_pyfunction!(truncating::split_long, m)?)?;
    m.add_function(wrap_pyfunction!(truncating::locate_pieces, m)?)?;
    m.add_function(wrap_pyfunction!(collating::collate_into, m)?)?;
    m.add_function(wrap_pyfunction!(physical_memory, m)?)?;
    m.add_function(wrap_pyfunction!(workload::seed_lengths, m)?)?;
    m.add_function(wrap_pyfunction!(collating::collate_new, m)?)?;
    m.add_function(wrap_pyfunction!(collating::collate_slot, m)?)?;
    m.add_function(wrap_pyfunction!(collating::collate_packed_slot, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::efficiency, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::window_tv, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::rank_imbalance, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::churn, m)?)?;
    m.add("PlanError", m.py().get_type::<PlanError>())?;
    m.add("DataError", m.py().get_type::<DataError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

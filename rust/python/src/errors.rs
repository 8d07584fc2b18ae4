//! The Python exceptions of the module and the one mapping from core errors onto them.

use dflash_batch_core::ReadProblem;
use dflash_batch_core::{Error, ErrorKind};
use pyo3::exceptions::{PyIndexError, PyMemoryError, PyValueError};
use pyo3::prelude::*;

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
    "A dataset file that cannot be read as asked: not Arrow (or not a consistent Megatron .bin/.idx \
     pair), truncated, compressed, a missing column or one of the wrong type, nulls or negative \
     lengths. The message names the file and the fix."
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
        ErrorKind::Read { .. }
        | ErrorKind::TokenOutOfRange { .. }
        | ErrorKind::TokenNotInteger { .. }
        | ErrorKind::MaskLength { .. } => DataError::new_err(err.to_string()),
        ErrorKind::BufferTooSmall { .. } | ErrorKind::PackedRowTooLong { .. } => {
            PyValueError::new_err(err.to_string())
        }
        ErrorKind::RowOutOfRange { .. } => PyIndexError::new_err(err.to_string()),
        ErrorKind::OutOfMemory { .. } => PyMemoryError::new_err(err.to_string()),
        _ => PlanError::new_err(err.to_string()),
    }
}

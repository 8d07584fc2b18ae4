//! The Python exceptions of the module and the one mapping from core errors onto them.

use dflash_batch_core::ReadProblem;
use dflash_batch_core::{Error as CoreError, ErrorKind};
use pyo3::exceptions::{PyIndexError, PyMemoryError, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(
    dflash_batch,
    Error,
    PyValueError,
    "The base of dflash_batch's own errors (PlanError, DataError): a ValueError whose `kind` names \
     what went wrong (snake case, stable: `non_positive_length`, `invalid_setting`, `read`, ...), with \
     `row`, `setting` and `path` set where the error knows them (else None)."
);

pyo3::create_exception!(
    dflash_batch,
    PlanError,
    Error,
    "Invalid lengths or configuration for planning. The message names the value and the fix."
);

pyo3::create_exception!(
    dflash_batch,
    DataError,
    Error,
    "A dataset file that cannot be read as asked: not Arrow (or not a consistent Megatron .bin/.idx \
     pair), truncated, compressed, a missing column or one of the wrong type, nulls or negative \
     lengths. The message names the file and the fix."
);

/// The one mapping from core errors to Python exceptions: I/O failures become the matching `OSError`
/// subclass (`FileNotFoundError`, `PermissionError`, ...), unreadable data `DataError`, rows past the
/// end `IndexError`, small buffers `ValueError`, memory that cannot be reserved `MemoryError`, and
/// everything else `PlanError`.
pub(crate) fn to_py(err: CoreError) -> PyErr {
    let raised = exception(&err);
    let kind = err.kind();
    Python::attach(|py| {
        let value = raised.value(py);
        // Attributes on a fresh exception instance: setting them cannot fail but for memory.
        let _ = value.setattr("kind", kind.name());
        let _ = value.setattr("row", kind.row());
        let _ = value.setattr("setting", kind.setting());
        let _ = value.setattr("path", kind.path());
    });
    raised
}

/// The exception class of `err`, with its message.
fn exception(err: &CoreError) -> PyErr {
    match err.kind() {
        ErrorKind::Read {
            problem: ReadProblem::Io { kind, .. },
            ..
        } => std::io::Error::new(*kind, err.to_string()).into(),
        ErrorKind::Read { .. }
        | ErrorKind::TokenOutOfRange { .. }
        | ErrorKind::TokenNotInteger { .. }
        | ErrorKind::MaskLength { .. }
        | ErrorKind::MaskValue { .. } => DataError::new_err(err.to_string()),
        ErrorKind::BufferTooSmall { .. } | ErrorKind::PackedRowTooLong { .. } => {
            PyValueError::new_err(err.to_string())
        }
        ErrorKind::RowOutOfRange { .. } => PyIndexError::new_err(err.to_string()),
        ErrorKind::OutOfMemory { .. } => PyMemoryError::new_err(err.to_string()),
        _ => PlanError::new_err(err.to_string()),
    }
}

/// A `PlanError` of kind `invalid_setting` about setting `name`: a setting the binding checks itself
/// (its type or form) before the core sees it.
pub(crate) fn invalid_setting(name: &str, message: String) -> PyErr {
    let raised = PlanError::new_err(message);
    Python::attach(|py| {
        let value = raised.value(py);
        let _ = value.setattr("kind", "invalid_setting");
        let _ = value.setattr("setting", name);
    });
    raised
}

//! The Python exceptions of the module and the one mapping from core errors onto them.

use dflash_batch_core::error::{Family, Kind, KINDS};
use dflash_batch_core::{Error as CoreError, ErrorKind};
use dflash_batch_core::{ReadProblem, SharedProblem};
use pyo3::exceptions::{PyIndexError, PyMemoryError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

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

/// The one mapping from core errors to Python exceptions, from the kinds' declared families
/// (`dflash_batch_core::KINDS`): I/O failures become the matching `OSError` subclass
/// (`FileNotFoundError`, `PermissionError`, ...), unreadable data `DataError`, rows past the end
/// `IndexError`, small buffers `ValueError`, memory that cannot be reserved `MemoryError`, and planning
/// `PlanError`. A bad setting's `kind` is `invalid_setting`, with `setting` naming it and `reason` the
/// finer kind (`invalid_cost`, `too_few_edges`, ...); every error's `reason` is its declared kind.
pub(crate) fn to_py(err: CoreError) -> PyErr {
    let raised = exception(&err);
    let kind = err.kind();
    Python::attach(|py| {
        let value = raised.value(py);
        let public = if kind.is_setting() {
            "invalid_setting"
        } else {
            kind.name()
        };
        // Attributes on a fresh exception instance: setting them cannot fail but for memory.
        let _ = value.setattr("kind", public);
        let _ = value.setattr("reason", kind.name());
        let _ = value.setattr("row", kind.row());
        let _ = value.setattr("setting", kind.setting());
        let _ = value.setattr("path", kind.path());
    });
    raised
}

/// The exception class of `err`, with its message.
fn exception(err: &CoreError) -> PyErr {
    let message = err.to_string();
    match err.kind() {
        ErrorKind::Read {
            problem: ReadProblem::Io { kind, .. },
            ..
        }
        | ErrorKind::SharedPlan {
            problem: SharedProblem::Io { kind, .. },
            ..
        } => std::io::Error::new(*kind, message).into(),
        kind => match kind.family() {
            Family::Plan => PlanError::new_err(message),
            Family::Data => DataError::new_err(message),
            Family::Value => PyValueError::new_err(message),
            Family::Index => PyIndexError::new_err(message),
            Family::Memory => PyMemoryError::new_err(message),
        },
    }
}

/// The kinds of errors raised from Python rather than from the core: each class's default, for a check
/// the library does in Python without a finer kind (a checkpoint's state, a sampler's rank).
const GENERIC: [Kind; 2] = [
    Kind {
        name: "plan",
        family: Family::Plan,
        setting: false,
    },
    Kind {
        name: "data",
        family: Family::Data,
        setting: false,
    },
];

/// `_core.ERROR_KINDS`: every declared kind as a dict (`name`, `exception`, `invalid_setting`: whether
/// it is raised as a bad setting), the core's then the two of errors raised from Python.
pub(crate) fn declared(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    let rows = KINDS
        .iter()
        .chain(GENERIC.iter())
        .map(|kind| {
            let row = PyDict::new(py);
            row.set_item("name", kind.name)?;
            let exception = match kind.family {
                Family::Plan => "PlanError",
                Family::Data => "DataError",
                Family::Value => "ValueError",
                Family::Index => "IndexError",
                Family::Memory => "MemoryError",
            };
            row.set_item("exception", exception)?;
            row.set_item("invalid_setting", kind.setting)?;
            Ok(row)
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, rows)
}

/// A `PlanError` of kind `invalid_setting` about setting `name`: a setting the binding checks itself
/// (its type or form) before the core sees it.
pub(crate) fn invalid_setting(name: &str, message: String) -> PyErr {
    let raised = PlanError::new_err(message);
    Python::attach(|py| {
        let value = raised.value(py);
        let _ = value.setattr("kind", "invalid_setting");
        let _ = value.setattr("reason", "invalid_setting");
        let _ = value.setattr("setting", name);
    });
    raised
}

//! Tables that live in memory, taken from Python without a copy through the Arrow PyCapsule
//! interface: any object with `__arrow_c_stream__` (a pyarrow `Table` or `RecordBatchReader`, and
//! the other Arrow libraries that speak it) hands over its record batches, whose buffers the core
//! then shares. The core validates the column it reads (see `read/table.rs`).

use arrow_array::ffi_stream::{FFI_ArrowArrayStream, RecordBatchStreamReader};
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

use crate::errors::DataError;

/// The capsule name the Arrow PyCapsule interface gives a C stream.
const STREAM: &std::ffi::CStr = c"arrow_array_stream";

/// A table's schema and record batches, imported from a Python object.
pub(crate) struct Table {
    pub(crate) schema: SchemaRef,
    pub(crate) batches: Vec<RecordBatch>,
}

impl<'a, 'py> FromPyObject<'a, 'py> for Table {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if !obj.hasattr("__arrow_c_stream__")? {
            return Err(PyTypeError::new_err(format!(
                "table must be a pyarrow Table (or another object with __arrow_c_stream__), got {}",
                obj.get_type().name()?
            )));
        }
        let capsule = obj.call_method0("__arrow_c_stream__")?;
        let capsule = capsule.cast::<PyCapsule>().map_err(|_| {
            PyTypeError::new_err("__arrow_c_stream__ returned something other than a PyCapsule")
        })?;
        // A capsule of another name holds another struct: reading it as a stream would be undefined.
        let pointer = capsule.pointer_checked(Some(STREAM)).map_err(|_| {
            PyTypeError::new_err(
                "__arrow_c_stream__ returned a capsule not named 'arrow_array_stream'",
            )
        })?;
        // SAFETY: the capsule is named "arrow_array_stream", which the PyCapsule interface reserves for
        // a pointer to a valid, aligned `ArrowArrayStream`. `from_raw` moves the stream out and leaves
        // a released one behind, so the capsule's destructor frees only the empty shell; a capsule is
        // consumed once, and this one is ours alone (just returned by the producer).
        #[allow(unsafe_code)]
        let stream = unsafe { FFI_ArrowArrayStream::from_raw(pointer.as_ptr().cast()) };
        let failed = |e: arrow_schema::ArrowError| {
            DataError::new_err(format!(
                "the in-memory table cannot be read through the Arrow C stream interface ({e})"
            ))
        };
        let reader = RecordBatchStreamReader::try_new(stream).map_err(failed)?;
        let schema = arrow_array::RecordBatchReader::schema(&reader);
        let batches = reader.collect::<Result<Vec<_>, _>>().map_err(failed)?;
        Ok(Self { schema, batches })
    }
}

//! The binding of `oversize="truncate"`: long samples cut into pieces, and entries mapped back to
//! their rows and token windows (the logic is the core's `plan::truncate`).

use dflash_batch_core::plan::truncate;
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

use crate::arrays::read_only;
use crate::errors::to_py;
use crate::planning::lengths_from_chunks;

/// Arrays a Python caller receives: read-only, owned by Rust.
type Out = Py<PyArray1<u32>>;

/// The lengths (`chunks` of any integer dtype) cut into pieces of at most `capacity` tokens:
/// `(planned lengths, rows of the later pieces, their starts, samples split)`, or `None` when no
/// sample is longer than `capacity`.
#[pyfunction]
pub(crate) fn split_long(
    py: Python<'_>,
    chunks: Vec<Bound<'_, PyAny>>,
    capacity: u64,
) -> PyResult<Option<(Out, Out, Out, u64)>> {
    let lengths = lengths_from_chunks(&chunks)?;
    let pieces = py
        .detach(|| truncate::split(&lengths, capacity))
        .map_err(to_py)?;
    pieces
        .map(|p| {
            Ok((
                read_only(PyArray1::from_vec(py, p.planned))?,
                read_only(PyArray1::from_vec(py, p.rows))?,
                read_only(PyArray1::from_vec(py, p.starts))?,
                p.split,
            ))
        })
        .transpose()
}

/// The token windows `(rows, starts, lengths)` of `entries` of plans over `planned` lengths whose
/// first `samples` entries are dataset rows; `rows`/`starts` of the later pieces, if any.
#[pyfunction]
#[pyo3(signature = (entries, samples, planned, rows=None, starts=None))]
pub(crate) fn locate_pieces(
    py: Python<'_>,
    entries: PyReadonlyArray1<'_, i64>,
    samples: usize,
    planned: PyReadonlyArray1<'_, u32>,
    rows: Option<PyReadonlyArray1<'_, u32>>,
    starts: Option<PyReadonlyArray1<'_, u32>>,
) -> PyResult<(Out, Out, Out)> {
    let later = match (&rows, &starts) {
        (Some(r), Some(s)) => Some((r.as_slice()?, s.as_slice()?)),
        _ => None,
    };
    let (rows, starts, lengths) =
        truncate::locate(entries.as_slice()?, samples, planned.as_slice()?, later)
            .map_err(to_py)?;
    Ok((
        read_only(PyArray1::from_vec(py, rows))?,
        read_only(PyArray1::from_vec(py, starts))?,
        read_only(PyArray1::from_vec(py, lengths))?,
    ))
}

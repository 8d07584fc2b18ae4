//! The seed workload's binding: one generator (the core's), so Python benchmarks, tests and the
//! demo measure the same lengths as the Rust benches for the same seed.

use numpy::PyArray1;
use pyo3::prelude::*;

/// `n` lengths of the seed workload (the core's `seed_lengths`), as a new `uint32` array.
#[pyfunction]
pub(crate) fn seed_lengths(
    py: Python<'_>,
    n: usize,
    seed: u64,
) -> PyResult<Bound<'_, PyArray1<u32>>> {
    let lengths = py
        .detach(|| dflash_batch_core::workload::seed_lengths(n, seed))
        .map_err(crate::errors::to_py)?;
    Ok(PyArray1::from_vec(py, lengths))
}

/// `n` seed-workload lengths split into four sources of different length profiles (the core's
/// `seed_sources`): the lengths grouped by source, and each source's count.
#[pyfunction]
pub(crate) fn seed_sources(
    py: Python<'_>,
    n: usize,
    seed: u64,
) -> PyResult<(Bound<'_, PyArray1<u32>>, [u32; 4])> {
    let (lengths, counts) = py
        .detach(|| dflash_batch_core::workload::seed_sources(n, seed))
        .map_err(crate::errors::to_py)?;
    Ok((PyArray1::from_vec(py, lengths), counts))
}

//! The mixing and balance figures of any CSR batching (not only dflash_batch plans), so baselines
//! are scored by the same code as plans: `window_tv`, `rank_imbalance`, `churn`.

use dflash_batch_core::metrics::{self, Deciles};
use numpy::PyReadonlyArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Checks that `offsets` is a CSR over `indices` whose rows are all below `samples`.
fn check_csr(offsets: &[u64], indices: &[u32], samples: usize) -> PyResult<()> {
    let monotone = offsets.windows(2).all(|w| w[0] <= w[1]);
    let spans =
        offsets.first() == Some(&0) && offsets.last().copied() == Some(indices.len() as u64);
    if !(monotone && spans) {
        return Err(PyValueError::new_err(
            "offsets must start at 0, never decrease, and end at len(indices)",
        ));
    }
    if indices.iter().any(|&r| r as usize >= samples) {
        return Err(PyValueError::new_err(
            "indices must be rows of lengths (each below len(lengths))",
        ));
    }
    Ok(())
}

/// Mean total-variation distance of windows of `window` consecutive batches from the whole's token
/// deciles; `None` without a complete window.
#[pyfunction]
pub(crate) fn window_tv(
    py: Python<'_>,
    offsets: PyReadonlyArray1<'_, u64>,
    indices: PyReadonlyArray1<'_, u32>,
    lengths: PyReadonlyArray1<'_, u32>,
    window: usize,
) -> PyResult<Option<f64>> {
    let (offsets, indices, lengths) = (
        offsets.as_slice()?,
        indices.as_slice()?,
        lengths.as_slice()?,
    );
    check_csr(offsets, indices, lengths.len())?;
    if window == 0 {
        return Err(PyValueError::new_err("window must be ≥ 1 batch"));
    }
    Ok(py.detach(|| {
        let deciles = Deciles::new(lengths);
        metrics::window_tv(offsets, indices, lengths, &deciles, window)
    }))
}

/// `(p50, p99, max)` over steps of max/min padded tokens among each step's `world_size` batches.
#[pyfunction]
pub(crate) fn rank_imbalance(
    py: Python<'_>,
    offsets: PyReadonlyArray1<'_, u64>,
    indices: PyReadonlyArray1<'_, u32>,
    lengths: PyReadonlyArray1<'_, u32>,
    world_size: usize,
    pad_to_multiple_of: u64,
) -> PyResult<Option<(f64, f64, f64)>> {
    let (offsets, indices, lengths) = (
        offsets.as_slice()?,
        indices.as_slice()?,
        lengths.as_slice()?,
    );
    check_csr(offsets, indices, lengths.len())?;
    if world_size == 0 || pad_to_multiple_of == 0 {
        return Err(PyValueError::new_err(
            "world_size and pad_to_multiple_of must be ≥ 1",
        ));
    }
    let cost = |members: &[u32]| {
        let longest = members
            .iter()
            .map(|&r| u64::from(lengths[r as usize]))
            .max()
            .unwrap_or(0);
        // Padded tokens stay far below 2^53.
        #[allow(clippy::cast_precision_loss)]
        let padded = (members.len() as u64
            * longest.div_ceil(pad_to_multiple_of)
            * pad_to_multiple_of) as f64;
        padded
    };
    let got = py.detach(|| metrics::rank_imbalance(offsets, indices, world_size, cost));
    Ok(got.map(|i| (i.p50, i.p99, i.max)))
}

/// Share of sample pairs batched together in `a` that are batched together again in `b`.
#[pyfunction]
pub(crate) fn churn(
    py: Python<'_>,
    a_offsets: PyReadonlyArray1<'_, u64>,
    a_indices: PyReadonlyArray1<'_, u32>,
    b_offsets: PyReadonlyArray1<'_, u64>,
    b_indices: PyReadonlyArray1<'_, u32>,
    samples: usize,
) -> PyResult<Option<f64>> {
    let a = (a_offsets.as_slice()?, a_indices.as_slice()?);
    let b = (b_offsets.as_slice()?, b_indices.as_slice()?);
    check_csr(a.0, a.1, samples)?;
    check_csr(b.0, b.1, samples)?;
    Ok(py.detach(|| metrics::churn(a, b, samples)))
}

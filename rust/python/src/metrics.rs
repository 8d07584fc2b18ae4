//! The mixing and balance figures of any CSR batching (not only dflash_batch plans), so baselines
//! are scored by the same code as plans: `efficiency`, `window_tv`, `rank_imbalance`, `churn`. The core checks
//! the batching (`metrics/score.rs`).

use dflash_batch_core::metrics::score;
use dflash_batch_core::CostModel;
use numpy::PyReadonlyArray1;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::to_py;

/// Real over padded tokens of any batching (rows × longest rounded up to `pad_to_multiple_of`).
#[pyfunction]
#[pyo3(signature = (offsets, indices, lengths, pad_to_multiple_of=1))]
pub(crate) fn efficiency(
    py: Python<'_>,
    offsets: PyReadonlyArray1<'_, u32>,
    indices: PyReadonlyArray1<'_, u32>,
    lengths: PyReadonlyArray1<'_, u32>,
    pad_to_multiple_of: u64,
) -> PyResult<Option<f64>> {
    let csr = (offsets.as_slice()?, indices.as_slice()?);
    let lengths = lengths.as_slice()?;
    py.detach(|| score::score_efficiency(csr, lengths, pad_to_multiple_of))
        .map_err(to_py)
}

/// Mean total-variation distance of windows of `window` consecutive batches from the whole's token
/// deciles; `None` without a complete window.
#[pyfunction]
pub(crate) fn window_tv(
    py: Python<'_>,
    offsets: PyReadonlyArray1<'_, u32>,
    indices: PyReadonlyArray1<'_, u32>,
    lengths: PyReadonlyArray1<'_, u32>,
    window: usize,
) -> PyResult<Option<f64>> {
    let csr = (offsets.as_slice()?, indices.as_slice()?);
    let lengths = lengths.as_slice()?;
    py.detach(|| score::score_window_tv(csr, lengths, window))
        .map_err(to_py)
}

/// `window_tv`, `window_tv_tail`, `length_gap` and `length_gap_tail` of windows of `window` batches
/// (`Plan.stats()`'s mixing figures for any batching); `None` without a complete window.
#[pyfunction]
pub(crate) fn mixing<'py>(
    py: Python<'py>,
    offsets: PyReadonlyArray1<'_, u32>,
    indices: PyReadonlyArray1<'_, u32>,
    lengths: PyReadonlyArray1<'_, u32>,
    window: usize,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    let csr = (offsets.as_slice()?, indices.as_slice()?);
    let lengths = lengths.as_slice()?;
    let got = py
        .detach(|| score::score_mixing(csr, lengths, window))
        .map_err(to_py)?;
    got.map(|m| {
        let d = PyDict::new(py);
        d.set_item("window_tv", m.window_tv)?;
        d.set_item("window_tv_tail", m.window_tv_tail)?;
        d.set_item("length_gap", m.length_gap)?;
        d.set_item("length_gap_tail", m.length_gap_tail)?;
        Ok(d)
    })
    .transpose()
}

/// `(p50, p99, max)` over steps of max/min padded tokens among each step's `world_size` batches.
#[pyfunction]
pub(crate) fn rank_imbalance(
    py: Python<'_>,
    offsets: PyReadonlyArray1<'_, u32>,
    indices: PyReadonlyArray1<'_, u32>,
    lengths: PyReadonlyArray1<'_, u32>,
    world_size: usize,
    pad_to_multiple_of: u64,
) -> PyResult<Option<(f64, f64, f64)>> {
    let csr = (offsets.as_slice()?, indices.as_slice()?);
    let lengths = lengths.as_slice()?;
    let got = py
        .detach(|| score::score_rank_imbalance(csr, lengths, world_size, pad_to_multiple_of))
        .map_err(to_py)?;
    Ok(got.map(|i| (i.p50, i.p99, i.max)))
}

/// `(per micro-batch, per optimizer step)` synchronous efficiency of any padded batching on
/// `world_size` ranks, `accumulation` micro-batches per optimizer step, a row of padded length `L`
/// costing `a·L + b·L²` (`cost=(a, b)`; `(1, 0)`: padded tokens).
#[pyfunction]
#[pyo3(signature = (offsets, indices, lengths, world_size, accumulation=1, pad_to_multiple_of=1, cost=(1.0, 0.0)))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn sync_efficiency(
    py: Python<'_>,
    offsets: PyReadonlyArray1<'_, u32>,
    indices: PyReadonlyArray1<'_, u32>,
    lengths: PyReadonlyArray1<'_, u32>,
    world_size: usize,
    accumulation: usize,
    pad_to_multiple_of: u64,
    cost: (f64, f64),
) -> PyResult<Option<(f64, f64)>> {
    let csr = (offsets.as_slice()?, indices.as_slice()?);
    let lengths = lengths.as_slice()?;
    let cost = CostModel {
        linear: cost.0,
        quadratic: cost.1,
    };
    let ranks = (world_size, accumulation);
    let got = py
        .detach(|| score::score_synchronous(csr, lengths, ranks, pad_to_multiple_of, cost))
        .map_err(to_py)?;
    Ok(got.map(|s| (s.per_micro_batch, s.per_optimizer_step)))
}

/// `(per micro-batch, per optimizer step)` end-to-end efficiency of any batching: every sample's
/// `a·l + b·l²` over what `world_size` ranks spend, waiting for the slowest and padding included —
/// padded batches, or with `capacity`, packed rows of that many tokens (a row takes
/// `a·capacity + b·Σl²`).
#[pyfunction]
#[pyo3(signature = (offsets, indices, lengths, world_size, accumulation=1, pad_to_multiple_of=1, cost=(1.0, 0.0), capacity=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn end_to_end(
    py: Python<'_>,
    offsets: PyReadonlyArray1<'_, u32>,
    indices: PyReadonlyArray1<'_, u32>,
    lengths: PyReadonlyArray1<'_, u32>,
    world_size: usize,
    accumulation: usize,
    pad_to_multiple_of: u64,
    cost: (f64, f64),
    capacity: Option<u64>,
) -> PyResult<Option<(f64, f64)>> {
    let csr = (offsets.as_slice()?, indices.as_slice()?);
    let lengths = lengths.as_slice()?;
    let cost = CostModel {
        linear: cost.0,
        quadratic: cost.1,
    };
    let ranks = (world_size, accumulation);
    let got = py
        .detach(|| {
            score::score_end_to_end(csr, lengths, ranks, (pad_to_multiple_of, capacity), cost)
        })
        .map_err(to_py)?;
    Ok(got.map(|s| (s.per_micro_batch, s.per_optimizer_step)))
}

/// Share of sample pairs batched together in `a` that are batched together again in `b`.
#[pyfunction]
pub(crate) fn churn(
    py: Python<'_>,
    a_offsets: PyReadonlyArray1<'_, u32>,
    a_indices: PyReadonlyArray1<'_, u32>,
    b_offsets: PyReadonlyArray1<'_, u32>,
    b_indices: PyReadonlyArray1<'_, u32>,
    samples: usize,
) -> PyResult<Option<f64>> {
    let a = (a_offsets.as_slice()?, a_indices.as_slice()?);
    let b = (b_offsets.as_slice()?, b_indices.as_slice()?);
    py.detach(|| score::score_churn(a, b, samples))
        .map_err(to_py)
}

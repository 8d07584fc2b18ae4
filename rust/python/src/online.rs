//! `split_step`: one step's sequences split into every rank's micro-batches (the core's `online.rs`).

use dflash_batch_core::lengths::Lengths;
use dflash_batch_core::{split_step as core_split, StepSpec};
use numpy::PyArray1;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::choices::cost_of;
use crate::errors::to_py;
use crate::extract::{count, int_of, ranged, seed_of};
use crate::planning::lengths_from_chunks;

/// `(offsets, indices, micro_batches, loads)`: micro-step `j` of rank `r` is batch `j × world_size + r`.
#[pyfunction]
#[pyo3(signature = (lengths, *, world_size, max_tokens, mode="padded", cost=None, seed=None))]
#[allow(clippy::type_complexity)]
pub(crate) fn split_step<'py>(
    py: Python<'py>,
    lengths: &Bound<'py, PyAny>,
    world_size: &Bound<'py, PyAny>,
    max_tokens: &Bound<'py, PyAny>,
    mode: &str,
    cost: Option<&Bound<'py, PyAny>>,
    seed: Option<&Bound<'py, PyAny>>,
) -> PyResult<(
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u32>>,
    u32,
    Vec<f64>,
)> {
    let given = PyDict::new(py);
    let world_size = count(&given, "world_size", Some(world_size), None)?;
    let max_tokens = ranged(
        "max_tokens",
        &int_of("max_tokens", max_tokens)?,
        1,
        i128::from(u32::MAX),
        "between 1 and 4294967295",
    )?;
    let max_tokens = u64::try_from(max_tokens).unwrap_or(1);
    let seed = seed_of(&given, seed)?;
    let packed = match mode {
        "padded" => false,
        "packed" => true,
        other => {
            return Err(PyValueError::new_err(format!(
                "mode={other:?} is invalid; pass 'padded' (rows × longest within max_tokens) or 'packed' \
                 (the sum of a micro-batch's lengths within max_tokens)"
            )))
        }
    };
    let cost = cost_of(&given, cost)?;
    let values: Vec<u32> = match lengths_from_chunks(std::slice::from_ref(lengths))? {
        Lengths::U16(v) => v.iter().map(|&x| u32::from(x)).collect(),
        Lengths::U32(v) => v.to_vec(),
    };
    let spec = StepSpec {
        world_size,
        max_tokens,
        packed,
        cost,
        seed,
    };
    let split = py.detach(|| core_split(&values, &spec)).map_err(to_py)?;
    Ok((
        PyArray1::from_vec(py, split.offsets),
        PyArray1::from_vec(py, split.indices),
        split.micro_batches,
        split.loads,
    ))
}

//! Planner arguments from Python: each extracted into the core's type (a named choice, a bucket
//! count or edges, a cost pair, a ratio in parts per million), with a message that names the
//! argument and what it takes.

use dflash_batch_core::{Boundaries, CostModel, Mode, Order};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// `order=`: `"stratified"` (the default) or `"random"`.
pub(crate) struct OrderArg(pub(crate) Order);

impl<'a, 'py> FromPyObject<'a, 'py> for OrderArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match obj.extract::<String>()?.as_str() {
            "stratified" => Ok(Self(Order::Stratified)),
            "random" => Ok(Self(Order::Random)),
            other => Err(PyValueError::new_err(format!(
                "order={other:?} is invalid; use 'stratified' (the default) or 'random'"
            ))),
        }
    }
}

/// `boundaries=`: a bucket count or explicit edges (`None`, auto, is the caller's).
pub(crate) struct BoundariesArg(pub(crate) Boundaries);

impl<'a, 'py> FromPyObject<'a, 'py> for BoundariesArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(k) = obj.extract::<usize>() {
            return Ok(Self(Boundaries::Count(k)));
        }
        let edges = obj.extract::<Vec<u32>>().map_err(|_| {
            PyTypeError::new_err(
                "boundaries must be 'auto', a bucket count, or a list of edges (non-negative ints)",
            )
        })?;
        Ok(Self(Boundaries::Edges(edges)))
    }
}

/// `cost=`: `"tokens"` (padded tokens; `None`, the default, is the caller's), or `(a, b)`: a row
/// of padded length `L` costs `a·L + b·L²`.
pub(crate) struct CostArg(pub(crate) CostModel);

impl<'a, 'py> FromPyObject<'a, 'py> for CostArg {
    type Error = PyErr;

    fn extract(cost: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Self(cost_model(&cost)?))
    }
}

fn cost_model(cost: &Borrowed<'_, '_, PyAny>) -> PyResult<CostModel> {
    if let Ok(name) = cost.extract::<String>() {
        if name == "tokens" {
            return Ok(CostModel::TOKENS);
        }
        return Err(PyValueError::new_err(format!(
            "cost={name:?} is invalid; pass \"tokens\" (the default) or a pair (a, b): a row of padded \
             length L costs a·L + b·L²"
        )));
    }
    let (linear, quadratic) = cost.extract::<(f64, f64)>().map_err(|_| {
        PyTypeError::new_err(
            "cost must be \"tokens\" or a pair of numbers (a, b): a row of padded length L costs a·L + b·L²",
        )
    })?;
    Ok(CostModel { linear, quadratic })
}

/// `mode=` with `bucketed=`.
pub(crate) fn mode_of(mode: &str, bucketed: bool) -> PyResult<Mode> {
    match (mode, bucketed) {
        ("padded", false) => Ok(Mode::Padded),
        ("padded", true) => Err(PyValueError::new_err(
            "bucketed=True applies to mode='packed' (padded batches are always bucketed)",
        )),
        ("packed", bucketed) => Ok(Mode::Packed { bucketed }),
        (other, _) => Err(PyValueError::new_err(format!(
            "mode={other:?} is invalid; use 'padded' (the default) or 'packed'"
        ))),
    }
}

/// `target_efficiency=` in (0, 1], as parts per million (at least 1, so a tiny target stays valid).
pub(crate) fn target_ppm(target_efficiency: f64) -> PyResult<u32> {
    if !(target_efficiency > 0.0 && target_efficiency <= 1.0) {
        return Err(PyValueError::new_err(format!(
            "target_efficiency={target_efficiency} is invalid; pass a padding efficiency in (0, 1], e.g. 0.98"
        )));
    }
    // In (0, 1] × 1e6, rounded: fits u32.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let ppm = ((target_efficiency * 1e6).round() as u32).max(1);
    Ok(ppm)
}

/// `balance_tolerance=`: `None`, or a cost ratio tolerance in [0.001, 1000] as parts per million.
pub(crate) fn tolerance_ppm(balance_tolerance: Option<f64>) -> PyResult<Option<u32>> {
    match balance_tolerance {
        None => Ok(None),
        Some(t) if (0.001..=1000.0).contains(&t) => {
            // In [1e3, 1e9]: fits u32.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let ppm = (t * 1e6).round() as u32;
            Ok(Some(ppm))
        }
        Some(t) => Err(PyValueError::new_err(format!(
            "balance_tolerance={t} is invalid; pass None (balance inside mixing windows only, \
             the default) or a cost ratio tolerance between 0.001 and 1000, e.g. 0.1 for steps \
             whose batches cost within 10% of each other"
        ))),
    }
}

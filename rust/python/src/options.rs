//! Planner arguments from Python: each extracted into the core's type (a named choice, a bucket
//! count or edges, a cost pair), with a message that names the argument and what it takes. Ranges
//! (a cost's signs, a ratio's bounds, a count's limits) are the core's to check, once.

use dflash_batch_core::{Boundaries, CostModel, Mode, Order};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};

use crate::errors::{to_py, PlanError};

/// `order=`: `"stratified"` (the default) or `"random"`.
pub(crate) struct OrderArg(pub(crate) Order);

impl<'a, 'py> FromPyObject<'a, 'py> for OrderArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match obj.extract::<String>()?.as_str() {
            "stratified" => Ok(Self(Order::Stratified)),
            "random" => Ok(Self(Order::Random)),
            other => Err(PlanError::new_err(format!(
                "order='{other}' is invalid; use one of 'stratified' (the default), 'random'"
            ))),
        }
    }
}

/// `boundaries=`: a bucket count or explicit edges (`None`, auto, is the caller's).
pub(crate) struct BoundariesArg(pub(crate) Boundaries);

impl<'a, 'py> FromPyObject<'a, 'py> for BoundariesArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if obj.is_instance_of::<PyBool>() {
            return Err(PyTypeError::new_err(
                "boundaries must be 'auto', a bucket count, or a list of edges, got a bool",
            ));
        }
        if obj.is_instance_of::<PyInt>() {
            return match obj.extract::<i128>() {
                Ok(k) => Ok(Self(Boundaries::count(k).map_err(to_py)?)),
                // Past i128 is past every limit: the core's message, quoting the value as given.
                Err(_) => {
                    let message = Boundaries::count(i128::MAX)
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default();
                    let given = obj.str()?.to_string();
                    Err(PlanError::new_err(message.replacen(
                        &i128::MAX.to_string(),
                        &given,
                        1,
                    )))
                }
            };
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
        return Err(PlanError::new_err(format!(
            "cost='{name}' is invalid; pass 'tokens' (the default) or a pair (a, b): a row of padded \
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
        ("padded", true) => Err(PlanError::new_err(
            "bucketed=True applies to mode='packed' (padded batches are always bucketed)",
        )),
        ("packed", bucketed) => Ok(Mode::Packed { bucketed }),
        (other, _) => Err(PlanError::new_err(format!(
            "mode='{other}' is invalid; use 'padded' (the default) or 'packed'"
        ))),
    }
}

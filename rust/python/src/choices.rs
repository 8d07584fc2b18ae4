//! The planning settings that name a choice (`oversize`, `order`, `mode` with `bucketed`) and the
//! cost model, extracted from Python into the core's types for `config.rs`, with a message naming the
//! setting and the choices; every helper records the checked value in `given`.

use dflash_batch_core::{CostModel, Mode, Order, Oversize};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::errors::invalid_setting;
use crate::extract::{described, flag, number_of};

/// `oversize=`: `"error"` (the default), `"skip"` or `"truncate"`.
pub(crate) fn oversize_of(
    given: &Bound<'_, PyDict>,
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<Oversize> {
    let name = choice(obj, "oversize")?;
    let oversize = match name.as_deref().unwrap_or("error") {
        "error" => Oversize::Error,
        "skip" => Oversize::Skip,
        "truncate" => Oversize::Truncate,
        _ => {
            return Err(invalid_setting(
                "oversize",
                format!(
                    "oversize={} is invalid; use 'error', 'skip' or 'truncate'",
                    obj.map_or_else(String::new, |o| o
                        .repr()
                        .map(|r| r.to_string())
                        .unwrap_or_default())
                ),
            ))
        }
    };
    given.set_item("oversize", name.as_deref().unwrap_or("error"))?;
    Ok(oversize)
}

/// `order=`: `"stratified"` (the default) or `"random"`.
pub(crate) fn order_of(
    given: &Bound<'_, PyDict>,
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<Order> {
    let name = choice(obj, "order")?.unwrap_or_else(|| "stratified".into());
    let order = match name.as_str() {
        "stratified" => Order::Stratified,
        "random" => Order::Random,
        other => {
            return Err(invalid_setting(
                "order",
                format!(
                    "order='{other}' is invalid; use one of 'stratified' (the default), 'random'"
                ),
            ))
        }
    };
    given.set_item("order", name)?;
    Ok(order)
}

/// `mode=` with `bucketed=`.
pub(crate) fn mode_of(
    given: &Bound<'_, PyDict>,
    mode: Option<&Bound<'_, PyAny>>,
    bucketed: Option<&Bound<'_, PyAny>>,
) -> PyResult<Mode> {
    let name = choice(mode, "mode")?.unwrap_or_else(|| "padded".into());
    let bucketed = flag(given, "bucketed", bucketed, false)?;
    let mode = match (name.as_str(), bucketed) {
        ("padded", false) => Mode::Padded,
        ("padded", true) => {
            return Err(invalid_setting(
                "bucketed",
                "bucketed=True applies to mode='packed' (padded batches are always bucketed)"
                    .into(),
            ))
        }
        ("packed", bucketed) => Mode::Packed { bucketed },
        (other, _) => {
            return Err(invalid_setting(
                "mode",
                format!("mode='{other}' is invalid; use 'padded' (the default) or 'packed'"),
            ))
        }
    };
    given.set_item("mode", name)?;
    Ok(mode)
}

/// A setting that names a choice: a str (`None` when not given), or a `TypeError`.
pub(crate) fn choice(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Option<String>> {
    obj.map(|o| {
        o.extract::<String>().map_err(|_| {
            PyTypeError::new_err(format!("{name} must be a str, got {}", described(o)))
        })
    })
    .transpose()
}

/// `cost=`: `"tokens"` (the default: a batch costs its padded tokens) or `(a, b)`: a row of padded
/// length `L` costs `a·L + b·L²` (the core checks the signs).
pub(crate) fn cost_of(
    given: &Bound<'_, PyDict>,
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<CostModel> {
    let Some(obj) = obj else {
        given.set_item("cost", "tokens")?;
        return Ok(CostModel::TOKENS);
    };
    if let Ok(name) = obj.extract::<String>() {
        if name != "tokens" {
            return Err(invalid_setting(
                "cost",
                format!(
                    "cost='{name}' is invalid; pass 'tokens' (the default) or a pair (a, b): a row \
                     of padded length L costs a·L + b·L²"
                ),
            ));
        }
        given.set_item("cost", "tokens")?;
        return Ok(CostModel::TOKENS);
    }
    price_of(given, ("cost", "'tokens'"), obj)
}

/// A price `(a, b)` given as a 2-tuple or list of numbers for `setting` (whose other accepted value
/// `other` names), recorded in `given` as a tuple of floats.
fn price_of(
    given: &Bound<'_, PyDict>,
    (setting, other): (&'static str, &str),
    obj: &Bound<'_, PyAny>,
) -> PyResult<CostModel> {
    let pair = (obj.is_instance_of::<PyTuple>() || obj.is_instance_of::<PyList>())
        && obj.len().is_ok_and(|n| n == 2);
    if !pair {
        return Err(PyTypeError::new_err(format!(
            "{setting} must be {other} or a pair (a, b) of numbers, got {}",
            described(obj)
        )));
    }
    let linear = number_of(&format!("{setting}'s a"), &obj.get_item(0)?, "a number")?;
    let quadratic = number_of(&format!("{setting}'s b"), &obj.get_item(1)?, "a number")?;
    let py = given.py();
    given.set_item(setting, PyTuple::new(py, [linear, quadratic])?)?;
    Ok(CostModel { linear, quadratic })
}

/// `rank_cost=`: `None` (rank balance uses `cost`) or `(a, b)`: ranks are balanced as if a row of
/// padded length `L` took `a·L + b·L²` (the core checks the signs).
pub(crate) fn rank_cost_of(
    given: &Bound<'_, PyDict>,
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<CostModel>> {
    let py = given.py();
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        given.set_item("rank_cost", py.None())?;
        return Ok(None);
    };
    price_of(given, ("rank_cost", "None"), obj).map(Some)
}

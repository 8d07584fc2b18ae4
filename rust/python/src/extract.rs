//! Each numeric planning setting (a count, a seed, a number, the bucket boundaries) extracted from
//! Python into the core's type, with a message naming the setting and what it takes (for `config.rs`;
//! the named choices are in `choices.rs`); every helper records the checked value in `given`.

use dflash_batch_core::Boundaries;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};

use crate::errors::{invalid_setting, to_py};

/// The Python type name of `obj` and its repr, for messages.
pub(crate) fn described(obj: &Bound<'_, PyAny>) -> String {
    let kind = obj
        .get_type()
        .name()
        .map_or_else(|_| "object".into(), |n| n.to_string());
    let repr = obj.repr().map_or_else(|_| "?".into(), |r| r.to_string());
    format!("{kind} {repr}")
}

/// Whether `obj` is a `numpy.<kind>` scalar (`integer`, `floating`).
pub(crate) fn is_numpy(obj: &Bound<'_, PyAny>, kind: &str) -> bool {
    let py = obj.py();
    py.import("numpy")
        .and_then(|np| np.getattr(kind))
        .and_then(|t| obj.is_instance(&t))
        .unwrap_or(false)
}

/// A Python or numpy integer (not a bool) as a Python int, else `None`.
pub(crate) fn integer<'py>(obj: &Bound<'py, PyAny>) -> Option<Bound<'py, PyInt>> {
    if obj.is_instance_of::<PyBool>() {
        return None;
    }
    if obj.is_instance_of::<PyInt>() || is_numpy(obj, "integer") {
        return obj
            .call_method0("__index__")
            .ok()?
            .cast_into::<PyInt>()
            .ok();
    }
    None
}

/// `obj`, an integer, or a `TypeError` naming the setting.
pub(crate) fn int_of<'py>(name: &str, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyInt>> {
    integer(obj).ok_or_else(|| {
        PyTypeError::new_err(format!("{name} must be an int, got {}", described(obj)))
    })
}

/// An integer setting in `low..=high`; out of it, a message ending `{name} must be {expected}`.
pub(crate) fn ranged(
    name: &str,
    value: &Bound<'_, PyInt>,
    low: i128,
    high: i128,
    expected: &str,
) -> PyResult<i128> {
    match value.extract::<i128>() {
        Ok(v) if (low..=high).contains(&v) => Ok(v),
        _ => Err(invalid_setting(
            name,
            format!("{name}={value} is invalid; {name} must be {expected}"),
        )),
    }
}

/// `batch_size=`, `max_tokens=`: `None` or an int64 (the core checks they are positive and that
/// exactly one is given).
pub(crate) fn optional_count(
    given: &Bound<'_, PyDict>,
    name: &str,
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<i64>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        given.set_item(name, given.py().None())?;
        return Ok(None);
    };
    let value = int_of(name, obj)?;
    let v = ranged(
        name,
        &value,
        i128::from(i64::MIN),
        i128::from(i64::MAX),
        "a positive integer below 2**63",
    )?;
    given.set_item(name, &value)?;
    Ok(i64::try_from(v).ok())
}

/// A count from 1 to 2**32 - 1 (`pad_to_multiple_of`, `accumulation`, `world_size`; left out: 1);
/// `if_none`: what `None` means, where it is allowed.
pub(crate) fn count(
    given: &Bound<'_, PyDict>,
    name: &str,
    obj: Option<&Bound<'_, PyAny>>,
    if_none: Option<u32>,
) -> PyResult<u32> {
    let value = match (obj, if_none) {
        (Some(obj), Some(value)) if obj.is_none() => value,
        (Some(obj), _) => {
            let value = int_of(name, obj)?;
            let v = ranged(
                name,
                &value,
                1,
                i128::from(u32::MAX),
                "between 1 and 4294967295",
            )?;
            u32::try_from(v).unwrap_or(1)
        }
        (None, _) => 1,
    };
    given.set_item(name, value)?;
    Ok(value)
}

pub(crate) fn seed_of(given: &Bound<'_, PyDict>, obj: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
    let seed = match obj {
        Some(obj) => {
            let value = int_of("seed", obj)?;
            let v = ranged("seed", &value, 0, i128::from(u64::MAX), "in [0, 2**64)")?;
            u64::try_from(v).unwrap_or(0)
        }
        None => 0,
    };
    given.set_item("seed", seed)?;
    Ok(seed)
}

/// `threads=`: `None` (the default) or 1 to 4 × the cores: every planner thread is an OS thread.
pub(crate) fn threads_of(
    given: &Bound<'_, PyDict>,
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<usize>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        given.set_item("threads", given.py().None())?;
        return Ok(None);
    };
    let value = int_of("threads", obj)?;
    match value.extract::<usize>() {
        Ok(t) if t >= 1 => {
            // Kept as given (a configuration written on a bigger machine means the same here): the
            // pool is capped to this machine's cores, and the plan is the same for any thread count.
            given.set_item("threads", t)?;
            let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
            Ok(Some(t.min(cores)))
        }
        _ => Err(invalid_setting(
            "threads",
            format!("threads={value} is invalid; pass a positive count (capped to this machine's cores), or None"),
        )),
    }
}

/// A bool (numpy's too), or a `TypeError` naming the setting.
pub(crate) fn flag(
    given: &Bound<'_, PyDict>,
    name: &str,
    obj: Option<&Bound<'_, PyAny>>,
    default: bool,
) -> PyResult<bool> {
    let value = match obj {
        Some(obj) if obj.is_instance_of::<PyBool>() || is_numpy(obj, "bool_") => obj.is_truthy()?,
        Some(obj) => {
            return Err(PyTypeError::new_err(format!(
                "{name} must be a bool, got {}",
                described(obj)
            )))
        }
        None => default,
    };
    given.set_item(name, value)?;
    Ok(value)
}

/// A Python or numpy number (not a bool) as a float; its range is the core's to check.
pub(crate) fn number(
    given: &Bound<'_, PyDict>,
    name: &str,
    obj: Option<&Bound<'_, PyAny>>,
    default: f64,
) -> PyResult<f64> {
    let value = match obj {
        Some(obj) => number_of(
            name,
            obj,
            if name == "balance_tolerance" {
                "None or a number"
            } else {
                "a number in (0, 1]"
            },
        )?,
        None => default,
    };
    given.set_item(name, value)?;
    Ok(value)
}

pub(crate) fn number_of(name: &str, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<f64> {
    let numeric = !obj.is_instance_of::<PyBool>()
        && (obj.is_instance_of::<PyInt>()
            || obj.is_instance_of::<PyFloat>()
            || is_numpy(obj, "integer")
            || is_numpy(obj, "floating"));
    if !numeric {
        let kind = obj.get_type().name()?;
        return Err(PyTypeError::new_err(format!(
            "{name} must be {what}, got {kind}"
        )));
    }
    obj.extract::<f64>()
}

/// `boundaries=`: `"auto"`, a bucket count, or edges `e_0 < … < e_K` (their order and count are
/// the core's to check).
pub(crate) fn boundaries_of(
    given: &Bound<'_, PyDict>,
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<Boundaries> {
    const TYPES: &str = "boundaries must be 'auto', a bucket count or a list of int edges";
    let py = given.py();
    let Some(obj) = obj else {
        given.set_item("boundaries", "auto")?;
        return Ok(Boundaries::Auto);
    };
    if obj.is_instance_of::<PyString>() {
        if obj.extract::<String>()? != "auto" {
            return Err(invalid_setting(
                "boundaries",
                format!(
                    "boundaries={} is invalid; use 'auto', a bucket count or a list of edges",
                    obj.repr()?
                ),
            ));
        }
        given.set_item("boundaries", "auto")?;
        return Ok(Boundaries::Auto);
    }
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{TYPES}, got {}",
            obj.repr()?
        )));
    }
    if let Some(k) = integer(obj) {
        given.set_item("boundaries", &k)?;
        return match k.extract::<i128>() {
            Ok(k) => Boundaries::count(k).map_err(to_py),
            // Past i128 is past every limit: the core's message, quoting the value as given.
            Err(_) => {
                let message = Boundaries::count(i128::MAX)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                Err(invalid_setting(
                    "boundaries",
                    message.replacen(&i128::MAX.to_string(), &k.to_string(), 1),
                ))
            }
        };
    }
    let type_error = || PyTypeError::new_err(format!("{TYPES}, got {}", described(obj)));
    let mut edges = Vec::new();
    for item in obj.try_iter().map_err(|_| type_error())? {
        let item = item?;
        let edge = integer(&item).ok_or_else(type_error)?;
        match edge.extract::<u32>() {
            Ok(e) => edges.push(e),
            Err(_) => {
                return Err(invalid_setting(
                    "boundaries",
                    format!("boundary edge {edge} is out of range; edges must be in [0, 2**32)"),
                ))
            }
        }
    }
    given.set_item("boundaries", PyList::new(py, &edges)?)?;
    Ok(Boundaries::Edges(edges))
}

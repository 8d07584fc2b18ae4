//! `Mixture`: a mixture's sources (names, rows, weights) and settings, checked by the core
//! (`plan/mixture/`), for a `Planner` to plan; the Python `dflash_batch.Mixture` pairs it with the
//! sources' data.

use dflash_batch_core::{Mixture as CoreMixture, Unit};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::errors::{invalid_setting, to_py};

/// A mixture's sources and settings (frozen).
#[pyclass(frozen, name = "Mixture", module = "dflash_batch._core")]
pub(crate) struct Mixture {
    pub(crate) core: CoreMixture,
}

#[pymethods]
impl Mixture {
    /// `names`, `rows` and `weights`: one per source, in the order their lengths are concatenated.
    #[new]
    #[pyo3(signature = (names, rows, weights, unit="tokens", max_repeat=4.0, epoch_size=None))]
    fn new(
        names: Vec<String>,
        rows: Vec<u64>,
        weights: Vec<f64>,
        unit: &str,
        max_repeat: f64,
        epoch_size: Option<u64>,
    ) -> PyResult<Self> {
        if names.len() != rows.len() || names.len() != weights.len() {
            return Err(PyValueError::new_err(
                "names, rows and weights must have one entry per source",
            ));
        }
        let unit = match unit {
            "samples" => Unit::Samples,
            "tokens" => Unit::Tokens,
            other => {
                return Err(invalid_setting(
                    "unit",
                    format!("unit='{other}' is invalid; pass 'tokens' or 'samples'"),
                ))
            }
        };
        let mut sources = Vec::with_capacity(names.len());
        for ((name, rows), weight) in names.into_iter().zip(rows).zip(weights) {
            let Ok(rows) = u32::try_from(rows) else {
                return Err(invalid_setting(
                    "sources",
                    format!(
                        "source '{name}' has {rows} rows, more than a plan indexes (4294967295)"
                    ),
                ));
            };
            sources.push((name, rows, weight));
        }
        let core = CoreMixture {
            max_repeat,
            epoch_size,
            ..CoreMixture::new(sources, unit)
        };
        let total: u64 = core.sources.iter().map(|s| u64::from(s.rows)).sum();
        core.validate(usize::try_from(total).unwrap_or(usize::MAX))
            .map_err(to_py)?;
        Ok(Self { core })
    }

    /// The sources' names, in order.
    #[getter]
    fn names(&self) -> Vec<String> {
        self.core.sources.iter().map(|s| s.name.clone()).collect()
    }

    /// Rows of each source.
    #[getter]
    fn rows(&self) -> Vec<u32> {
        self.core.sources.iter().map(|s| s.rows).collect()
    }

    /// Each source's weight.
    #[getter]
    fn weights(&self) -> Vec<f64> {
        self.core.sources.iter().map(|s| s.weight).collect()
    }

    /// `"tokens"` or `"samples"`: what the weights and the epoch size count.
    #[getter]
    fn unit(&self) -> &'static str {
        match self.core.unit {
            Unit::Samples => "samples",
            Unit::Tokens => "tokens",
        }
    }

    #[getter]
    fn max_repeat(&self) -> f64 {
        self.core.max_repeat
    }

    #[getter]
    fn epoch_size(&self) -> Option<u64> {
        self.core.epoch_size
    }

    /// The settings as plain values (what a checkpoint records, to name a difference on resume).
    fn settings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let weights = PyDict::new(py);
        for s in &self.core.sources {
            weights.set_item(&s.name, s.weight)?;
        }
        d.set_item("weights", weights)?;
        d.set_item("rows", self.rows())?;
        d.set_item("unit", self.unit())?;
        d.set_item("max_repeat", self.core.max_repeat)?;
        d.set_item("epoch_size", self.core.epoch_size)?;
        Ok(d)
    }

    fn __getnewargs_ex__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyDict>)> {
        let args = (self.names(), self.rows(), self.weights()).into_pyobject(py)?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("unit", self.unit())?;
        kwargs.set_item("max_repeat", self.core.max_repeat)?;
        kwargs.set_item("epoch_size", self.core.epoch_size)?;
        Ok((args, kwargs))
    }

    fn __repr__(&self) -> String {
        let sources: Vec<String> = self
            .core
            .sources
            .iter()
            .map(|s| format!("{:?}: ({} rows, {})", s.name, s.rows, s.weight))
            .collect();
        format!(
            "Mixture({{{}}}, unit={:?}, max_repeat={}, epoch_size={:?})",
            sources.join(", "),
            self.unit(),
            self.core.max_repeat,
            self.core.epoch_size
        )
    }
}

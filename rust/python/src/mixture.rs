//! `Mixture`: a mixture's sources (names, rows, weights) and settings, checked by the core
//! (`plan/mixture/`), for a `Planner` to plan; the Python `dflash_batch.Mixture` pairs it with the
//! sources' data.

use dflash_batch_core::{Interpolation, Mixture as CoreMixture, Point, Schedule, Unit};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::errors::{invalid_setting, to_py};

/// A mixture's sources and settings (frozen).
#[pyclass(frozen, name = "Mixture", module = "dflash_batch._core")]
pub(crate) struct Mixture {
    pub(crate) core: CoreMixture,
}

#[pymethods]
impl Mixture {
    /// `names`, `rows` and `weights`: one per source, in the order their lengths are concatenated.
    /// `schedule`: `(epoch, weights)` points (weights in the sources' order) from which the weights
    /// change, moving as `interpolation` says (`"constant"` or `"linear"`).
    #[new]
    #[pyo3(signature = (
        names, rows, weights, unit="tokens", max_repeat=4.0, epoch_size=None, schedule=None,
        interpolation="constant"
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        names: Vec<String>,
        rows: Vec<u64>,
        weights: Vec<f64>,
        unit: &str,
        max_repeat: f64,
        epoch_size: Option<u64>,
        schedule: Option<Vec<(u64, Vec<f64>)>>,
        interpolation: &str,
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
        let interpolation = match interpolation {
            "constant" => Interpolation::Constant,
            "linear" => Interpolation::Linear,
            other => {
                return Err(invalid_setting(
                    "interpolation",
                    format!(
                        "interpolation='{other}' is invalid; pass 'constant' (a point's weights \
                         hold until the next) or 'linear'"
                    ),
                ))
            }
        };
        let schedule = schedule.map(|points| Schedule {
            points: points
                .into_iter()
                .map(|(epoch, weights)| Point { epoch, weights })
                .collect(),
            interpolation,
        });
        let core = CoreMixture {
            max_repeat,
            epoch_size,
            schedule,
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

    /// Every source's weight in epoch `epoch` (the schedule's, or the sources' own).
    fn weights_at(&self, epoch: u64) -> Vec<f64> {
        self.core.weights_at(epoch)
    }

    /// The schedule's points as `(epoch, weights)` pairs, or `None` for fixed weights.
    #[getter]
    fn schedule(&self) -> Option<Vec<(u64, Vec<f64>)>> {
        let schedule = self.core.schedule.as_ref()?;
        Some(
            schedule
                .points
                .iter()
                .map(|p| (p.epoch, p.weights.clone()))
                .collect(),
        )
    }

    /// `"constant"` or `"linear"`: how the weights move between the schedule's points.
    #[getter]
    fn interpolation(&self) -> &'static str {
        match self.core.schedule.as_ref().map(|s| s.interpolation) {
            Some(Interpolation::Linear) => "linear",
            _ => "constant",
        }
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
        // Recorded only when given (a checkpoint of fixed weights records none): points as lists,
        // each source's weight by name, as JSON keeps them.
        if let Some(schedule) = &self.core.schedule {
            let points = PyList::empty(py);
            for point in &schedule.points {
                let weights = PyDict::new(py);
                for (source, weight) in self.core.sources.iter().zip(&point.weights) {
                    weights.set_item(&source.name, weight)?;
                }
                points.append(PyList::new(
                    py,
                    [
                        point.epoch.into_pyobject(py)?.into_any(),
                        weights.into_any(),
                    ],
                )?)?;
            }
            let recorded = PyDict::new(py);
            recorded.set_item("interpolation", self.interpolation())?;
            recorded.set_item("points", points)?;
            d.set_item("schedule", recorded)?;
        }
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
        kwargs.set_item("schedule", self.schedule())?;
        kwargs.set_item("interpolation", self.interpolation())?;
        Ok((args, kwargs))
    }

    fn __repr__(&self) -> String {
        let sources: Vec<String> = self
            .core
            .sources
            .iter()
            .map(|s| format!("{:?}: ({} rows, {})", s.name, s.rows, s.weight))
            .collect();
        let schedule = match self.schedule() {
            Some(points) => format!(
                ", schedule={points:?}, interpolation={:?}",
                self.interpolation()
            ),
            None => String::new(),
        };
        format!(
            "Mixture({{{}}}, unit={:?}, max_repeat={}, epoch_size={:?}{schedule})",
            sources.join(", "),
            self.unit(),
            self.core.max_repeat,
            self.core.epoch_size
        )
    }
}

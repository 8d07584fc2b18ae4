//! `Config`: every planning setting of a `BucketSampler`, extracted and checked once, here, into the
//! core's `Config`. Types are checked here, with a message naming the setting; ranges and the rules
//! between settings are the core's (`Config::validate`), checked when the planner is built. The
//! sampler holds one `Config`, pickles it as its keyword arguments, and records `settings()` in
//! checkpoints.

use dflash_batch_core::{Batching, Config as CoreConfig, Mode, Oversize};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::choices::mode_of;
use crate::errors::{invalid_setting, to_py};
use crate::settings::{is_setting, names, Draft, Recorded, SETTINGS};

/// A sampler's planning settings, checked (frozen: a changed setting is a new `Config`).
#[pyclass(frozen, name = "Config", module = "dflash_batch._core")]
pub(crate) struct Settings {
    pub(crate) core: CoreConfig,
    pub(crate) threads: Option<usize>,
    /// The keyword arguments as checked, plain Python values: what pickling rebuilds from.
    given: Py<PyDict>,
}

#[pymethods]
impl Settings {
    /// Keyword arguments only, each one `BucketSampler` takes (`settings.rs`); one left out takes its
    /// default, and `None` is a value (refused where the setting needs one).
    #[new]
    // <settings> written from _core.SETTINGS: python -m dflash_batch.tools.docs
    #[pyo3(signature = (**kwargs), text_signature = "(*, batch_size=None, max_tokens=None, \
        boundaries='auto', seed=0, shuffle=True, world_size=None, drop_last=False, \
        oversize='error', pad_to_multiple_of=1, threads=None, accumulation=None, \
        target_efficiency=None, order='stratified', cost='tokens', balance_tolerance=None, \
        mode='padded', bucketed=False, trim_steps=False, context_parallel=1, rank_cost=None, \
        whole_steps=False, max_docs_per_row=None)")]
    // </settings>
    fn new(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let empty = PyDict::new(py);
        let kwargs = kwargs.unwrap_or(&empty);
        for key in kwargs.keys() {
            let key = key.extract::<String>()?;
            if !is_setting(&key) {
                return Err(PyTypeError::new_err(format!(
                    "Config() got an unexpected keyword argument '{key}'"
                )));
            }
        }
        let given = PyDict::new(py);
        let mut draft = Draft {
            core: CoreConfig::new(Batching::Rows(1)),
            threads: None,
            batch_size: None,
            max_tokens: None,
            mode: None,
            bucketed: None,
            target_efficiency: None,
        };
        for setting in &SETTINGS {
            let value = kwargs.get_item(setting.name)?;
            (setting.apply)(&mut draft, &given, value.as_ref())?;
        }
        // The rules between settings that one value of the core stands for.
        let mut core = draft.core;
        core.batching =
            Batching::from_options(draft.batch_size, draft.max_tokens).map_err(to_py)?;
        core.mode = mode_of(&given, draft.mode.as_ref(), draft.bucketed.as_ref())?;
        // `None`: the core's default, a function of the mode, the price and the step shape.
        core.target_efficiency_ppm = draft
            .target_efficiency
            .map(CoreConfig::target_efficiency_ppm)
            .transpose()
            .map_err(to_py)?;
        let threads = draft.threads;
        Ok(Self {
            core,
            threads,
            given: given.unbind(),
        })
    }

    /// The settings that shape a plan, as plain values (what a checkpoint records, JSON-ready):
    /// every keyword argument but `threads`, `oversize` as `skip_oversize` and `truncate`,
    /// `boundaries="auto"` as `None`, `cost`'s pair as a list, `rank_cost` only when set.
    fn settings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let given = self.given.bind(py);
        let out = PyDict::new(py);
        for setting in &SETTINGS {
            let key = setting.name;
            let value = given
                .get_item(key)?
                .unwrap_or_else(|| py.None().into_bound(py));
            let skipped = match setting.recorded {
                Recorded::Always => false,
                Recorded::Never => true,
                Recorded::WhenSet => value.is_none(),
                Recorded::UnlessDefault => value.repr()?.to_str()? == setting.default,
            };
            match key {
                _ if skipped => {}
                // The target the default resolved to: what a checkpoint compares.
                "target_efficiency" if value.is_none() => {
                    let ppm = f64::from(self.core.target_efficiency());
                    out.set_item(key, ppm / 1e6)?;
                }
                "oversize" => {
                    out.set_item("skip_oversize", self.core.oversize == Oversize::Skip)?;
                }
                "boundaries" if value.is_instance_of::<PyString>() => {
                    out.set_item(key, py.None())?;
                }
                "cost" | "rank_cost" if value.is_instance_of::<PyTuple>() => {
                    out.set_item(key, PyList::new(py, value.cast::<PyTuple>()?.iter())?)?;
                }
                _ => out.set_item(key, value)?,
            }
        }
        out.set_item("truncate", self.core.oversize == Oversize::Truncate)?;
        Ok(out)
    }

    /// This configuration with some keyword arguments changed (checked again).
    #[pyo3(signature = (**kwargs))]
    fn replace<'py>(
        &self,
        py: Python<'py>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let merged = self.given.bind(py).copy()?;
        if let Some(changes) = kwargs {
            merged.update(changes.as_mapping())?;
        }
        py.get_type::<Self>().call((), Some(&merged))
    }

    /// Pickles as the keyword arguments it was built from.
    fn __getnewargs_ex__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyDict>)> {
        Ok((PyTuple::empty(py), self.given.bind(py).copy()?))
    }

    /// The keyword argument `name` as checked (`None` for one not given a value).
    fn get<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        if !is_setting(name) {
            return Err(invalid_setting(
                "name",
                format!("'{name}' is not a setting; use one of {}", names()),
            ));
        }
        Ok(self
            .given
            .bind(py)
            .get_item(name)?
            .unwrap_or_else(|| py.None().into_bound(py)))
    }

    #[getter]
    fn world_size(&self) -> u32 {
        self.core.world_size
    }

    #[getter]
    fn accumulation(&self) -> u32 {
        self.core.accumulation
    }

    #[getter]
    fn seed(&self) -> u64 {
        self.core.seed
    }

    /// The token budget per batch, or `None` with `batch_size`.
    #[getter]
    fn max_tokens(&self) -> Option<u64> {
        match self.core.batching {
            Batching::Tokens(t) => Some(t),
            Batching::Rows(_) => None,
        }
    }

    /// Ranks each packed row is split over (1: none).
    #[getter]
    fn context_parallel(&self) -> u32 {
        self.core.context_parallel
    }

    /// What every piece of a packed row is padded to a multiple of (1: none; padded batches: 1).
    #[getter]
    fn piece_multiple(&self) -> u64 {
        self.core.piece_multiple()
    }

    /// `"padded"` or `"packed"`.
    #[getter]
    fn mode(&self) -> &'static str {
        match self.core.mode {
            Mode::Padded => "padded",
            Mode::Packed { .. } => "packed",
        }
    }

    /// `"error"`, `"skip"` or `"truncate"`.
    #[getter]
    fn oversize(&self) -> &'static str {
        match self.core.oversize {
            Oversize::Error => "error",
            Oversize::Skip => "skip",
            Oversize::Truncate => "truncate",
        }
    }

    /// The price of a row of padded length `L`, `(a, b)` for `a·L + b·L²` (`(1, 0)`: tokens).
    #[getter]
    fn price(&self) -> (f64, f64) {
        (self.core.cost.linear, self.core.cost.quadratic)
    }

    /// The price ranks are balanced by: `rank_cost` when set, else `price`.
    #[getter]
    fn balance_price(&self) -> (f64, f64) {
        let model = self.core.balance_cost();
        (model.linear, model.quadratic)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("Config({})", self.given.bind(py).repr()?))
    }
}

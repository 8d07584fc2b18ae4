//! The planner's binding: `Planner` (validated lengths + configuration), which makes `Plan`s
//! (`plan.rs`).

use std::sync::{Arc, OnceLock};

use dflash_batch_core::lengths::{scan, Builder, Lengths};
use dflash_batch_core::metrics::Deciles;
use dflash_batch_core::Planner as CorePlanner;
use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::arrays::read_only;
use crate::borrowed::borrowed;
use crate::config::Settings;
use crate::errors::to_py;
use crate::mixture::Mixture;
use crate::plan::Plan;

/// An array a Python caller receives: read-only, owned by Rust.
type Out = Py<PyArray1<u32>>;

/// Runs `$body` with `$slice` bound to the chunk's values as a typed slice, whatever its integer dtype.
macro_rules! with_int_slice {
    ($chunk:expr, $slice:ident => $body:expr) => {{
        let chunk = $chunk;
        with_int_slice!(@try chunk, $slice => $body; u32, u16, i64, i32, u64, i16, u8, i8)
    }};
    (@try $chunk:ident, $slice:ident => $body:expr; $($t:ty),*) => {{
        $(
            if let Ok(array) = $chunk.extract::<PyReadonlyArray1<'_, $t>>() {
                let $slice: &[$t] = array.as_slice().map_err(|_| {
                    PyValueError::new_err(
                        "lengths must be a contiguous array; pass numpy.ascontiguousarray(lengths)",
                    )
                })?;
                return Ok($body);
            }
        )*
        Err(PyTypeError::new_err(
            "lengths must be a 1-D array of integers (int8 to int64, uint8 to uint64)",
        ))
    }};
}

/// Checks one chunk (rows numbered from `first_row`) and returns its longest length and its size.
fn scan_chunk(chunk: &Bound<'_, PyAny>, first_row: usize) -> PyResult<(u32, usize)> {
    with_int_slice!(chunk, values => (scan(values, first_row).map_err(to_py)?, values.len()))
}

/// Appends one chunk, already checked by `scan_chunk`.
fn extend_chunk(chunk: &Bound<'_, PyAny>, builder: &mut Builder) -> PyResult<()> {
    with_int_slice!(chunk, values => builder.extend(values))
}

/// Lengths from 1-D integer numpy arrays: checked first, then stored in the narrowest type, so no
/// temporary full-width copy exists.
pub(crate) fn lengths_from_chunks(chunks: &[Bound<'_, PyAny>]) -> PyResult<Lengths> {
    let (mut longest, mut rows) = (0, 0);
    for chunk in chunks {
        let (chunk_longest, size) = scan_chunk(chunk, rows)?;
        longest = longest.max(chunk_longest);
        rows += size;
    }
    let mut builder = Builder::try_new(longest, rows).map_err(to_py)?;
    for chunk in chunks {
        extend_chunk(chunk, &mut builder)?;
    }
    Ok(builder.finish())
}

/// Plans epochs of one dataset under one configuration (the core `Planner`).
#[pyclass(frozen, name = "Planner", module = "dflash_batch._core")]
pub(crate) struct Planner {
    inner: Arc<CorePlanner>,
    /// Micro-batches per optimizer step: windows of `accumulation × world_size` batches for mixing.
    accumulation: u32,
    /// Token deciles of the lengths, built on the first `Plan.stats()` and shared by every plan.
    deciles: Arc<OnceLock<Deciles>>,
}

#[pymethods]
impl Planner {
    /// `chunks`: 1-D integer numpy arrays whose concatenation is the lengths; `config`: the
    /// settings, checked (`config.rs`); `mixture`: the sources the lengths are, concatenated.
    #[new]
    #[pyo3(signature = (chunks, config, mixture=None))]
    fn new(
        py: Python<'_>,
        chunks: Vec<Bound<'_, PyAny>>,
        config: PyRef<'_, Settings>,
        mixture: Option<PyRef<'_, Mixture>>,
    ) -> PyResult<Self> {
        // A read-only map of a file is borrowed (`borrowed.rs`); anything else is copied.
        let lengths = match &chunks[..] {
            [one] => match borrowed(one)? {
                Some(lengths) => lengths,
                None => lengths_from_chunks(&chunks)?,
            },
            _ => lengths_from_chunks(&chunks)?,
        };
        let (config, threads, accumulation) = (
            config.core.clone(),
            config.threads,
            config.core.accumulation,
        );
        let mixture = mixture.map(|m| m.core.clone());
        let planner = py
            .detach(|| match mixture {
                Some(mixture) => CorePlanner::with_mixture(lengths, config, mixture),
                None => CorePlanner::new(lengths, config),
            })
            .map_err(to_py)?;
        let planner = match threads {
            Some(t) => planner.with_threads(t),
            None => planner,
        };
        Ok(Self {
            inner: Arc::new(planner),
            accumulation,
            deciles: Arc::new(OnceLock::new()),
        })
    }

    /// Plans `epoch` (GIL released).
    fn plan(&self, py: Python<'_>, epoch: u64) -> PyResult<Plan> {
        let inner = Arc::clone(&self.inner);
        let plan = py.detach(move || inner.plan(epoch)).map_err(to_py)?;
        self.wrap(py, plan)
    }

    /// Plans `epoch` once per machine: the first process to ask plans it into a file in `dir`, the
    /// others map that file, checked (see the core's `shared`); the arrays are read-only maps of it
    /// (GIL released while planning or checking).
    fn plan_shared(&self, py: Python<'_>, dir: std::path::PathBuf, epoch: u64) -> PyResult<Plan> {
        let inner = Arc::clone(&self.inner);
        let shared = py
            .detach(move || inner.plan_shared(&dir, epoch))
            .map_err(to_py)?;
        let layout = &shared.layout;
        let offsets = mapped(py, &shared.path, layout.offsets_at, layout.batches + 1)?;
        let indices = mapped(py, &shared.path, layout.indices_at, layout.samples)?;
        // `shared` holds the directory's lock until it is dropped, after both maps: no planner
        // deletes the file between its check and its mapping.
        Plan::new(
            offsets,
            indices,
            (layout.world_size, layout.epoch),
            layout.stats.clone(),
            (Arc::clone(&self.inner), Arc::clone(&self.deciles)),
            self.accumulation as usize * layout.world_size as usize,
        )
        .mapping(&shared.path)
    }

    /// The rest of `epoch` after `step` steps on `old_world` ranks, planned on these ranks, and the
    /// rows carried into the next epoch when the rest cannot fill whole steps (GIL released).
    fn plan_resumed(
        &self,
        py: Python<'_>,
        epoch: u64,
        old_world: u32,
        step: u64,
    ) -> PyResult<(Plan, Py<PyArray1<u32>>)> {
        let inner = Arc::clone(&self.inner);
        let resumed = py
            .detach(move || inner.plan_resumed(epoch, old_world, step))
            .map_err(to_py)?;
        let carried = read_only(PyArray1::from_vec(py, resumed.carried))?;
        Ok((self.wrap(py, resumed.plan)?, carried))
    }

    /// Plans `epoch` over every row plus the rows `carried` from the epoch before (GIL released).
    fn plan_carrying(
        &self,
        py: Python<'_>,
        epoch: u64,
        carried: PyReadonlyArray1<'_, u32>,
    ) -> PyResult<Plan> {
        let carried = crate::arrays::copied(carried.as_slice()?.iter().copied())?;
        let inner = Arc::clone(&self.inner);
        let plan = py
            .detach(move || inner.plan_carrying(epoch, &carried))
            .map_err(to_py)?;
        self.wrap(py, plan)
    }

    /// 64-bit fingerprint of the lengths and configuration as if for one rank (16 hex digits): equal
    /// for any `world_size`, for resuming on another number of ranks.
    #[getter]
    fn fingerprint_any_ranks(&self, py: Python<'_>) -> PyResult<String> {
        self.check_lengths()?;
        let inner = Arc::clone(&self.inner);
        Ok(format!(
            "{:016x}",
            py.detach(move || inner.fingerprint_any_ranks())
        ))
    }

    /// The fingerprint (16 hex digits) these lengths and settings have on `world_size` ranks: what a
    /// checkpoint taken there recorded, for an elastic resume to check.
    fn fingerprint_on(&self, py: Python<'_>, world_size: u32) -> PyResult<String> {
        self.check_lengths()?;
        if world_size == 0 {
            return Err(PyValueError::new_err(
                "world_size=0 is invalid: expected ≥ 1 ranks",
            ));
        }
        let inner = Arc::clone(&self.inner);
        Ok(format!(
            "{:016x}",
            py.detach(move || inner.fingerprint_on(world_size))
        ))
    }

    /// The padding efficiency plans are predicted to measure with the chosen edges.
    /// Steps per rank of every epoch (the same for all epochs; plans epoch 0's draws once if no plan
    /// has yet).
    #[getter]
    fn steps(&self, py: Python<'_>) -> PyResult<u64> {
        self.check_lengths()?;
        let inner = Arc::clone(&self.inner);
        Ok(py.detach(move || inner.steps()))
    }

    /// Borrowed lengths still as borrowed: a `DataError` naming their file when it was truncated or
    /// rewritten since (owned lengths always are).
    fn check_lengths(&self) -> PyResult<()> {
        self.inner.lengths().check().map_err(to_py)
    }

    /// Whether the planner borrows the caller's read-only map of the lengths instead of a copy.
    #[getter]
    fn lengths_borrowed(&self) -> bool {
        self.inner.lengths().is_borrowed()
    }

    #[getter]
    fn predicted_efficiency(&self) -> f64 {
        self.inner.predicted_efficiency()
    }

    /// The bucket edges in use.
    #[getter]
    fn edges(&self) -> Vec<u32> {
        self.inner.buckets().edges().to_vec()
    }

    /// A copy of the planned entries' lengths (with `oversize="truncate"`, every row's first piece,
    /// then the later pieces).
    fn lengths<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let lengths = self.inner.lengths().to_u32_vec().map_err(to_py)?;
        Ok(PyArray1::from_vec(py, lengths))
    }

    /// A copy of the dataset rows' lengths, what the planner was built from (for pickling).
    fn dataset_lengths<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let lengths = self.inner.dataset_lengths().map_err(to_py)?;
        Ok(PyArray1::from_vec(py, lengths))
    }

    /// Whether plans of this configuration on `world_size` ranks changed since planning rules
    /// `revision` (a checkpoint written under it cannot resume: see `PLAN_REVISION`).
    fn plans_changed_since(&self, revision: u32, world_size: u32) -> bool {
        self.inner.plans_changed_since(revision, world_size)
    }

    /// Rows of the dataset (the planned entries less the later pieces of split samples).
    #[getter]
    fn num_samples(&self) -> usize {
        self.inner.samples()
    }

    /// Samples split into pieces (`oversize="truncate"`; else 0).
    #[getter]
    fn truncated(&self) -> u64 {
        self.inner.truncated()
    }

    /// The token windows `(rows, starts, lengths)` of plan `entries` (GIL released).
    fn locate(
        &self,
        py: Python<'_>,
        entries: PyReadonlyArray1<'_, i64>,
    ) -> PyResult<(Out, Out, Out)> {
        let entries = entries.as_slice()?;
        let inner = Arc::clone(&self.inner);
        let (rows, starts, lengths) = py.detach(|| inner.locate(entries)).map_err(to_py)?;
        Ok((
            read_only(PyArray1::from_vec(py, rows))?,
            read_only(PyArray1::from_vec(py, starts))?,
            read_only(PyArray1::from_vec(py, lengths))?,
        ))
    }

    /// 64-bit fingerprint of the lengths and configuration, as 16 hex digits.
    #[getter]
    fn fingerprint(&self, py: Python<'_>) -> PyResult<String> {
        self.check_lengths()?;
        let inner = Arc::clone(&self.inner);
        Ok(format!("{:016x}", py.detach(move || inner.fingerprint())))
    }

    /// Number of samples (rows) planned over.
    fn __len__(&self) -> usize {
        self.inner.lengths().len()
    }
}

/// `count` elements of type `T` at byte `at` of the file at `path`, mapped read-only by numpy.
fn mapped<T: numpy::Element>(
    py: Python<'_>,
    path: &std::path::Path,
    at: u64,
    count: u64,
) -> PyResult<Py<PyArray1<T>>> {
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("dtype", numpy::dtype::<T>(py))?;
    kwargs.set_item("mode", "r")?;
    kwargs.set_item("offset", at)?;
    kwargs.set_item("shape", (count,))?;
    let array = py
        .import("numpy")?
        .getattr("memmap")?
        .call((path,), Some(&kwargs))
        .map_err(|err| {
            // ENOMEM: the map does not fit the address space (`ulimit -v`); say so as the
            // MemoryError every other step that runs out raises.
            let errno = err.value(py).getattr("errno").ok();
            if errno.and_then(|e| e.extract::<i32>().ok()) != Some(12) {
                return err;
            }
            let bytes = count.saturating_mul(std::mem::size_of::<T>() as u64);
            let what = "mapping the shared plan";
            to_py(dflash_batch_core::ErrorKind::OutOfMemory { what, bytes }.into())
        })?;
    Ok(array.cast_into::<PyArray1<T>>()?.unbind())
}

impl Planner {
    /// A core plan as the Python `Plan` (its arrays handed to numpy without a copy).
    fn wrap(&self, py: Python<'_>, plan: dflash_batch_core::Plan) -> PyResult<Plan> {
        let (world_size, epoch) = (plan.world_size(), plan.epoch());
        let (offsets, indices, stats) = plan.into_parts();
        Ok(Plan::new(
            read_only(PyArray1::from_vec(py, offsets))?,
            read_only(PyArray1::from_vec(py, indices))?,
            (world_size, epoch),
            stats,
            (Arc::clone(&self.inner), Arc::clone(&self.deciles)),
            self.accumulation as usize * world_size as usize,
        ))
    }
}

//! The binding of one epoch's plan: CSR arrays handed to numpy without a copy, batch indexing, and
//! the figures of `stats()`.

use std::sync::{Arc, OnceLock};

use dflash_batch_core::metrics::{self, Deciles};
use dflash_batch_core::{Batching, Planner as CorePlanner, Stats};
use numpy::{PyArray1, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::{PyIndexError, PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PySlice};

use crate::errors::to_py;

/// One epoch's batches for all ranks, in training order (CSR). Batch `i` is
/// `indices[offsets[i]:offsets[i+1]]`; step `s` on rank `r` is batch `s * world_size + r`.
#[pyclass(frozen, name = "Plan", module = "dflash_batch._core", sequence)]
pub(crate) struct Plan {
    offsets: Py<PyArray1<u32>>,
    indices: Py<PyArray1<u32>>,
    world_size: u32,
    epoch: u64,
    stats: Stats,
    /// The planner that made it, for the mixing figures (which need the lengths).
    planner: Arc<CorePlanner>,
    deciles: Arc<OnceLock<Deciles>>,
    /// Batches per mixing window: `accumulation × world_size`.
    window: usize,
    /// The shared plan file the arrays map, when they do (`plan_dir`).
    mapped: Option<Mapped>,
}

/// A plan file mapped by a plan's arrays: kept open, so that a truncation after mapping is seen by
/// its size before a batch is read (reading a truncated map's pages ends the process with SIGBUS).
struct Mapped {
    file: std::fs::File,
    path: std::path::PathBuf,
    size: u64,
}

impl Mapped {
    /// A `DataError` when the file is shorter than it was when mapped.
    fn check(&self) -> PyResult<()> {
        let now = self.file.metadata().map_or(0, |m| m.len());
        if now >= self.size {
            return Ok(());
        }
        Err(to_py(
            dflash_batch_core::ErrorKind::SharedPlan {
                path: self.path.display().to_string(),
                problem: dflash_batch_core::SharedProblem::Refused {
                    why: format!(
                        "it was truncated to {now} bytes after this process mapped its {} (reading \
                         the lost pages would end the process with SIGBUS); plan files must not \
                         change while a run maps them",
                        self.size
                    ),
                },
            }
            .into(),
        ))
    }
}

impl Plan {
    /// A plan's arrays (read-only), `(world_size, epoch)`, its stats, the planner and deciles that
    /// made it, and its mixing window in batches.
    pub(crate) fn new(
        offsets: Py<PyArray1<u32>>,
        indices: Py<PyArray1<u32>>,
        (world_size, epoch): (u32, u64),
        stats: Stats,
        (planner, deciles): (Arc<CorePlanner>, Arc<OnceLock<Deciles>>),
        window: usize,
    ) -> Self {
        Self {
            offsets,
            indices,
            world_size,
            epoch,
            stats,
            planner,
            deciles,
            window,
            mapped: None,
        }
    }

    /// The plan whose arrays map the shared plan file at `path` (checked before each batch is read).
    pub(crate) fn mapping(mut self, path: &std::path::Path) -> PyResult<Self> {
        let file = std::fs::File::open(path).map_err(|e| {
            pyo3::exceptions::PyOSError::new_err(format!("{}: {e}", path.display()))
        })?;
        let size = file.metadata().map_or(0, |m| m.len());
        self.mapped = Some(Mapped {
            file,
            path: path.to_path_buf(),
            size,
        });
        Ok(self)
    }

    /// `DataError` when the plan file its arrays map was truncated since (see [`Mapped`]).
    fn check_mapped(&self) -> PyResult<()> {
        self.mapped.as_ref().map_or(Ok(()), Mapped::check)
    }
}

#[pymethods]
impl Plan {
    /// CSR offsets (uint32, `len(plan) + 1` entries), owned by the plan, read-only.
    #[getter]
    fn offsets(&self, py: Python<'_>) -> PyResult<Py<PyArray1<u32>>> {
        self.check_mapped()?;
        Ok(self.offsets.clone_ref(py))
    }

    /// Sample indices of every batch in training order (uint32), read-only.
    #[getter]
    fn indices(&self, py: Python<'_>) -> PyResult<Py<PyArray1<u32>>> {
        self.check_mapped()?;
        Ok(self.indices.clone_ref(py))
    }

    /// Elements of the largest padded batch `rank` runs from step `start` on (rows × longest rounded
    /// up to `pad_to_multiple_of`; 1 when none): the Loader's buffer size.
    fn largest_padded(
        &self,
        py: Python<'_>,
        start: u64,
        rank: u32,
        pad_to_multiple_of: u32,
    ) -> PyResult<u64> {
        let (offsets, indices) = (
            self.offsets.bind(py).readonly(),
            self.indices.bind(py).readonly(),
        );
        let csr = (offsets.as_slice()?, indices.as_slice()?);
        let (world, lengths) = (self.world_size, self.planner.lengths());
        py.detach(|| {
            dflash_batch_core::largest_padded(
                csr,
                world,
                lengths,
                (start, rank),
                pad_to_multiple_of,
            )
        })
        .map_err(to_py)
    }

    /// Ranks the plan was made for.
    #[getter]
    fn world_size(&self) -> u32 {
        self.world_size
    }

    /// The epoch this plan belongs to.
    #[getter]
    fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Steps per rank.
    #[getter]
    fn steps(&self) -> u64 {
        self.stats.steps
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.offsets.bind(py).len() - 1
    }

    /// Batch `i` (negative counts from the end) as a read-only view into `indices`.
    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        i: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let len = self.__len__(py);
        // Past isize either way is out of range, not an OverflowError.
        let i: isize = match i.extract() {
            Ok(i) => i,
            Err(err) if err.is_instance_of::<PyOverflowError>(py) => {
                return Err(PyIndexError::new_err(format!(
                    "batch {i} out of range for a plan of {len} batches"
                )))
            }
            Err(err) => return Err(err),
        };
        let index = if i < 0 { i + len as isize } else { i };
        let index = usize::try_from(index)
            .ok()
            .filter(|&x| x < len)
            .ok_or_else(|| {
                PyIndexError::new_err(format!(
                    "batch {i} out of range for a plan of {len} batches"
                ))
            })?;
        self.check_mapped()?;
        let offsets = self.offsets.bind(py).readonly();
        let offsets = offsets.as_slice()?;
        let (start, end) = (offsets[index], offsets[index + 1]);
        let slice = PySlice::new(
            py,
            to_isize(u64::from(start))?,
            to_isize(u64::from(end))?,
            1,
        );
        self.indices.bind(py).as_any().get_item(slice)
    }

    /// Figures about the plan: batches, steps, samples, real_tokens, padded_tokens (a packed row:
    /// its capacity), efficiency, utilization (real tokens / (batches × max_tokens)), skipped,
    /// dropped, dropped_batches, split_batches, reformed (extra forming passes to keep the shared
    /// step count), buckets, min_rows, max_rows; and, computed on each
    /// call (O(samples), GIL released), window, window_tv and length_gap (with their _tail over the
    /// last tenth of the windows), rank_imbalance_p50/p99/max and
    /// sync_efficiency (per micro-batch) / sync_efficiency_step (per optimizer step), on the
    /// configuration's cost, and end_to_end_efficiency / end_to_end_efficiency_step: useful work over
    /// what the ranks spend, padding and waiting included. Packed rows whose samples are padded to a
    /// multiple add piece_padding_tokens; under context parallelism also context_parallel,
    /// cp_spread_zigzag and cp_spread_contiguous (the attention a row's slowest rank does over
    /// the mean, less 1, summed over rows).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let offsets = self.offsets.bind(py).readonly();
        let indices = self.indices.bind(py).readonly();
        let csr = (offsets.as_slice()?, indices.as_slice()?);
        let (planner, deciles, window) = (&self.planner, &self.deciles, self.window);
        let report = py
            .detach(|| metrics::report(planner, deciles, csr, (self.epoch, window)))
            .map_err(to_py)?;
        let s = &self.stats;
        let d = PyDict::new(py);
        for (key, value) in [
            ("batches", s.batches),
            ("steps", s.steps),
            ("samples", s.samples),
            ("real_tokens", s.real_tokens),
            ("padded_tokens", s.padded_tokens),
            ("skipped", s.skipped),
            ("dropped", s.dropped),
            ("dropped_batches", s.dropped_batches),
            ("split_batches", s.split_batches),
            ("reformed", s.reformed),
            ("buckets", s.buckets),
            ("min_rows", s.min_rows),
            ("max_rows", s.max_rows),
        ] {
            d.set_item(key, value)?;
        }
        d.set_item("efficiency", s.efficiency())?;
        // Real tokens over the token budget of every batch (for packed rows: their capacity).
        let utilization = match self.planner.config().batching {
            // Token counts stay far below 2^53.
            #[allow(clippy::cast_precision_loss)]
            Batching::Tokens(t) if s.batches > 0 => {
                Some(s.real_tokens as f64 / (s.batches as f64 * t as f64))
            }
            _ => None,
        };
        d.set_item("utilization", utilization)?;
        // The price the ranks were balanced by (and the balance figures predicted under): rank_cost, a
        // StepTimer's refit, or cost.
        let price = self.planner.config().balance_cost();
        d.set_item("rank_price", (price.linear, price.quadratic))?;
        d.set_item("world_size", self.world_size)?;
        d.set_item("epoch", self.epoch)?;
        d.set_item("window", self.window)?;
        let mixing = report.mixing;
        d.set_item("window_tv", mixing.map(|m| m.window_tv))?;
        d.set_item("window_tv_tail", mixing.map(|m| m.window_tv_tail))?;
        d.set_item("length_gap", mixing.map(|m| m.length_gap))?;
        d.set_item("length_gap_tail", mixing.map(|m| m.length_gap_tail))?;
        let imbalance = report.imbalance;
        d.set_item("rank_imbalance_p50", imbalance.map(|i| i.p50))?;
        d.set_item("rank_imbalance_p99", imbalance.map(|i| i.p99))?;
        d.set_item("rank_imbalance_max", imbalance.map(|i| i.max))?;
        let sync = report.synchronous;
        d.set_item("sync_efficiency", sync.map(|s| s.per_micro_batch))?;
        d.set_item("sync_efficiency_step", sync.map(|s| s.per_optimizer_step))?;
        let end = report.end_to_end;
        d.set_item("end_to_end_efficiency", end.map(|s| s.per_micro_batch))?;
        d.set_item(
            "end_to_end_efficiency_step",
            end.map(|s| s.per_optimizer_step),
        )?;
        // Context parallelism: the padding the pieces take (counted as waste in efficiency), and how
        // evenly each layout shares a row's attention among its ranks (`metrics/context_parallel.rs`).
        let config = self.planner.config();
        if config.piece_multiple() > 1 {
            d.set_item("piece_padding_tokens", report.piece_padding)?;
        }
        if config.context_parallel > 1 {
            let cp = report.context_parallel;
            d.set_item("context_parallel", config.context_parallel)?;
            d.set_item("cp_spread_zigzag", cp.map(|c| c.zigzag))?;
            d.set_item("cp_spread_contiguous", cp.map(|c| c.contiguous))?;
        }
        if let (Some(figures), Some(mixture)) = (report.sources, self.planner.mixture()) {
            let sources = PyDict::new(py);
            let weights = mixture.weights_at(self.epoch);
            for ((part, source), weight) in figures.parts.iter().zip(&mixture.sources).zip(weights)
            {
                let one = PyDict::new(py);
                one.set_item("samples", part.samples)?;
                one.set_item("tokens", part.tokens)?;
                one.set_item("share", part.share)?;
                one.set_item("weight", weight)?;
                sources.set_item(&source.name, one)?;
            }
            d.set_item("sources", sources)?;
            d.set_item("source_tv", figures.source_tv)?;
        }
        Ok(d)
    }

    /// The share of sample pairs sharing a batch in this plan that share one again in `other` (a plan
    /// of the same planner, e.g. the next epoch); `None` when this plan has no batch of two.
    fn churn(&self, py: Python<'_>, other: &Plan) -> PyResult<Option<f64>> {
        let (a_offsets, a_indices) = (
            self.offsets.bind(py).readonly(),
            self.indices.bind(py).readonly(),
        );
        let (b_offsets, b_indices) = (
            other.offsets.bind(py).readonly(),
            other.indices.bind(py).readonly(),
        );
        let a = (a_offsets.as_slice()?, a_indices.as_slice()?);
        let b = (b_offsets.as_slice()?, b_indices.as_slice()?);
        let samples = self.planner.lengths().len();
        if other.planner.lengths().len() != samples {
            return Err(PyValueError::new_err(
                "the plans cover different datasets; churn compares two plans of the same lengths",
            ));
        }
        py.detach(|| metrics::churn(a, b, samples)).map_err(to_py)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Plan(epoch={}, batches={}, steps={}, world_size={}, efficiency={:.4})",
            self.epoch,
            self.__len__(py),
            self.stats.steps,
            self.world_size,
            self.stats.efficiency()
        )
    }
}

fn to_isize(v: u64) -> PyResult<isize> {
    isize::try_from(v).map_err(|_| PyValueError::new_err("offset exceeds the address space"))
}

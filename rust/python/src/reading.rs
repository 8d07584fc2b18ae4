//! The Arrow readers' binding: `read_lengths` and `TokenStore`, over files or a table in memory.
//! Files are given as a list of paths; resolving directories, globs and `datasets` objects into that
//! list (or table) is Python's job (`dflash_batch/data/sources.py`).

use std::path::PathBuf;

use dflash_batch_core::pool::PrivatePool;
use dflash_batch_core::{
    each_token, token_types, Gathered, MaskKind, TokenStore as CoreStore, Tokens,
};
use numpy::ndarray::ArrayView1;
use numpy::{Element, PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::arrays::{copied, read_only};
use crate::errors::to_py;
use crate::table::Table;

/// Runs `$body` with `$rows` bound to `$indices` as a typed slice, for the index dtypes numpy and
/// the sampler produce; anything else is a `TypeError`.
macro_rules! with_index_slice {
    ($indices:expr, $rows:ident => $body:expr) => {{
        let indices = $indices;
        with_index_slice!(@try indices, $rows => $body; u32, i64, u64, i32)
    }};
    (@try $indices:ident, $rows:ident => $body:expr; $($t:ty),*) => {{
        $(
            if let Ok(array) = $indices.extract::<::numpy::PyReadonlyArray1<'_, $t>>() {
                let $rows: Vec<$t> = $crate::arrays::copied(array.as_array().iter().copied())?;
                let $rows = &$rows[..];
                return Ok($body);
            }
        )*
        Err(::pyo3::exceptions::PyTypeError::new_err(
            "indices must be a 1-D array of int32, int64, uint32 or uint64 row numbers",
        ))
    }};
}

/// Calls the optional Python progress callback with the number of files done, from a thread that
/// does not hold the GIL. The callback's first exception is kept and raised when the read ends.
struct Progress<'a> {
    callback: Option<&'a Py<PyAny>>,
    error: Option<PyErr>,
}

impl<'a> Progress<'a> {
    fn new(callback: Option<&'a Py<PyAny>>) -> Self {
        Self {
            callback,
            error: None,
        }
    }

    fn report(&mut self, done: usize) {
        if let (Some(callback), None) = (self.callback, &self.error) {
            self.error = Python::attach(|py| callback.call1(py, (done,)).err());
        }
    }

    fn finish<T>(self, result: PyResult<T>) -> PyResult<T> {
        match self.error {
            Some(e) => Err(e),
            None => result,
        }
    }
}

/// The length of every row of `paths` (in order) from `column`: an integer column, or a list column
/// whose offsets give the lengths; with `rows`, of those rows. Returns a read-only `uint32` array
/// owned by Rust.
#[pyfunction]
#[pyo3(signature = (paths, column, rows=None, progress=None))]
pub(crate) fn read_lengths(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    column: &str,
    rows: Option<PyReadonlyArray1<'_, u64>>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyArray1<u32>>> {
    let rows = rows
        .map(|r| copied(r.as_array().iter().copied()))
        .transpose()?;
    let mut reporter = Progress::new(progress.as_ref());
    let result = py.detach(|| {
        dflash_batch_core::read_lengths(&paths, column, rows.as_deref(), |done| {
            reporter.report(done)
        })
    });
    let lengths = reporter.finish(result.map_err(to_py))?;
    read_only(PyArray1::from_vec(py, lengths))
}

/// [`read_lengths`] for a table in memory (see `table.rs`).
#[pyfunction]
#[pyo3(signature = (table, column, rows=None))]
pub(crate) fn read_table_lengths(
    py: Python<'_>,
    table: Table,
    column: &str,
    rows: Option<PyReadonlyArray1<'_, u64>>,
) -> PyResult<Py<PyArray1<u32>>> {
    let rows = rows
        .map(|r| copied(r.as_array().iter().copied()))
        .transpose()?;
    let lengths = py
        .detach(|| {
            dflash_batch_core::table_lengths(&table.schema, &table.batches, column, rows.as_deref())
        })
        .map_err(to_py)?;
    read_only(PyArray1::from_vec(py, lengths))
}

/// A token column kept memory-mapped (the core `TokenStore`). Rows are read-only numpy views into
/// the mapped files; the store keeps the files mapped while any view is alive.
#[pyclass(frozen, name = "TokenStore", module = "dflash_batch._core")]
pub(crate) struct TokenStore {
    pub(crate) store: CoreStore,
    /// Threads that collation splits large batches over (see `collating.rs`).
    pub(crate) pool: PrivatePool,
}

#[pymethods]
impl TokenStore {
    /// `mask=True`: the column is a loss mask (integers or bools; floats refused).
    #[new]
    #[pyo3(signature = (paths, column, rows=None, progress=None, mask=false))]
    fn new(
        py: Python<'_>,
        paths: Vec<PathBuf>,
        column: &str,
        rows: Option<PyReadonlyArray1<'_, u64>>,
        progress: Option<Py<PyAny>>,
        mask: bool,
    ) -> PyResult<Self> {
        let rows = rows
            .map(|r| copied(r.as_array().iter().copied()))
            .transpose()?;
        let mut reporter = Progress::new(progress.as_ref());
        let result = py.detach(|| {
            let report = |done| reporter.report(done);
            if mask {
                CoreStore::open_mask(&paths, column, rows, report)
            } else {
                CoreStore::open(&paths, column, rows, report)
            }
        });
        Ok(Self::over(reporter.finish(result.map_err(to_py))?))
    }

    /// The store over column `column` of a table in memory (see `table.rs`), sharing its buffers.
    #[staticmethod]
    #[pyo3(signature = (table, column, rows=None, mask=false))]
    fn from_table(
        py: Python<'_>,
        table: Table,
        column: &str,
        rows: Option<PyReadonlyArray1<'_, u64>>,
        mask: bool,
    ) -> PyResult<Self> {
        let rows = rows
            .map(|r| copied(r.as_array().iter().copied()))
            .transpose()?;
        let store = py
            .detach(|| {
                if mask {
                    CoreStore::mask_from_table(&table.schema, &table.batches, column, rows)
                } else {
                    CoreStore::from_table(&table.schema, &table.batches, column, rows)
                }
            })
            .map_err(to_py)?;
        Ok(Self::over(store))
    }

    /// The store over rows given flat: `tokens` (any token dtype) and the `rows + 1` int64
    /// `offsets` delimiting them (both copied).
    #[staticmethod]
    fn from_rows(
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        offsets: PyReadonlyArray1<'_, i64>,
    ) -> PyResult<Self> {
        let tokens = gathered(tokens)?;
        let offsets = copied(offsets.as_array().iter().copied())?;
        let store = py
            .detach(|| CoreStore::from_rows(tokens, offsets))
            .map_err(to_py)?;
        Ok(Self::over(store))
    }

    fn __len__(&self) -> usize {
        self.store.len()
    }

    /// The stores `parts` as one (rows of the first, then the second, ...), each named in `names`
    /// for messages: one token type and the same loss mask, or a `DataError` naming the source.
    #[staticmethod]
    fn concat(py: Python<'_>, names: Vec<String>, parts: Vec<PyRef<'_, Self>>) -> PyResult<Self> {
        if names.len() != parts.len() {
            return Err(PyValueError::new_err("concat takes one name per store"));
        }
        let named: Vec<(&str, &CoreStore)> = names
            .iter()
            .map(String::as_str)
            .zip(parts.iter().map(|p| &p.store))
            .collect();
        let store = py.detach(|| CoreStore::concat(&named)).map_err(to_py)?;
        Ok(Self::over(store))
    }

    /// This store with `mask` (a store over the same rows) as its loss mask, which every collation
    /// applies: `kind` is `"labels"` (-100 ignored) or `"binary"` (0 ignored).
    fn with_mask(&self, py: Python<'_>, mask: PyRef<'_, Self>, kind: &str) -> PyResult<Self> {
        let kind = match kind {
            "labels" => MaskKind::Labels,
            "binary" => MaskKind::Binary,
            other => {
                return Err(PyValueError::new_err(format!(
                    "mask kind {other:?} is invalid; use 'labels' or 'binary'"
                )))
            }
        };
        let (store, column) = (self.store.clone(), mask.store.clone());
        let store = py.detach(|| store.with_mask(column, kind)).map_err(to_py)?;
        Ok(Self::over(store))
    }

    /// Label tokens of each entry: row `indices[e]`, or its window `starts[e]`, `lengths[e]` (see
    /// the core's `TokenStore::label_counts`), as a new `uint32` array.
    #[pyo3(signature = (indices, starts=None, lengths=None))]
    fn label_counts(
        &self,
        py: Python<'_>,
        indices: PyReadonlyArray1<'_, u64>,
        starts: Option<PyReadonlyArray1<'_, u32>>,
        lengths: Option<PyReadonlyArray1<'_, u32>>,
    ) -> PyResult<Py<PyArray1<u32>>> {
        let indices = copied(indices.as_array().iter().copied())?;
        let starts = starts
            .map(|a| copied(a.as_array().iter().copied()))
            .transpose()?;
        let lengths = lengths
            .map(|a| copied(a.as_array().iter().copied()))
            .transpose()?;
        let windows = starts.as_deref().zip(lengths.as_deref());
        let counts = py
            .detach(|| self.store.label_counts(&indices, windows))
            .map_err(to_py)?;
        read_only(PyArray1::from_vec(py, counts))
    }

    /// Tokens per row, as a new read-only `uint32` array.
    fn lengths(&self, py: Python<'_>) -> PyResult<Py<PyArray1<u32>>> {
        read_only(PyArray1::from_vec(
            py,
            copied(self.store.lengths().iter().copied())?,
        ))
    }

    /// The numpy dtype name of the tokens, e.g. `int32` or `uint16`.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.store.dtype()
    }

    /// Row `index`'s tokens: a read-only view into the mapped file (no copy).
    fn __getitem__<'py>(slf: Bound<'py, Self>, index: i64) -> PyResult<Bound<'py, PyAny>> {
        let owner = slf.clone().into_any();
        each_token!(Tokens, slf.get().store.get(index).map_err(to_py)?, t => view(t, owner))
    }

    /// The tokens of `indices` (a 1-D array of any integer type; negative counts from the end)
    /// concatenated, and the `len(indices) + 1` int64 offsets delimiting each row: both new arrays,
    /// owned by the caller. Runs without the GIL.
    fn gather<'py>(
        &self,
        py: Python<'py>,
        indices: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let (tokens, offsets) = gather_any(py, &self.store, indices)?.map_err(to_py)?;
        let tokens = each_token!(Gathered, tokens, t => PyArray1::from_vec(py, t).into_any());
        PyTuple::new(py, [tokens, PyArray1::from_vec(py, offsets).into_any()])
    }
}

impl TokenStore {
    fn over(store: CoreStore) -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
        Self {
            store,
            pool: PrivatePool::new(threads),
        }
    }
}

/// A 1-D numpy array of any token dtype, copied.
fn gathered(tokens: &Bound<'_, PyAny>) -> PyResult<Gathered> {
    macro_rules! extract {
        ($($v:ident $t:ident $arrow:ident $name:literal),*) => {
            $(if let Ok(t) = tokens.extract::<PyReadonlyArray1<'_, $t>>() {
                return Ok(Gathered::$v(copied(t.as_array().iter().copied())?));
            })*
        };
    }
    token_types!(extract);
    Err(pyo3::exceptions::PyTypeError::new_err(
        "tokens must be a 1-D array of token ids (int8 to int64, uint8 to uint32, float32 or float64)",
    ))
}

/// The document boundaries of Megatron datasets `paths`, as a read-only `uint64` array: sequence
/// numbers rising from 0 to the sequence count, in one row space over all the pairs.
#[pyfunction]
pub(crate) fn read_documents(py: Python<'_>, paths: Vec<PathBuf>) -> PyResult<Py<PyArray1<u64>>> {
    let boundaries = py
        .detach(|| dflash_batch_core::read_documents(&paths))
        .map_err(to_py)?;
    read_only(PyArray1::from_vec(py, boundaries))
}

/// [`CoreStore::gather`] for indices of any supported dtype (the outer error is a wrong dtype).
fn gather_any(
    py: Python<'_>,
    store: &CoreStore,
    indices: &Bound<'_, PyAny>,
) -> PyResult<dflash_batch_core::Result<(Gathered, Vec<i64>)>> {
    with_index_slice!(indices, rows => py.detach(|| store.gather(rows)))
}

/// A read-only numpy view of `tokens`, which borrows from memory that `owner` keeps alive.
fn view<'py, T: Element>(tokens: &[T], owner: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = owner.py();
    let array = ArrayView1::from(tokens);
    // SAFETY: `tokens` lies in a memory map held by the store's record-batch buffers. The store is a
    // frozen pyclass that never mutates or drops them, and `owner` (the store) becomes the array's
    // base object, so the map outlives the array. The map is read-only, so the view is made
    // read-only too: numpy must not write through it.
    #[allow(unsafe_code)]
    let array = unsafe { PyArray1::borrow_from_array(&array, owner) };
    Ok(read_only(array)?.into_bound(py).into_any())
}

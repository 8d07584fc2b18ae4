//! Lengths the planner borrows instead of copying: a `numpy.memmap` opened read-only (`mode="r"`, or
//! `numpy.load(path, mmap_mode="r")`), or a read-only view of one. Every rank of a machine that maps
//! the same file shares one copy in the page cache, where each would otherwise keep its own (2 bytes a
//! sample at `uint16`: 2 GB at a billion samples).
//!
//! Only a map nothing in this process can write is borrowed: the array and every array it views are
//! read-only, and the memory under them is a read-only buffer (a writable array made read-only can be
//! made writable again, and a copy-on-write map is writable). Everything else is copied, as before.
//! The file is opened here too, so every planning call first checks it was not truncated or rewritten
//! (the core's `FileGuard`): a change between calls is an error naming the file, not a SIGBUS or plans
//! of other lengths. A change racing a planning call already running is not excluded (as for the
//! token store's maps: `docs/reading.md`).

use std::path::PathBuf;
use std::sync::Arc;

use dflash_batch_core::lengths::{Borrowed, Lengths};
use dflash_batch_core::read::guard::FileGuard;
use numpy::{Element, PyReadonlyArray1, PyUntypedArray};
use pyo3::prelude::*;

use crate::errors::to_py;

/// A read-only mapped array's values, kept alive (and unmoved) by the reference to the array.
#[derive(Debug)]
struct Mapped<T> {
    /// Holds the map: a numpy array never moves or frees its data while referenced, and one that is
    /// referenced cannot be resized.
    _array: Py<PyAny>,
    start: *const T,
    len: usize,
    guard: FileGuard,
}

// SAFETY: `start..start + len` is read-only memory owned by `_array`, which lives as long as this
// value; reading it from any thread is sound (nothing in the process writes it: see the module docs).
#[allow(unsafe_code)]
unsafe impl<T: Sync> Send for Mapped<T> {}
// SAFETY: as above; shared references only read.
#[allow(unsafe_code)]
unsafe impl<T: Sync> Sync for Mapped<T> {}

impl<T: Sync + std::fmt::Debug> Borrowed<T> for Mapped<T> {
    fn values(&self) -> &[T] {
        // SAFETY: see the `Send` impl: valid, aligned (numpy's own slice), and never written.
        #[allow(unsafe_code)]
        let values = unsafe { std::slice::from_raw_parts(self.start, self.len) };
        values
    }

    fn check(&self) -> dflash_batch_core::Result<()> {
        self.guard.check()
    }
}

/// The lengths of `chunk` borrowed, when it is a read-only map of a file (see the module docs) of
/// `uint16` or `uint32`; `None` when it must be copied.
pub(crate) fn borrowed(chunk: &Bound<'_, PyAny>) -> PyResult<Option<Lengths>> {
    let Some(file) = read_only_map(chunk)? else {
        return Ok(None);
    };
    if let Some(lengths) = borrow::<u16>(chunk, &file, Lengths::borrow_u16)? {
        return Ok(Some(lengths));
    }
    borrow::<u32>(chunk, &file, Lengths::borrow_u32)
}

/// `chunk` borrowed as `T` lengths, if it holds `T` contiguously.
fn borrow<T: Element + Sync + std::fmt::Debug + 'static>(
    chunk: &Bound<'_, PyAny>,
    file: &std::path::Path,
    make: fn(Arc<dyn Borrowed<T>>) -> dflash_batch_core::Result<Lengths>,
) -> PyResult<Option<Lengths>> {
    let Ok(array) = chunk.extract::<PyReadonlyArray1<'_, T>>() else {
        return Ok(None);
    };
    let Ok(values) = array.as_slice() else {
        return Ok(None);
    };
    let guard = FileGuard::open(file).map_err(to_py)?;
    let mapped = Mapped {
        _array: chunk.clone().unbind(),
        start: values.as_ptr(),
        len: values.len(),
        guard,
    };
    make(Arc::new(mapped)).map(Some).map_err(to_py)
}

/// The file under `chunk` when it is a numpy array that nothing in this process can write, viewing
/// (through read-only arrays) a `numpy.memmap` of that file over a read-only buffer.
fn read_only_map(chunk: &Bound<'_, PyAny>) -> PyResult<Option<PathBuf>> {
    if chunk.cast::<PyUntypedArray>().is_err() {
        return Ok(None);
    }
    let py = chunk.py();
    let ndarray = py.import("numpy")?.getattr("ndarray")?;
    let memmap = py.import("numpy")?.getattr("memmap")?;
    let mut file = None;
    let mut array = chunk.clone();
    loop {
        if array
            .getattr("flags")?
            .getattr("writeable")?
            .extract::<bool>()?
        {
            return Ok(None);
        }
        if array.is_instance(&memmap)? && file.is_none() {
            let name = array.getattr("filename")?;
            if !name.is_none() {
                file = Some(name.extract::<PathBuf>()?);
            }
        }
        let base = array.getattr("base")?;
        if base.is_none() {
            // The array owns its memory: making it read-only can be undone.
            return Ok(None);
        }
        if base.is_instance(&ndarray)? {
            array = base;
            continue;
        }
        // The buffer under the arrays (an `mmap.mmap` for a memmap): read-only, or not borrowed.
        let view = py
            .import("builtins")?
            .getattr("memoryview")?
            .call1((&base,));
        let read_only = match view {
            Ok(view) => view.getattr("readonly")?.extract::<bool>()?,
            Err(_) => false,
        };
        return Ok(file.filter(|_| read_only));
    }
}

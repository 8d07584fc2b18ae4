//! Mapped files that change under the map: a truncated file makes the kernel kill the process on the
//! next read of a lost page (SIGBUS), and one rewritten in place silently changes what a mapped row
//! holds. So each mapped file keeps its open handle, size and modification time, and every read of
//! rows (collating, gathering, a row view, counting labels) first checks the files it will touch —
//! one `fstat` per distinct file of the call — and fails with a [`ReadProblem::Changed`] naming the file
//! instead.
//!
//! A check is one `statx` per distinct file of a call (~0.2 µs: under 1% of the Loader's time per
//! 16K-token batch, a few percent of the bare Rust collation). What it excludes is a change made while
//! nothing reads — during a trainer's step, between epochs, in a paused run: the next read fails. A
//! change racing a read already running (the Loader's worker copying a batch at that very moment) is
//! not excluded: no mapping API can exclude it, short of copying every batch out of the page cache
//! twice (a `pread` of each row would cost about half of the collation itself). Files must still be
//! treated as immutable while a store maps them; this turns the common mistake — re-running a
//! tokenizer that writes into the same files mid-run — into an error instead of a signal or changed
//! rows.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::error::read::{io_problem, ReadProblem};
use crate::error::ErrorKind;

/// One mapped file as it was when it was mapped.
#[derive(Debug)]
pub struct FileGuard {
    path: PathBuf,
    file: File,
    len: u64,
    modified: Option<SystemTime>,
}

impl FileGuard {
    /// Records `file` (open, at `path`) as mapped now with `len` bytes.
    pub(crate) fn new(path: &Path, file: File, len: u64, modified: Option<SystemTime>) -> Self {
        Self {
            path: path.to_path_buf(),
            file,
            len,
            modified,
        }
    }

    /// Records the file at `path` as it is now: for a map made elsewhere (a caller's `numpy.memmap`
    /// of lengths the planner borrows), opened here to be checked as this crate's own maps are.
    ///
    /// # Errors
    /// [`ErrorKind::Read`] when the file cannot be opened or inspected.
    pub fn open(path: &Path) -> crate::error::Result<Self> {
        let failed = |e: std::io::Error| -> crate::error::Error {
            ErrorKind::Read {
                path: path.display().to_string(),
                problem: io_problem(e),
            }
            .into()
        };
        let file = File::open(path).map_err(failed)?;
        let meta = file.metadata().map_err(failed)?;
        Ok(Self::new(path, file, meta.len(), meta.modified().ok()))
    }

    /// Whether the file still has the size and modification time it was mapped with.
    ///
    /// # Errors
    /// [`ErrorKind::Read`] with [`ReadProblem::Changed`] naming the file and what changed.
    pub fn check(&self) -> crate::error::Result<()> {
        let problem = match self.file.metadata() {
            Err(e) => ReadProblem::Changed {
                detail: format!("it cannot be checked any more ({e})"),
            },
            Ok(meta) if meta.len() < self.len => ReadProblem::Changed {
                detail: format!(
                    "it was {} bytes when mapped and is {} now",
                    self.len,
                    meta.len()
                ),
            },
            Ok(meta) if meta.len() != self.len || meta.modified().ok() != self.modified => {
                ReadProblem::Changed {
                    detail: "it was rewritten after it was mapped".into(),
                }
            }
            Ok(_) => return Ok(()),
        };
        let path = self.path.display().to_string();
        Err(ErrorKind::Read { path, problem }.into())
    }
}

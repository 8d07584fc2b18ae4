//! A private rayon pool that survives `fork`.
//!
//! The global rayon pool cannot be used: after a `fork` (torch DataLoader workers) the child inherits
//! the pool's bookkeeping but not its threads, and the first parallel call waits forever. A private
//! pool records the process that built it and is rebuilt in any other process.

use std::sync::{Arc, Mutex, PoisonError};

/// A lazily built pool of `threads` threads (none for 1: work runs on the calling thread).
#[derive(Debug)]
pub struct PrivatePool {
    threads: usize,
    slot: Mutex<Option<(u32, Arc<rayon::ThreadPool>)>>,
}

impl PrivatePool {
    /// A pool of `threads` threads, built on first use.
    pub fn new(threads: usize) -> Self {
        Self {
            threads: threads.max(1),
            slot: Mutex::new(None),
        }
    }

    /// Threads the pool runs (1 = the calling thread).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The pool for this process, building it if needed; `None` means run on the calling thread (one
    /// thread asked for, or the OS refused threads).
    pub fn get(&self) -> Option<Arc<rayon::ThreadPool>> {
        if self.threads <= 1 {
            return None;
        }
        let pid = std::process::id();
        let mut guard = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        match guard.as_ref() {
            Some((owner, pool)) if *owner == pid => return Some(Arc::clone(pool)),
            // Inherited across a fork: its threads do not exist here, and dropping it would touch
            // locks a parent thread may have held at the fork. Leak it instead (once per fork).
            Some(_) => std::mem::forget(guard.take()),
            None => {}
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(self.threads)
            .build()
            .ok()?;
        let pool = Arc::new(pool);
        *guard = Some((pid, Arc::clone(&pool)));
        Some(pool)
    }
}

//! One plan per node: the ranks of a machine share each epoch's plan through a file instead of
//! each planning it (at 1B samples a plan is ~5 GB and ~10 s of CPU; eight ranks would pay it eight
//! times).
//!
//! The protocol, run by every rank in [`Planner::plan_shared`]:
//!
//! 1. Take the directory's lock for this planner (`dflash-<fingerprint>.lock`, a `flock`, released
//!    by the kernel when its holder dies, even under `kill -9`) shared with other finders.
//! 2. If the epoch's file exists, check it (`file.rs`: what it is, that it is whole) and use it;
//!    a file there that is not this plan is refused, never re-planned over. Finders check side by
//!    side: at 100M samples a check reads ~0.5 GB, and seven in a row would cost seconds.
//! 3. Else take the lock alone; if the file appeared meanwhile, go back to 1; else plan the epoch,
//!    write it to a temporary name, `fsync` and rename it into place — a
//!    rename is atomic, so a planner killed at any moment leaves either no file or a whole one —
//!    and delete this planner's files of epochs before the previous one (a rank may still be
//!    finishing that one while the next is planned ahead) and any temporary a dead writer left.
//! 4. Return with the lock still held: the caller maps the file, then drops the lock, so no
//!    planner deletes a file between its check and its mapping.
//!
//! Whoever takes the lock first plans; the rest find the file. No process group is needed, so the
//! same works under torchrun, a launcher of independent processes, or a DataLoader's workers.
//! Plans are pure functions of their key, so two files of one key are the same bytes: a file left
//! by an earlier run of the same data and settings is that plan, and is used.

mod file;
mod open;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::{ErrorKind, Result, SharedProblem};
use crate::memory;
use crate::plan::planner::Planner;
use crate::plan::revision::PLAN_REVISION;
use file::Key;
pub use file::Layout;

/// An epoch's plan in a shared file, checked, with the directory's lock held until it is dropped.
#[derive(Debug)]
pub struct SharedPlan {
    /// The plan file.
    pub path: PathBuf,
    /// Where its arrays lie, and the plan's figures.
    pub layout: Layout,
    /// Whether this call planned and wrote it (else another process, or an earlier run, had).
    pub planned: bool,
    /// Held until the caller has mapped the file (see the module docs).
    _lock: File,
}

impl Planner {
    /// The plan of `epoch`, shared through `dir` with every process that plans the same data and
    /// settings there (see the module docs): planned and written by the first to ask, found and
    /// checked by the rest.
    pub fn plan_shared(&self, dir: &Path, epoch: u64) -> Result<SharedPlan> {
        self.lengths().check()?;
        let key = Key {
            fingerprint: self.fingerprint(),
            revision: PLAN_REVISION,
            epoch,
            world_size: self.config().world_size,
            rows: self.lengths().len() as u64,
        };
        std::fs::create_dir_all(dir).map_err(io(dir, "create the plan directory"))?;
        let stem = format!("dflash-{:016x}", key.fingerprint);
        let lock_path = dir.join(format!("{stem}.lock"));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            // A FIFO at the lock's name would block here (`file::open_regular`).
            .custom_flags(open::NONBLOCK)
            .open(&lock_path)
            .map_err(io(&lock_path, "open the lock file"))?;
        if !lock.metadata().is_ok_and(|m| m.is_file()) {
            return Err(refused(
                &lock_path,
                "it is not a regular file; remove it".into(),
            ));
        }
        let path = dir.join(format!("{stem}{}{epoch}.plan", current()));
        // Allocated where running out is an error, not an abort (`memory.rs`).
        let mut block = memory::vec_with_capacity("reading or writing a shared plan", file::BLOCK)?;
        block.resize(file::BLOCK, 0);
        // Finders share the lock, so they check a published file side by side; a planner holds it
        // alone. Whoever finds no file under the shared lock asks for it alone, and if the file
        // appeared meanwhile (another planner's), goes back to finding it side by side.
        loop {
            lock.lock_shared().map_err(io(&lock_path, "lock"))?;
            match file::check(&path, &key, &mut block) {
                Ok(Ok(layout)) => {
                    return Ok(SharedPlan {
                        path,
                        layout,
                        planned: false,
                        _lock: lock,
                    })
                }
                Ok(Err(why)) => return Err(refused(&path, why)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
                    return Err(refused(&path, e.to_string()))
                }
                Err(e) => return Err(io(&path, "read")(e)),
            }
            lock.unlock().map_err(io(&lock_path, "unlock"))?;
            lock.lock().map_err(io(&lock_path, "lock"))?;
            if !path.try_exists().map_err(io(&path, "read"))? {
                break;
            }
            lock.unlock().map_err(io(&lock_path, "unlock"))?;
        }
        let plan = self.plan(epoch)?;
        let temporary = dir.join(format!("{stem}-e{epoch}.tmp-{}", std::process::id()));
        file::write(&temporary, &key, &plan, &mut block)
            .and_then(|()| std::fs::rename(&temporary, &path))
            .map_err(|e| {
                // Best effort: a temporary is never read, and the next planner removes it too.
                let _ = std::fs::remove_file(&temporary);
                io(&path, "write")(e)
            })?;
        tidy(dir, &stem, epoch);
        let layout = Layout::of_plan(&plan, &key);
        Ok(SharedPlan {
            path,
            layout,
            planned: true,
            _lock: lock,
        })
    }
}

/// What follows a planner's stem in the names of the plan files this version writes, before the
/// epoch: the planning rules and the file format. A file another version wrote is then never found
/// (and planned over: it is not refused as a foreign file), only tidied away.
fn current() -> String {
    format!("-r{PLAN_REVISION}-f{}-e", file::FORMAT)
}

/// Deletes this planner's plan files of epochs before `epoch - 1`, those of other rules or formats
/// (an older version's: this one reads none of them), and every temporary of it (the lock is held,
/// so no writer is alive to own one). Best effort: a file that cannot be deleted is only space.
fn tidy(dir: &Path, stem: &str, epoch: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(stem)) else {
            continue;
        };
        let ours = rest.strip_prefix(&current());
        let earlier = ours
            .and_then(|r| r.strip_suffix(".plan"))
            .and_then(|e| e.parse::<u64>().ok())
            .is_some_and(|e| e.saturating_add(1) < epoch);
        let older_version = ours.is_none() && rest.ends_with(".plan");
        if earlier || older_version || rest.contains(".tmp-") {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The error of an operating-system failure on `path` while trying to `action`.
fn io<'a>(
    path: &'a Path,
    action: &'static str,
) -> impl Fn(std::io::Error) -> crate::error::Error + 'a {
    move |e| {
        ErrorKind::SharedPlan {
            path: path.display().to_string(),
            problem: SharedProblem::Io {
                action,
                kind: e.kind(),
                message: e.to_string(),
            },
        }
        .into()
    }
}

/// The error of a file at `path` that is not the plan asked for.
fn refused(path: &Path, why: String) -> crate::error::Error {
    ErrorKind::SharedPlan {
        path: path.display().to_string(),
        problem: SharedProblem::Refused { why },
    }
    .into()
}

#[cfg(test)]
mod tests;

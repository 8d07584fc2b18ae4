//! Opening the files of a plan directory without blocking: a FIFO, socket or device at a plan file's
//! or the lock's name is refused, never waited on (a FIFO's `open` blocks until its other end comes,
//! while this process would hold the directory's lock and every rank of the machine would wait).

use std::fs::File;
use std::path::Path;

/// `path` opened for reading without blocking, refused (`InvalidInput`) unless it is a regular file: a
/// FIFO at a plan file's name would block `open` until a writer came, while this process holds the
/// plan directory's lock, and every rank of the machine would wait with it.
pub(crate) fn open_regular(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(NONBLOCK)
        .open(path)?;
    if !file.metadata()?.file_type().is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "it is not a regular file (a FIFO, a socket, a device or a directory); remove it",
        ));
    }
    Ok(file)
}

/// `O_NONBLOCK` (no libc dependency for one flag): opening a FIFO with it returns at once; for a
/// regular file it changes nothing.
pub(crate) const NONBLOCK: i32 = if cfg!(any(
    target_os = "macos",
    target_os = "ios",
    target_os = "freebsd"
)) {
    0x0004
} else {
    0o4000
};

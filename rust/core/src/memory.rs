//! Memory reserved up front, so that running out is an [`ErrorKind::OutOfMemory`] (a `MemoryError` in
//! Python) instead of Rust's abort on a failed allocation, which no caller can catch.
//!
//! The discipline: every entry point whose memory grows with the data reserves its peak before it
//! starts — planning ([`crate::Planner::plan_bytes`], per sample and per batch), preparing a planner,
//! a plan's stats, reading a column, mapping rows, gathering rows, counting labels, indexing a mask,
//! resuming on other ranks — and every vector the binding copies out of numpy, or that grows past
//! what was reserved (a mask's runs, the seed workload, the lengths' copy), is allocated with
//! [`vec_with_capacity`] or `try_reserve`. `tests/memory_peaks.rs` counts what planning and stats
//! really allocate against their reservations, and the Python suite calls every entry point under an
//! address-space cap (`tests/base/test_memory.py`).
//!
//! A reservation is a probe: allocated and released at once (allocations this large are mapped
//! and unmapped whole), so it costs no page of memory, and under an address-space limit (`ulimit
//! -v`, containers) it tells whether the work will fit.

use crate::error::{ErrorKind, Result};

/// Working memory an epoch's plan takes per sample at its peak, formed bucket by bucket (epochs up
/// to `ARRANGE_MAX_SAMPLES`): the plan, the buckets' rows, the shuffled copies and the calibration
/// forms of the first plan (`tests/memory_peaks.rs` measures every path against it).
pub const ARRANGED_BYTES_PER_SAMPLE: u64 = 30;

/// The same for streamed epochs (larger ones): the plan and the permutation, lengths carried with it.
pub const STREAMED_BYTES_PER_SAMPLE: u64 = 12;

/// What a mixture's epoch adds per sample (`plan/mixture/`): its selection in an epoch buffer (a row
/// and a length each) and a bucket's copy while the bucket is filled, or the rows listed for the
/// streamed path.
pub const MIXTURE_BYTES_PER_SAMPLE: u64 = 16;

/// What a mixture's planner takes per row while it is built, beyond [`PREPARE_BYTES_PER_SAMPLE`]
/// (`plan/mixture/select.rs`): each admitted row with its length in its group and a token prefix
/// sum every 16 rows, kept; while it is built, a source's working copies and the reference
/// selection's rows and lengths (15 bytes a row in all at its peak, measured at 2M rows:
/// `tests/memory_peaks.rs`).
pub const MIXTURE_GROUP_BYTES: u64 = 17;

/// Working memory per batch: offsets, costs and the balancing order.
pub const PLAN_BYTES_PER_BATCH: u64 = 48;

/// The same for epochs too large to arrange (`ARRANGE_MAX_SAMPLES`), whose batches are neither
/// ordered nor balanced: a group's `u32` end (its vector grown by doubling), the epoch's `u32`
/// offset and an unused cost's room. ~13 bytes measured at their peak (`tests/memory_peaks.rs`);
/// at 1B samples 48 would reserve ~15 GB more than planning takes, and refuse a plan that fits.
pub const UNARRANGED_BYTES_PER_BATCH: u64 = 24;

/// Working memory of a plan whatever its size: bucket tables, histograms, thread-local buffers.
pub const PLAN_FIXED_BYTES: u64 = 8 << 20;

/// Working memory a planner takes per sample while it is built (bucket tables and, for epochs small
/// enough to arrange bucket by bucket, a `u32` per sample).
pub const PREPARE_BYTES_PER_SAMPLE: u64 = 4;

/// Fixed overhead on top of the per-sample buffers (histograms, bucket tables).
pub const SLACK_BYTES: u64 = 1 << 20;

/// What sizes an epoch's planning memory: see [`plan_bytes`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct EpochShape {
    /// Samples an epoch plans.
    pub(crate) samples: u64,
    /// Formed bucket by bucket (`form/by_bucket.rs`), else streamed.
    pub(crate) by_bucket: bool,
    pub(crate) mixture: bool,
    /// Batches ordered and balanced (epochs up to `ARRANGE_MAX_SAMPLES`).
    pub(crate) arranged: bool,
    /// The most batches one forming pass can close.
    pub(crate) batch_bound: u64,
    pub(crate) world_size: u32,
    /// Batches of every epoch, once the first plan or query set it.
    pub(crate) target: Option<usize>,
}

/// Bytes an epoch's planning allocates at its peak, at most (`tests/memory_peaks.rs` holds every
/// path to it): per sample, and per batch for epochs of few samples a batch.
pub(crate) fn plan_bytes(shape: EpochShape) -> u64 {
    let per_sample = if shape.by_bucket {
        ARRANGED_BYTES_PER_SAMPLE
    } else if shape.mixture {
        // The selection in its epoch buffer and a bucket's copy, or the listed rows (`mixture/`).
        ARRANGED_BYTES_PER_SAMPLE + MIXTURE_BYTES_PER_SAMPLE
    } else {
        STREAMED_BYTES_PER_SAMPLE
    };
    // Before the first plan the batch count is unknown: twice what one forming pass can close
    // (the target adds a margin and splits; a mixture's epochs repeat rows: one a sample).
    let first = if shape.mixture {
        shape.samples
    } else {
        2 * shape.batch_bound + u64::from(shape.world_size)
    };
    let batches = shape
        .target
        .map_or(first, |t| 2 * t as u64)
        .min(shape.samples);
    let per_batch = if !shape.mixture && !shape.arranged {
        UNARRANGED_BYTES_PER_BATCH
    } else {
        PLAN_BYTES_PER_BATCH
    };
    PLAN_FIXED_BYTES + shape.samples * per_sample + batches * per_batch
}

/// Checks that `bytes` can be allocated now, for `what`.
pub fn reserve(what: &'static str, bytes: u64) -> Result<()> {
    let bytes = bytes.saturating_add(SLACK_BYTES);
    let fits = usize::try_from(bytes)
        .ok()
        .is_some_and(|n| Vec::<u8>::new().try_reserve_exact(n).is_ok());
    if fits {
        Ok(())
    } else {
        Err(ErrorKind::OutOfMemory { what, bytes }.into())
    }
}

/// A vector of `count` elements' capacity, or [`ErrorKind::OutOfMemory`].
pub fn vec_with_capacity<T>(what: &'static str, count: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(count)
        .map_err(|_| ErrorKind::OutOfMemory {
            what,
            bytes: (count as u64).saturating_mul(std::mem::size_of::<T>() as u64),
        })?;
    Ok(v)
}

/// Bytes of physical memory (`MemTotal` of `/proc/meminfo`), where the system says; read once, since
/// a collation without buffers asks once per batch.
pub fn physical() -> Option<u64> {
    static MEMORY: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *MEMORY.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_impossible_reservation_is_an_error_not_an_abort() {
        let err = reserve("a test", u64::MAX / 2).unwrap_err();
        assert!(matches!(
            err.kind(),
            ErrorKind::OutOfMemory { what: "a test", .. }
        ));
        assert!(err.to_string().starts_with("a test needs "), "{err}");
        assert!(vec_with_capacity::<u64>("a vector", usize::MAX / 16).is_err());
        assert!(reserve("a small one", 1024).is_ok());
        assert_eq!(vec_with_capacity::<u32>("v", 10).unwrap().capacity(), 10);
    }
}
